package bootstrap

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"google.golang.org/grpc"

	pb "github.com/gccl/gccl/bootstrap/bootstrappb"
)

// Grow makes a Client for c's group grown to newSize ranks, as
// ncclCommGrow does: the way back to full size after a Shrink. Every rank
// of c's group calls it with the same newSize and name, in the same order
// relative to its other Grow calls on c; the ranks keep their ranks, and
// the newSize-Size() newcomers, processes started later that call
// JoinGrow, get the ranks after them. It returns once every member called
// and every newcomer came, or fails after Config.Timeout naming who did
// not; members that pass different sizes all get ErrMismatch. name names
// the grown group's shared resources: newcomers learn it from JoinGrow.
func (c *Client) Grow(ctx context.Context, newSize int, name string) (*Client, error) {
	// Numbered before any check, so that a rank whose call is refused
	// stays in step with the others for the next attempt.
	n := c.grows.Add(1)
	what := fmt.Sprintf("grow #%d to %d ranks", n, newSize)
	if err := c.usable(what); err != nil {
		return nil, err
	}
	if newSize <= c.size {
		return nil, fmt.Errorf("gccl bootstrap: %s: %w: the group has %d ranks already; a Grow adds at least one", c.describe(what), ErrInvalidArgument, c.size)
	}
	if newSize > maxGrowSize {
		return nil, fmt.Errorf("gccl bootstrap: %s: %w: more than the %d ranks a group may have", c.describe(what), ErrInvalidArgument, maxGrowSize)
	}
	if err := checkGrowName(name); err != nil {
		return nil, fmt.Errorf("gccl bootstrap: %s: %w", c.describe(what), err)
	}
	rctx, done, timeoutMs := c.sess.blockingContext(ctx)
	defer done()
	resp, err := c.sess.rpc.Grow(rctx, &pb.GrowRequest{
		Rank: c.sess.rank, Group: c.group, Members: c.members, Seq: n,
		NewSize: int32(newSize), Name: name, TimeoutMs: timeoutMs,
	})
	if err != nil {
		return nil, c.sess.callError(ctx, c.describe(what), err)
	}
	old := make([]int32, c.size)
	for i := range old {
		old[i] = int32(c.jobRank(i))
	}
	if resp.Group == "" || len(resp.Members) != newSize || !slices.Equal(resp.Members[:c.size], old) {
		return nil, fmt.Errorf("gccl bootstrap: %s: the rendezvous answered group %q of members %v, which does not extend %v", c.describe(what), resp.Group, resp.Members, old)
	}
	sub := &Client{
		sess:    c.sess,
		rank:    c.rank,
		size:    newSize,
		group:   resp.Group,
		members: resp.Members,
		lost:    make(chan Notice, cap(c.lost)+2*(newSize-c.size)),
	}
	if err := c.sess.open(sub); err != nil {
		return nil, fmt.Errorf("gccl bootstrap: %s: %w", c.describe(what), err)
	}
	return sub, nil
}

// AnyRank as Config.Rank of JoinGrow takes any free rank of the grown
// group.
const AnyRank = -1

