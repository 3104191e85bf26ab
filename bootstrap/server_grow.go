package bootstrap

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/gccl/gccl/bootstrap/bootstrappb"
)

// growState is the rendezvous's record of Grow calls: the open ones, which
// newcomers fill, and the failed ones, whose members arriving late get the
// failure at once.
type growState struct {
	open    []*pendingGrow // oldest first: newcomers take slots in this order
	failed  map[string]error
	changed chan struct{} // closed and replaced when a grow opens
}

// pendingGrow is one Grow of a group, from its first member's call until
// every member called and every newcomer came, or it failed.
type pendingGrow struct {
	key       string
	group     string
	members   []int32 // the old members' job ranks, in group order
	newSize   int
	name      string
	firstRank int32 // who opened it, for mismatch messages
	arrived   []bool
	count     int
	slots     []int32 // newcomers' job ranks by new group rank - len(members); -1: free
	filled    int
	done      chan struct{} // closed when complete or failed
	err       error
	finished  bool
	grown     string // the grown group's name
}

func (g *pendingGrow) grownMembers() []int32 { return append(slices.Clone(g.members), g.slots...) }

// growsLocked returns the server's grow record, made on first use.
func (s *Server) growsLocked() *growState {
	if s.grows.failed == nil {
		s.grows.failed = map[string]error{}
		s.grows.changed = make(chan struct{})
	}
	return &s.grows
}

// Grow admits newcomers to a group: every member calls it with the same
// size and name, newcomers come through GrowJoin, and everyone is answered
// with the grown group once all of them are there.
func (s *Server) Grow(ctx context.Context, req *pb.GrowRequest) (*pb.GrowResponse, error) {
	rank := req.Rank
	what := fmt.Sprintf("Grow #%d of group %s to %d ranks", req.Seq, req.Group, req.NewSize)
	s.mu.Lock()
	g, err := s.arriveGrowLocked(rank, req, what)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	timer, stopTimer := newTimer(req.TimeoutMs)
	defer stopTimer()
	if err := s.await(ctx, g.done, timer); err != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		if g.finished {
			return s.growAnswer(g)
		}
		if err == errWaitTimedOut {
			err = statusError(codes.DeadlineExceeded, reasonTimeout, "%s timed out after %v: %s",
				what, time.Duration(req.TimeoutMs)*time.Millisecond, s.growMissingLocked(g))
		}
		// One member giving up dooms the grow: the others must not get a
		// group without it.
		s.failGrowLocked(g, err)
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.growAnswer(g)
}

func (s *Server) growAnswer(g *pendingGrow) (*pb.GrowResponse, error) {
	if g.err != nil {
		return nil, g.err
	}
	return &pb.GrowResponse{Group: g.grown, Members: g.grownMembers()}, nil
}

