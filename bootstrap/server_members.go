package bootstrap

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/gccl/gccl/bootstrap/bootstrappb"
)

// Join admits a rank after checking its version, the job size and its rank,
// and answers once every rank joined.
func (s *Server) Join(ctx context.Context, req *pb.JoinRequest) (*pb.JoinResponse, error) {
	rank := req.Rank
	if req.ProtocolVersion != ProtocolVersion || req.LibraryVersion != s.version {
		s.log.Warn(fmt.Sprintf("rejected rank %d: it runs gccl %s (protocol %d), the rendezvous runs %s (protocol %d)",
			rank, req.LibraryVersion, req.ProtocolVersion, s.version, ProtocolVersion))
		return nil, statusError(codes.FailedPrecondition, reasonVersion,
			"rank %d runs gccl %s (bootstrap protocol %d) but the rendezvous runs gccl %s (bootstrap protocol %d): run the same gccl build on every rank and for gccl-bootstrap",
			rank, req.LibraryVersion, req.ProtocolVersion, s.version, ProtocolVersion)
	}
	if int(req.Size) != s.size {
		return nil, statusError(codes.InvalidArgument, reasonJoinRejected,
			"rank %d says the job has %d ranks but the rendezvous serves %d: give every rank the same size (GCCL_SIZE, WORLD_SIZE or the launcher's)",
			rank, req.Size, s.size)
	}
	if rank < 0 || int(rank) >= s.size {
		return nil, statusError(codes.InvalidArgument, reasonJoinRejected, "rank %d is outside 0..%d", rank, s.size-1)
	}

	s.mu.Lock()
	if err := s.abortErrorLocked(worldGroup); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	m := &s.members[rank]
	switch m.state {
	case joined, left:
		s.mu.Unlock()
		return nil, statusError(codes.AlreadyExists, reasonJoinRejected,
			"duplicate rank %d: it already joined from %s (pid %d), and now %s (pid %d) claims it too; check that every process has its own rank (GCCL_RANK, RANK)",
			rank, m.host, m.pid, req.Hostname, req.Pid)
	case lost:
		s.mu.Unlock()
		return nil, statusError(codes.AlreadyExists, reasonJoinRejected,
			"rank %d was declared lost (%s) and cannot rejoin: restart the whole job, or let the survivors Shrink and Grow and start the replacement as a newcomer (comm.Join, gccl-run --join), which gets a new rank", rank, m.reason)
	}
	*m = member{state: joined, host: req.Hostname, pid: req.Pid}
	s.joined++
	s.log.Info(fmt.Sprintf("rank %d joined from %s pid %d (%d of %d)", rank, req.Hostname, req.Pid, s.joined, s.size))
	if s.joined == s.size {
		// Silence is measured from here: a rank that dies before opening its
		// heartbeat stream is still caught.
		now := time.Now()
		for i := range s.members {
			s.members[i].lastSeen = now
		}
		close(s.allJoined)
		s.log.Info(fmt.Sprintf("all %d ranks joined", s.size))
	}
	s.mu.Unlock()

	timer, stopTimer := newTimer(req.TimeoutMs)
	defer stopTimer()
	if err := s.await(ctx, s.allJoined, timer); err != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.joined < s.size && m.state == joined {
			// The caller gave up before the job was complete: free the rank so
			// that a retry is not taken for a duplicate.
			*m = member{state: gaveUp}
			s.joined--
		}
		if err == errWaitTimedOut {
			var missing, gaveUpRanks []int
			for r := range s.members {
				switch s.members[r].state {
				case absent:
					missing = append(missing, r)
				case gaveUp:
					if r != int(rank) {
						gaveUpRanks = append(gaveUpRanks, r)
					}
				}
			}
			also := ""
			if len(gaveUpRanks) > 0 {
				also = fmt.Sprintf(" (ranks %s joined but gave up waiting too)", rankList(gaveUpRanks))
			}
			return nil, statusError(codes.DeadlineExceeded, reasonTimeout,
				"rank %d waited %v for all %d ranks to join; ranks %s have not joined%s: are they running, with the same rendezvous address?",
				rank, time.Duration(req.TimeoutMs)*time.Millisecond, s.size, rankList(missing), also)
		}
		return nil, err
	}
	interval := max(s.heartbeatTimeout/3, time.Millisecond)
	return &pb.JoinResponse{
		HeartbeatIntervalMs: max(interval.Milliseconds(), 1),
		HeartbeatTimeoutMs:  s.heartbeatTimeout.Milliseconds(),
	}, nil
}

