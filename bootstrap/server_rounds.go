package bootstrap

import (
	"context"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/gccl/gccl/bootstrap/bootstrappb"
)

// round is one collective call (AllGather, Barrier, Split) of a group: it
// completes when every member contributed.
type round struct {
	group     string
	seq       uint64
	op        string
	firstRank int32         // who opened the round, for mismatch messages
	members   []int32       // job ranks in group order; nil means the whole job
	position  map[int32]int // job rank -> group rank, for groups made by Split
	size      int
	data      [][]byte
	arrived   []bool
	count     int
	done      chan struct{} // closed when complete or failed
	err       error         // why it failed
	finished  bool
}

// index returns the group rank of job rank, and whether it is a member.
func (r *round) index(rank int32) (int, bool) {
	if r.members == nil {
		return int(rank), rank >= 0 && int(rank) < r.size
	}
	i, ok := r.position[rank]
	return i, ok
}

// missing returns the job ranks that have not contributed.
func (r *round) missing() []int {
	var out []int
	for i, ok := range r.arrived {
		if !ok {
			if r.members == nil {
				out = append(out, i)
			} else {
				out = append(out, int(r.members[i]))
			}
		}
	}
	return out
}

func roundKey(rd *pb.Round) string { return rd.Group + "#" + strconv.FormatUint(rd.Seq, 10) }

// newRoundLocked opens a round for rd after checking its member list.
func (s *Server) newRoundLocked(rank int32, rd *pb.Round) (*round, error) {
	r := &round{group: rd.Group, seq: rd.Seq, op: rd.Op, firstRank: rank, size: s.size, done: make(chan struct{})}
	if len(rd.Members) > 0 {
		r.members = slices.Clone(rd.Members)
		r.size = len(rd.Members)
		r.position = make(map[int32]int, len(rd.Members))
		for i, m := range rd.Members {
			if m < 0 || int(m) >= len(s.members) { // members grow with Grow
				return nil, statusError(codes.InvalidArgument, reasonInvalid, "%s #%d (group %s): member rank %d is outside 0..%d", rd.Op, rd.Seq, rd.Group, m, len(s.members)-1)
			}
			if _, dup := r.position[m]; dup {
				return nil, statusError(codes.InvalidArgument, reasonInvalid, "%s #%d (group %s): rank %d is listed twice", rd.Op, rd.Seq, rd.Group, m)
			}
			r.position[m] = i
		}
	}
	r.data = make([][]byte, r.size)
	r.arrived = make([]bool, r.size)
	return r, nil
}

// failRoundLocked ends a pending round with err for every waiting member and
// remembers the failure for members that arrive later.
func (s *Server) failRoundLocked(key string, r *round, err error) {
	if r.finished {
		return
	}
	r.finished, r.err = true, err
	close(r.done)
	delete(s.rounds, key)
	s.failedRounds[key] = err
}

// contribute adds rank's data to the round and waits until the round
// completes, fails or times out.
func (s *Server) contribute(ctx context.Context, rank int32, rd *pb.Round, data []byte) ([][]byte, error) {
	if rd == nil {
		return nil, statusError(codes.InvalidArgument, reasonInvalid, "rank %d sent a collective without a round", rank)
	}
	key := roundKey(rd)
	s.mu.Lock()
	if err := s.memberLocked(rank); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if err := s.abortErrorLocked(rd.Group); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if err, failed := s.failedRounds[key]; failed {
		s.mu.Unlock()
		return nil, err
	}
	r := s.rounds[key]
	if r == nil {
		var err error
		if r, err = s.newRoundLocked(rank, rd); err != nil {
			s.mu.Unlock()
			return nil, err
		}
		s.rounds[key] = r
	} else if r.op != rd.Op || !slices.Equal(r.members, rd.Members) {
		err := statusError(codes.InvalidArgument, reasonRoundMismatch,
			"bootstrap call #%d of group %s: rank %d called %s%s but rank %d called %s%s; every rank must make the same bootstrap calls (AllGather, Barrier, Split, Shrink with the same exclusions) in the same order",
			rd.Seq, rd.Group, rank, rd.Op, memberNote(rd.Members), r.firstRank, r.op, memberNote(r.members))
		s.failRoundLocked(key, r, err)
		s.mu.Unlock()
		return nil, err
	}
	i, ok := r.index(rank)
	if !ok {
		s.mu.Unlock()
		return nil, statusError(codes.InvalidArgument, reasonInvalid, "%s #%d (group %s): rank %d is not a member of the group", rd.Op, rd.Seq, rd.Group, rank)
	}
	if r.arrived[i] {
		s.mu.Unlock()
		return nil, statusError(codes.InvalidArgument, reasonRoundMismatch, "%s #%d (group %s): rank %d arrived twice", rd.Op, rd.Seq, rd.Group, rank)
	}
	r.arrived[i], r.data[i] = true, data
	r.count++
	if r.count == r.size {
		r.finished = true
		close(r.done)
		delete(s.rounds, key)
	} else if s.gone > 0 {
		// A member that left or was lost before arriving can never arrive.
		for _, m := range r.missing() {
			if st := s.members[m].state; st == left || st == lost {
				s.failRoundLocked(key, r, statusError(codes.Aborted, reasonRankLost,
					"%s #%d (group %s) cannot complete: rank %d %s", r.op, r.seq, r.group, m, s.members[m].reason))
				break
			}
		}
	}
	s.mu.Unlock()

	timer, stopTimer := newTimer(rd.TimeoutMs)
	defer stopTimer()
	if err := s.await(ctx, r.done, timer); err != nil {
		if err == errWaitTimedOut {
			s.mu.Lock()
			missing := r.missing()
			s.mu.Unlock()
			return nil, statusError(codes.DeadlineExceeded, reasonTimeout,
				"%s #%d (group %s): rank %d waited %v; ranks %s have not arrived (are they stuck, or calling something else?)",
				rd.Op, rd.Seq, rd.Group, rank, time.Duration(rd.TimeoutMs)*time.Millisecond, rankList(missing))
		}
		return nil, err
	}
	if r.err != nil {
		return nil, r.err
	}
	return r.data, nil
}

func memberNote(members []int32) string {
	if len(members) == 0 {
		return ""
	}
	ranks := make([]int, len(members))
	for i, m := range members {
		ranks[i] = int(m)
	}
	return " over ranks " + rankList(ranks)
}

// AllGather answers every member's data once all members contributed.
func (s *Server) AllGather(ctx context.Context, req *pb.AllGatherRequest) (*pb.AllGatherResponse, error) {
	data, err := s.contribute(ctx, req.Rank, req.Round, req.Data)
	if err != nil {
		return nil, err
	}
	// Every member's answer shares the contributions; marshaling only reads them.
	return &pb.AllGatherResponse{Data: data}, nil
}

// Barrier answers once all members arrived.
func (s *Server) Barrier(ctx context.Context, req *pb.BarrierRequest) (*pb.BarrierResponse, error) {
	if _, err := s.contribute(ctx, req.Rank, req.Round, nil); err != nil {
		return nil, err
	}
	return &pb.BarrierResponse{}, nil
}