// arriveGrowLocked checks a member's Grow call, opens the grow or joins the
// open one, and completes it if this was the last arrival.
func (s *Server) arriveGrowLocked(rank int32, req *pb.GrowRequest, what string) (*pendingGrow, error) {
	if err := s.memberLocked(rank); err != nil {
		return nil, err
	}
	if req.Group == "" || req.Seq == 0 {
		return nil, statusError(codes.InvalidArgument, reasonInvalid, "rank %d: a Grow names its group and its number", rank)
	}
	if err := s.abortErrorLocked(req.Group); err != nil {
		return nil, err
	}
	members := req.Members
	if len(members) == 0 {
		members = make([]int32, s.size)
		for i := range members {
			members[i] = int32(i)
		}
	}
	seen := make(map[int32]bool, len(members))
	for _, m := range members {
		if m < 0 || int(m) >= len(s.members) || seen[m] {
			return nil, statusError(codes.InvalidArgument, reasonInvalid, "%s: member rank %d is outside 0..%d or listed twice", what, m, len(s.members)-1)
		}
		seen[m] = true
	}
	if !seen[rank] {
		return nil, statusError(codes.InvalidArgument, reasonInvalid, "%s: rank %d is not a member of the group", what, rank)
	}
	if int(req.NewSize) <= len(members) {
		return nil, statusError(codes.InvalidArgument, reasonInvalid, "%s: the group has %d ranks already; a Grow adds at least one", what, len(members))
	}
	if req.NewSize > maxGrowSize {
		return nil, statusError(codes.InvalidArgument, reasonInvalid, "%s: more than the %d ranks a group may have", what, maxGrowSize)
	}
	if err := checkGrowName(req.Name); err != nil {
		return nil, statusError(codes.InvalidArgument, reasonInvalid, "%s: %v", what, err)
	}
	gs := s.growsLocked()
	key := req.Group + "#g" + strconv.FormatUint(req.Seq, 10)
	if err, failed := gs.failed[key]; failed {
		return nil, err
	}
	var g *pendingGrow
	for _, o := range gs.open {
		if o.key == key {
			g = o
		}
	}
	if g == nil {
		g = &pendingGrow{
			key: key, group: req.Group, members: slices.Clone(members), newSize: int(req.NewSize), name: req.Name,
			firstRank: rank, arrived: make([]bool, len(members)), slots: make([]int32, int(req.NewSize)-len(members)),
			done: make(chan struct{}), grown: req.Group + "/g" + strconv.FormatUint(req.Seq, 10),
		}
		for i := range g.slots {
			g.slots[i] = -1
		}
		gs.open = append(gs.open, g)
		close(gs.changed) // newcomers waiting for a grow look again
		gs.changed = make(chan struct{})
		s.log.Info(fmt.Sprintf("rank %d opened %s: waiting for %d newcomers", rank, what, len(g.slots)))
	} else if g.newSize != int(req.NewSize) || g.name != req.Name || !slices.Equal(g.members, members) {
		err := statusError(codes.InvalidArgument, reasonRoundMismatch,
			"Grow #%d of group %s: rank %d grows to %d ranks (name %q%s) but rank %d grows to %d (name %q%s); every member must pass the same size",
			req.Seq, req.Group, rank, req.NewSize, req.Name, memberNote(members), g.firstRank, g.newSize, g.name, memberNote(g.members))
		s.failGrowLocked(g, err)
		return nil, err
	}
	i := slices.Index(g.members, rank)
	if g.arrived[i] {
		return nil, statusError(codes.InvalidArgument, reasonRoundMismatch, "%s: rank %d called it twice", what, rank)
	}
	g.arrived[i] = true
	g.count++
	for j, m := range g.members {
		if st := s.members[m].state; !g.arrived[j] && (st == left || st == lost) {
			err := statusError(codes.Aborted, reasonRankLost, "%s cannot complete: member rank %d %s", what, m, s.members[m].reason)
			s.failGrowLocked(g, err)
			return nil, err
		}
	}
	s.completeGrowLocked(g)
	return g, nil
}

// completeGrowLocked ends g if every member and every newcomer is there:
// the newcomers become members of the job.
func (s *Server) completeGrowLocked(g *pendingGrow) {
	if g.finished || g.count < len(g.members) || g.filled < len(g.slots) {
		return
	}
	now := time.Now()
	for _, r := range g.slots {
		m := &s.members[r]
		m.state, m.lastSeen = joined, now
		s.joined++
	}
	g.finished = true
	close(g.done)
	s.removeGrowLocked(g)
	s.log.Info(fmt.Sprintf("group %s grew to %d ranks as group %s (newcomers: job ranks %s)", g.group, g.newSize, g.grown, rankList(toInts(g.slots))))
}

// failGrowLocked ends g with err for everyone waiting on it, frees the
// newcomers' places, and remembers the failure for members that come later.
func (s *Server) failGrowLocked(g *pendingGrow, err error) {
	if g.finished {
		return
	}
	g.finished, g.err = true, err
	close(g.done)
	for _, r := range g.slots {
		if r >= 0 && s.members[r].state == absent {
			s.members[r].state = gaveUp
		}
	}
	s.removeGrowLocked(g)
	s.growsLocked().failed[g.key] = err
}

func (s *Server) removeGrowLocked(g *pendingGrow) {
	gs := s.growsLocked()
	if i := slices.Index(gs.open, g); i >= 0 {
		gs.open = slices.Delete(gs.open, i, i+1)
	}
}