// JoinGrow joins a running job as a newcomer admitted by Grow: a process
// started after the job (a replacement for a lost rank, or a new host)
// that dials the job's rendezvous (cfg.Addr) with the job's secret. It
// waits for a group to call Grow (at most cfg.Timeout), takes a place in
// it and returns the Client of the grown group once every member and
// newcomer is there, and the name of the group's shared resources.
//
// cfg.Size is the size of the grown group (0: that of the open Grow) and
// cfg.Rank the rank asked for in it, after the members' (AnyRank: the first
// free one); newcomers name their ranks all or none. The newcomer gets a new
// job rank: a lost rank's never returns. cfg.Serve must be false.
func JoinGrow(ctx context.Context, cfg Config) (*Client, string, error) {
	cfg, err := cfg.withGrowDefaults()
	if err != nil {
		return nil, "", err
	}
	s := &session{cfg: cfg, rank: -1, log: cfg.Logger, watchers: map[*Client]bool{}, goneJob: map[int32]bool{}}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	what := fmt.Sprintf("newcomer (rank %d of %d): join %s", cfg.Rank, cfg.Size, cfg.Addr)
	joinCtx, endJoin, wrongKey, err := s.connect(ctx, &cfg, cfg.Addr)
	if err != nil {
		s.shutdown(ErrClosed, false)
		return nil, "", fmt.Errorf("gccl bootstrap: %s: %w", what, err)
	}
	defer endJoin()

	host, _ := os.Hostname()
	rctx, done, timeoutMs := s.blockingContext(joinCtx)
	defer done()
	resp, err := s.rpc.GrowJoin(rctx, &pb.GrowJoinRequest{
		Rank: int32(cfg.Rank), Size: int32(cfg.Size), LibraryVersion: cfg.Version, ProtocolVersion: int32(cfg.Protocol),
		Hostname: host, Pid: int32(os.Getpid()), TimeoutMs: timeoutMs,
	}, grpc.WaitForReady(true))
	if pe := wrongKey(); err != nil && pe != nil {
		s.shutdown(ErrClosed, false)
		return nil, "", fmt.Errorf("gccl bootstrap: %s: %w: %w; is GCCL_SECRET the job's?", what, ErrUnauthenticated, pe)
	}
	if err != nil {
		err = s.callError(ctx, what, err)
		s.shutdown(ErrClosed, false)
		return nil, "", err
	}
	rank := slices.Index(resp.Members, resp.JobRank)
	nameErr := checkGrowName(resp.Name)
	if resp.Group == "" || rank < 0 || nameErr != nil || (cfg.Rank != AnyRank && rank != cfg.Rank) || (cfg.Size > 0 && len(resp.Members) != cfg.Size) {
		s.shutdown(ErrClosed, false)
		return nil, "", fmt.Errorf("gccl bootstrap: %s: the rendezvous answered job rank %d in group %q of members %v (name %q), which is not what was asked", what, resp.JobRank, resp.Group, resp.Members, resp.Name)
	}
	s.rank = resp.JobRank
	s.heartbeatTimeout = time.Duration(resp.HeartbeatTimeoutMs) * time.Millisecond
	if s.heartbeatTimeout <= 0 {
		s.heartbeatTimeout = DefaultHeartbeatTimeout
	}
	s.heartbeatInterval = time.Duration(resp.HeartbeatIntervalMs) * time.Millisecond
	if s.heartbeatInterval <= 0 || s.heartbeatInterval >= s.heartbeatTimeout {
		s.heartbeatInterval = max(s.heartbeatTimeout/3, time.Millisecond)
	}
	c := &Client{sess: s, rank: rank, size: len(resp.Members), group: resp.Group, members: resp.Members,
		lost: make(chan Notice, 2*len(resp.Members)+2)}
	s.root = c
	s.watchers[c] = true
	s.wg.Add(2)
	go s.heartbeat()
	go s.watch()
	s.log.Info(fmt.Sprintf("newcomer joined the rendezvous at %s as job rank %d, rank %d of %d of group %s (job %s)",
		cfg.Addr, resp.JobRank, rank, c.size, c.group, cfg.JobID))
	return c, resp.Name, nil
}

// withGrowDefaults validates a newcomer's cfg (JoinGrow) and fills its
// zero fields as withDefaults does.
func (cfg Config) withGrowDefaults() (Config, error) {
	rank, size := cfg.Rank, cfg.Size
	if size < 0 || size == 1 || rank < AnyRank || (size > 0 && rank >= size) || rank == 0 {
		return cfg, fmt.Errorf("gccl bootstrap: newcomer: %w: rank %d of %d: a newcomer asks for a rank after the members' (>= 1, below Size) or AnyRank, and a Size of 2 or more, or 0 for any", ErrInvalidArgument, rank, size)
	}
	if cfg.Serve {
		return cfg, fmt.Errorf("gccl bootstrap: newcomer: %w: a newcomer cannot serve the rendezvous: the job's runs already", ErrInvalidArgument)
	}
	cfg.Rank, cfg.Size = 0, 1 // withDefaults checks a job's ranks
	cfg, err := cfg.withDefaults()
	cfg.Rank, cfg.Size = rank, size
	return cfg, err
}