// Leave marks a rank as gone cleanly; its streams closing is then no loss.
func (s *Server) Leave(_ context.Context, req *pb.LeaveRequest) (*pb.LeaveResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.memberLocked(req.Rank); err != nil {
		return nil, err
	}
	s.log.Info(fmt.Sprintf("rank %d left", req.Rank))
	s.markGoneLocked(req.Rank, left, "left the job (closed its client)")
	return &pb.LeaveResponse{}, nil
}

// Heartbeat acknowledges each beat of a rank and declares the rank lost if
// the stream breaks before the rank left.
func (s *Server) Heartbeat(stream pb.Bootstrap_HeartbeatServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	rank := first.Rank
	s.mu.Lock()
	if err := s.memberLocked(rank); err != nil {
		s.mu.Unlock()
		return err
	}
	s.members[rank].lastSeen = time.Now()
	s.mu.Unlock()

	// Recv blocks, so it runs on its own goroutine, leaving this one free to
	// notice Stop. It ends when the stream does (the handler returning
	// cancels the stream).
	ctx := stream.Context()
	beats := make(chan error)
	go func() {
		for {
			_, err := stream.Recv()
			select {
			case beats <- err:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()

	for {
		if err := stream.Send(&pb.HeartbeatAck{}); err != nil {
			s.heartbeatBroke(rank, err)
			return err
		}
		select {
		case <-s.stopped:
			return s.stoppedError()
		case <-ctx.Done():
			s.heartbeatBroke(rank, status.FromContextError(ctx.Err()).Err())
			return nil
		case err := <-beats:
			if err != nil {
				s.heartbeatBroke(rank, err)
				return nil
			}
		}
		s.mu.Lock()
		m := &s.members[rank]
		if m.state == joined {
			m.lastSeen = time.Now()
		}
		state, reason := m.state, m.reason
		s.mu.Unlock()
		if state == lost {
			// It was silent too long; telling it lets it fail fast.
			return statusError(codes.Aborted, reasonDeclaredLost, "the rendezvous declared rank %d lost (%s)", rank, reason)
		}
	}
}

// heartbeatBroke declares rank lost unless it left cleanly or the server is
// stopping.
func (s *Server) heartbeatBroke(rank int32, err error) {
	select {
	case <-s.stopped:
		return
	default:
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.members[rank].state != joined {
		return
	}
	why := "its connection closed"
	if err != io.EOF {
		if st, ok := status.FromError(err); ok {
			why = fmt.Sprintf("its connection broke (%s)", st.Message())
		}
	}
	s.markGoneLocked(rank, lost, "heartbeat stream ended without Close: "+why+"; did the process exit or crash?")
}

// monitorHeartbeats declares lost the ranks that stay silent longer than the
// heartbeat timeout.
func (s *Server) monitorHeartbeats() {
	defer s.monitorDone.Done()
	tick := time.NewTicker(max(s.heartbeatTimeout/4, 5*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-s.stopped:
			return
		case now := <-tick.C:
			s.mu.Lock()
			if s.joined >= s.size { // more once Grow admitted newcomers
				for r := range s.members {
					m := &s.members[r]
					if silent := now.Sub(m.lastSeen); m.state == joined && silent > s.heartbeatTimeout {
						s.markGoneLocked(int32(r), lost, fmt.Sprintf(
							"no heartbeat for %v (heartbeat timeout %v): the process is stalled or stopped, or its host is unreachable",
							silent.Round(time.Millisecond), s.heartbeatTimeout))
					}
				}
			}
			s.mu.Unlock()
		}
	}
}

// markGoneLocked records that rank left or was lost, fails the pending rounds
// that needed it, tells every rank about a loss and ends the job when no rank
// is left.
func (s *Server) markGoneLocked(rank int32, state memberState, reason string) {
	m := &s.members[rank]
	m.state, m.reason = state, reason
	s.gone++
	for key, r := range s.rounds {
		if i, ok := r.index(rank); ok && !r.arrived[i] {
			s.failRoundLocked(key, r, statusError(codes.Aborted, reasonRankLost,
				"%s #%d (group %s) cannot complete: rank %d %s", r.op, r.seq, r.group, rank, reason))
		}
	}
	if state == lost {
		s.log.Warn(fmt.Sprintf("rank %d lost: %s", rank, reason))
		s.addNoticeLocked(&pb.Notice{Kind: pb.Notice_RANK_LOST, Rank: rank, Reason: reason})
	}
	s.growRankGoneLocked(rank, reason)
	// Newcomers admitted by Grow count in joined, so the job ends when
	// every rank that ever joined is gone.
	if s.joined >= s.size && s.gone == s.joined && !s.endedClosed {
		s.endedClosed = true
		close(s.ended)
		s.log.Info("job ended: every rank left or was lost")
	}
}

func (s *Server) addNoticeLocked(n *pb.Notice) {
	s.notices = append(s.notices, n)
	close(s.noticesChanged)
	s.noticesChanged = make(chan struct{})
}

// Watch streams every notice of the job to a rank, oldest first, so a rank
// that subscribes late misses nothing.
func (s *Server) Watch(req *pb.WatchRequest, stream pb.Bootstrap_WatchServer) error {
	s.mu.Lock()
	err := s.memberLocked(req.Rank)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	sent := 0
	for {
		s.mu.Lock()
		pending := s.notices[sent:]
		changed := s.noticesChanged
		s.mu.Unlock()
		for _, n := range pending {
			if err := stream.Send(n); err != nil {
				return err
			}
			sent++
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return status.FromContextError(stream.Context().Err()).Err()
		case <-s.stopped:
			return s.stoppedError()
		}
	}
}

// Abort tells every rank that req.Rank gave up on req.Group (the job when
// empty), and fails every pending and later blocking call of that group:
// its collective rounds and its keys. Other groups go on.
func (s *Server) Abort(_ context.Context, req *pb.AbortRequest) (*pb.AbortResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.memberLocked(req.Rank); err != nil {
		return nil, err
	}
	group := req.Group
	if group == "" {
		group = worldGroup
	}
	if strings.ContainsRune(group, kvGroupSep) {
		return nil, statusError(codes.InvalidArgument, reasonInvalid, "rank %d aborted group %q: a group name has no %q", req.Rank, group, kvGroupSep)
	}
	for _, n := range s.notices {
		if n.Kind == pb.Notice_RANK_ABORTED && n.Rank == req.Rank && n.Group == group {
			return &pb.AbortResponse{}, nil // already told everyone
		}
	}
	if group == worldGroup {
		s.log.Warn(fmt.Sprintf("rank %d aborted the job: %s", req.Rank, req.Reason))
	} else {
		s.log.Warn(fmt.Sprintf("rank %d aborted group %s: %s", req.Rank, group, req.Reason))
	}
	n := &pb.Notice{Kind: pb.Notice_RANK_ABORTED, Rank: req.Rank, Reason: req.Reason, Group: group}
	s.addNoticeLocked(n)
	if s.abortedGroups[group] == nil {
		s.abortedGroups[group] = n
		err := s.abortErrorLocked(group)
		for key, r := range s.rounds {
			if r.group == group {
				s.failRoundLocked(key, r, err)
			}
		}
		s.kvChangedLocked() // wakes the group's waiting Gets, which fail
	}
	return &pb.AbortResponse{}, nil
}

// Gone lists the job ranks that left or were declared lost.
func (s *Server) Gone(_ context.Context, req *pb.GoneRequest) (*pb.GoneResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.memberLocked(req.Rank); err != nil {
		return nil, err
	}
	resp := &pb.GoneResponse{}
	for r, m := range s.members {
		if m.state == left || m.state == lost {
			resp.Ranks = append(resp.Ranks, int32(r))
		}
	}
	return resp, nil
}