// growRankGoneLocked fails the open grows whose group holds rank, which
// left or was lost: the grown group could not work without it.
func (s *Server) growRankGoneLocked(rank int32, reason string) {
	for _, g := range slices.Clone(s.grows.open) {
		if slices.Contains(g.members, rank) {
			s.failGrowLocked(g, statusError(codes.Aborted, reasonRankLost,
				"Grow of group %s to %d ranks cannot complete: member rank %d %s", g.group, g.newSize, rank, reason))
		}
	}
}

// growMissingLocked says who a grow still waits for.
func (s *Server) growMissingLocked(g *pendingGrow) string {
	var missing []int
	for i, ok := range g.arrived {
		if !ok {
			missing = append(missing, int(g.members[i]))
		}
	}
	var parts []string
	if len(missing) > 0 {
		parts = append(parts, fmt.Sprintf("members (job ranks) %s have not called Grow", rankList(missing)))
	}
	if n := len(g.slots) - g.filled; n > 0 {
		parts = append(parts, fmt.Sprintf("%d of the %d newcomers have not come: start them with the job's rendezvous address and secret (comm.Join, gccl-run --join)", n, len(g.slots)))
	}
	if len(parts) == 0 {
		return "everyone came"
	}
	if len(parts) == 2 {
		return parts[0] + ", and " + parts[1]
	}
	return parts[0]
}

// GrowJoin admits a newcomer to the oldest open grow it fits, waiting for
// one to open, and answers once the grown group is complete.
func (s *Server) GrowJoin(ctx context.Context, req *pb.GrowJoinRequest) (*pb.GrowJoinResponse, error) {
	who := fmt.Sprintf("newcomer %s pid %d", req.Hostname, req.Pid)
	if req.ProtocolVersion != ProtocolVersion || req.LibraryVersion != s.version {
		s.log.Warn(fmt.Sprintf("rejected %s: it runs gccl %s (protocol %d), the rendezvous runs %s (protocol %d)",
			who, req.LibraryVersion, req.ProtocolVersion, s.version, ProtocolVersion))
		return nil, statusError(codes.FailedPrecondition, reasonVersion,
			"%s runs gccl %s (bootstrap protocol %d) but the rendezvous runs gccl %s (bootstrap protocol %d): run the same gccl build on every rank",
			who, req.LibraryVersion, req.ProtocolVersion, s.version, ProtocolVersion)
	}
	if req.Size < 0 || req.Rank < -1 || (req.Size > 0 && req.Rank >= req.Size) {
		return nil, statusError(codes.InvalidArgument, reasonJoinRejected, "%s asks for rank %d of %d: want a rank >= 0 below the size, or -1 (any) and a size >= 0 (0: any)", who, req.Rank, req.Size)
	}
	timer, stopTimer := newTimer(req.TimeoutMs)
	defer stopTimer()
	s.mu.Lock()
	var g *pendingGrow
	slot := -1
	for {
		var err error
		if g, slot, err = s.matchGrowLocked(req, who); err != nil {
			s.mu.Unlock()
			return nil, err
		}
		if g != nil {
			break
		}
		changed := s.growsLocked().changed
		s.mu.Unlock()
		select {
		case <-changed:
		case <-timer:
			return nil, statusError(codes.DeadlineExceeded, reasonTimeout,
				"%s waited %v for a group to call Grow%s; none did: the members call Comm.Grow, all with the same size, after the newcomers start or before",
				who, time.Duration(req.TimeoutMs)*time.Millisecond, sizeNote(req.Size))
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		case <-s.stopped:
			return nil, s.stoppedError()
		}
		s.mu.Lock()
	}
	jobRank := int32(len(s.members))
	s.members = append(s.members, member{state: absent, host: req.Hostname, pid: req.Pid})
	g.slots[slot] = jobRank
	g.filled++
	newRank := len(g.members) + slot
	s.log.Info(fmt.Sprintf("%s is job rank %d, rank %d of group %s growing to %d ranks", who, jobRank, newRank, g.grown, g.newSize))
	s.completeGrowLocked(g)
	s.mu.Unlock()

	if err := s.await(ctx, g.done, timer); err != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		if !g.finished {
			// Free the place for another newcomer; the grow goes on.
			g.slots[slot] = -1
			g.filled--
			s.members[jobRank].state = gaveUp
			if err == errWaitTimedOut {
				err = statusError(codes.DeadlineExceeded, reasonTimeout, "%s (rank %d of group %s growing to %d ranks) waited %v; %s",
					who, newRank, g.grown, g.newSize, time.Duration(req.TimeoutMs)*time.Millisecond, s.growMissingLocked(g))
			}
			return nil, err
		}
	}
	if g.err != nil {
		return nil, g.err
	}
	interval := max(s.heartbeatTimeout/3, time.Millisecond)
	return &pb.GrowJoinResponse{
		JobRank: jobRank, Group: g.grown, Members: g.grownMembers(), Name: g.name,
		HeartbeatIntervalMs: max(interval.Milliseconds(), 1),
		HeartbeatTimeoutMs:  s.heartbeatTimeout.Milliseconds(),
	}, nil
}

// matchGrowLocked finds the oldest open grow with a place for the newcomer
// and the place; nil when no grow is open. A newcomer that fits none of
// the open grows is refused at once: its size or rank is wrong.
func (s *Server) matchGrowLocked(req *pb.GrowJoinRequest, who string) (*pendingGrow, int, error) {
	var refusals []string
	for _, g := range s.growsLocked().open {
		if g.filled == len(g.slots) {
			continue
		}
		switch {
		case req.Size > 0 && int(req.Size) != g.newSize:
			refusals = append(refusals, fmt.Sprintf("group %s grows to %d ranks, not %d", g.group, g.newSize, req.Size))
		case req.Rank >= 0 && (int(req.Rank) < len(g.members) || int(req.Rank) >= g.newSize):
			refusals = append(refusals, fmt.Sprintf("group %s of %d ranks grows to %d: its new ranks are %d..%d, not %d",
				g.group, len(g.members), g.newSize, len(g.members), g.newSize-1, req.Rank))
		case req.Rank >= 0 && g.slots[int(req.Rank)-len(g.members)] >= 0:
			r := g.slots[int(req.Rank)-len(g.members)]
			refusals = append(refusals, fmt.Sprintf("rank %d of group %s's grow is taken by %s pid %d", req.Rank, g.group, s.members[r].host, s.members[r].pid))
		case req.Rank >= 0:
			return g, int(req.Rank) - len(g.members), nil
		default:
			return g, slices.Index(g.slots, -1), nil
		}
	}
	if len(refusals) > 0 {
		return nil, -1, statusError(codes.InvalidArgument, reasonRoundMismatch, "%s asks for rank %d%s: %s",
			who, req.Rank, sizeNote(req.Size), joinNotes(refusals))
	}
	return nil, -1, nil
}

func sizeNote(size int32) string {
	if size <= 0 {
		return ""
	}
	return fmt.Sprintf(" to %d ranks", size)
}

func joinNotes(notes []string) string {
	out := notes[0]
	for _, n := range notes[1:] {
		out += "; " + n
	}
	return out
}

func toInts(rs []int32) []int {
	out := make([]int, len(rs))
	for i, r := range rs {
		out[i] = int(r)
	}
	return out
}

// maxGrowSize bounds a grown group, as gccl-run bounds a job (launch's
// MaxWorldSize): a member cannot make the rendezvous allocate more.
const maxGrowSize = 1 << 20

// maxGrowName bounds the name a Grow gives its group's shared resources.
const maxGrowName = 200

// checkGrowName checks the name of a grown group's shared resources, which
// becomes part of file names (/dev/shm/gccl-<name>-*) on every member.
func checkGrowName(name string) error {
	if name == "" || len(name) > maxGrowName {
		return fmt.Errorf("%w: the grown group's name %q must have 1 to %d characters", ErrInvalidArgument, name, maxGrowName)
	}
	for _, ch := range name {
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '-' || ch == '_' || ch == '.') {
			return fmt.Errorf("%w: the grown group's name %q may hold only letters, digits, '-', '_' and '.'", ErrInvalidArgument, name)
		}
	}
	return nil
}
