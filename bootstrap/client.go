package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	pb "github.com/gccl/gccl/bootstrap/bootstrappb"
)

// rpcSlack is how much longer a client waits for a blocking call than the
// server does, so that the server's explanation of a timeout (which ranks or
// keys were missing) arrives before the client gives up on its own.
const rpcSlack = 2 * time.Second

// goneQueryTimeout bounds LostRanks' question to the rendezvous.
const goneQueryTimeout = 2 * time.Second

// leaveTimeout bounds the Leave call of Close.
const leaveTimeout = 5 * time.Second

// worldGroup names the group of every rank of the job.
const worldGroup = "w"

// Client is one rank's membership of the job's rendezvous. Its methods may be
// called from several goroutines, but the collective calls (AllGather,
// Barrier, Split) must be made in the same order on every rank of the
// group, as in NCCL.
type Client struct {
	sess    *session
	rank    int     // in this client's group
	size    int     // of this client's group
	group   string  // "w" for the job, longer for groups made by Split
	members []int32 // job ranks of the group in group order; nil for the job
	seq     atomic.Uint64
	shrinks atomic.Uint64 // Shrink calls, which name the groups they make
	grows   atomic.Uint64 // Grow calls, likewise (client_grow.go)
	lost    chan Notice
	closed  atomic.Bool
}

// session is what a Client and the sub-clients split from it share: the one
// gRPC connection, the heartbeat and notice streams, and the in-process
// server of a serving rank.
type session struct {
	cfg    Config
	rank   int32 // job rank
	log    *slog.Logger
	conn   *grpc.ClientConn
	rpc    pb.BootstrapClient
	server *Server
	served chan struct{} // closed when server.Serve returned

	// ctx ends when the client closes or the session fails; its cause is
	// the error every later call returns.
	ctx    context.Context
	cancel context.CancelCauseFunc

	heartbeatInterval time.Duration
	heartbeatTimeout  time.Duration
	heartbeatPaused   atomic.Bool // test hook: stop beating without closing the stream
	leaving           atomic.Bool // Close has begun: streams ending is expected
	wg                sync.WaitGroup

	mu       sync.Mutex
	root     *Client
	watchers map[*Client]bool // open clients: their Lost channels get notices
	goneJob  map[int32]bool   // job ranks the rendezvous declared lost, or that left
	failed   bool
}

// Join joins the job described by cfg: it starts the rendezvous first if
// cfg.Serve, connects, proves the job secret, checks versions, and returns
// once every rank of the job joined (or fails after cfg.Timeout, naming the
// ranks that did not come).
func Join(ctx context.Context, cfg Config) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &session{cfg: cfg, rank: int32(cfg.Rank), log: cfg.Logger, watchers: map[*Client]bool{}, goneJob: map[int32]bool{}}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	dialAddr := cfg.Addr
	if cfg.Serve {
		opts := []ServerOption{WithHeartbeatTimeout(cfg.HeartbeatTimeout), WithLogger(cfg.Logger)}
		if cfg.TLS {
			opts = append(opts, WithTLS(cfg.TLSFiles))
		}
		srv, err := NewServer(cfg.listenAddr(), cfg.Secret, cfg.Size, opts...)
		if err != nil {
			s.cancel(ErrClosed)
			return nil, fmt.Errorf("gccl bootstrap: rank %d: serving the rendezvous: %w", cfg.Rank, err)
		}
		s.server, s.served = srv, make(chan struct{})
		go func() {
			defer close(s.served)
			if err := srv.Serve(); err != nil {
				s.log.Warn(err.Error())
			}
		}()
		if host, port, _ := net.SplitHostPort(cfg.Addr); port == "0" {
			// A test or single-rank job asked for any free port.
			_, actual, _ := net.SplitHostPort(srv.Addr())
			dialAddr = net.JoinHostPort(host, actual)
		}
	}
	joinCtx, endJoin, wrongKey, err := s.connect(ctx, &cfg, dialAddr)
	if err != nil {
		s.shutdown(ErrClosed, false)
		return nil, fmt.Errorf("gccl bootstrap: rank %d: %w", cfg.Rank, err)
	}
	defer endJoin()

	host, _ := os.Hostname()
	rctx, done, timeoutMs := s.blockingContext(joinCtx)
	defer done()
	// WaitForReady: ranks often start before rank 0 serves; keep dialing
	// until the timeout instead of failing on the first refused connection.
	resp, err := s.rpc.Join(rctx, &pb.JoinRequest{
		Rank: s.rank, Size: int32(cfg.Size), LibraryVersion: cfg.Version, ProtocolVersion: int32(cfg.Protocol),
		Hostname: host, Pid: int32(os.Getpid()), TimeoutMs: timeoutMs,
	}, grpc.WaitForReady(true))
	if pe := wrongKey(); err != nil && pe != nil {
		err = fmt.Errorf("gccl bootstrap: rank %d: join %s: %w: %w; is GCCL_SECRET the same on every rank?", cfg.Rank, cfg.Addr, ErrUnauthenticated, pe)
		s.shutdown(ErrClosed, false)
		return nil, err
	}
	if err != nil {
		err = s.callError(ctx, fmt.Sprintf("rank %d: join %s", cfg.Rank, cfg.Addr), err)
		s.shutdown(ErrClosed, false)
		return nil, err
	}
	s.heartbeatTimeout = time.Duration(resp.HeartbeatTimeoutMs) * time.Millisecond
	if s.heartbeatTimeout <= 0 {
		s.heartbeatTimeout = DefaultHeartbeatTimeout // a server that names none
	}
	s.heartbeatInterval = time.Duration(resp.HeartbeatIntervalMs) * time.Millisecond
	if s.heartbeatInterval <= 0 || s.heartbeatInterval >= s.heartbeatTimeout {
		s.heartbeatInterval = max(s.heartbeatTimeout/3, time.Millisecond)
	}
	c := &Client{sess: s, rank: cfg.Rank, size: cfg.Size, group: worldGroup, lost: make(chan Notice, 2*cfg.Size+2)}
	s.root = c
	s.watchers[c] = true
	s.wg.Add(2)
	go s.heartbeat()
	go s.watch()
	s.log.Info(fmt.Sprintf("rank %d of %d joined the rendezvous at %s (job %s)", cfg.Rank, cfg.Size, cfg.Addr, cfg.JobID))
	return c, nil
}

// secretCredentials attaches the job secret to every call.
type secretCredentials string

func (s secretCredentials) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{secretMetadataKey: string(s)}, nil
}

// RequireTransportSecurity is false: the secret proves membership of the
// job on networks the job trusts (see the package documentation).
func (secretCredentials) RequireTransportSecurity() bool { return false }

func dialOptions(secret string, creds credentials.TransportCredentials) []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithPerRPCCredentials(secretCredentials(secret)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessageSize), grpc.MaxCallSendMsgSize(maxMessageSize)),
		// Retry a rendezvous that is not up yet every ≤1 s, not gRPC's
		// default of up to 2 minutes.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
	}
}

// blockingContext returns the context of one call: it ends with ctx, with the
// session, or rpcSlack after the server's own timeout, which it also returns
// in milliseconds (the smaller of cfg.Timeout and ctx's deadline).
func (s *session) blockingContext(ctx context.Context) (context.Context, context.CancelFunc, int64) {
	timeout := s.cfg.Timeout
	if deadline, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(deadline))
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout+rpcSlack)
	stop := context.AfterFunc(s.ctx, cancel)
	return rctx, func() { stop(); cancel() }, max(timeout.Milliseconds(), 1)
}

// callError turns the error of a call made with ctx into one that says which
// rank and call failed and wraps one of the package's sentinels.
func (s *session) callError(ctx context.Context, what string, err error) error {
	prefix := "gccl bootstrap: " + what
	if ctxErr := ctx.Err(); ctxErr != nil {
		if errors.Is(ctxErr, context.DeadlineExceeded) {
			return fmt.Errorf("%s: %w (%w)", prefix, ErrTimeout, ctxErr)
		}
		return fmt.Errorf("%s: %w", prefix, ctxErr)
	}
	if s.ctx.Err() != nil {
		return fmt.Errorf("%s: %w", prefix, context.Cause(s.ctx))
	}
	if st, ok := status.FromError(err); ok && st.Code() == codes.DeadlineExceeded && !fromServer(st) {
		return fmt.Errorf("%s: %w: no answer from the rendezvous at %s within %v; is it running (rank 0 serves it in-process, or gccl-bootstrap) and reachable? (%s)",
			prefix, ErrTimeout, s.cfg.Addr, s.cfg.Timeout+rpcSlack, st.Message())
	}
	return fmt.Errorf("%s: %w", prefix, fromStatus(err))
}

// fromServer reports whether a status was made by the rendezvous rather than
// by the client's gRPC stack.
func fromServer(st *status.Status) bool {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == errorDomain {
			return true
		}
	}
	return false
}

// heartbeat beats every heartbeatInterval and fails the session when the
// rendezvous stops acknowledging.
func (s *session) heartbeat() {
	defer s.wg.Done()
	stream, err := s.rpc.Heartbeat(s.ctx)
	if err != nil {
		s.streamEnded("heartbeat", err)
		return
	}
	var lastAck atomic.Int64
	lastAck.Store(time.Now().UnixNano())
	ended := make(chan error, 1)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			if _, err := stream.Recv(); err != nil {
				ended <- err
				return
			}
			lastAck.Store(time.Now().UnixNano())
		}
	}()
	beat := func() {
		// A failed Send means the stream broke; Recv reports why.
		_ = stream.Send(&pb.HeartbeatRequest{Rank: s.rank})
	}
	beat()
	tick := time.NewTicker(s.heartbeatInterval)
	defer tick.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case err := <-ended:
			s.streamEnded("heartbeat", err)
			return
		case now := <-tick.C:
			if s.heartbeatPaused.Load() {
				lastAck.Store(now.UnixNano())
				continue
			}
			if silent := now.Sub(time.Unix(0, lastAck.Load())); silent > s.heartbeatTimeout {
				s.fail(NoticeRendezvousLost, -1, fmt.Errorf("%w: no heartbeat answer from the rendezvous at %s%s for %v", ErrRendezvousLost, s.cfg.Addr, s.cfg.server(), silent.Round(time.Millisecond)))
				return
			}
			beat()
		}
	}
}

// watch delivers the job's notices to every client of the session.
func (s *session) watch() {
	defer s.wg.Done()
	stream, err := s.rpc.Watch(s.ctx, &pb.WatchRequest{Rank: s.rank})
	if err != nil {
		s.streamEnded("notice", err)
		return
	}
	for {
		n, err := stream.Recv()
		if err != nil {
			s.streamEnded("notice", err)
			return
		}
		if n.Rank == s.rank {
			if n.Kind == pb.Notice_RANK_LOST {
				// This rank stalled long enough to be given up on.
				s.fail(NoticeRankLost, int(s.rank), fmt.Errorf("%w: the rendezvous declared this rank lost: %s", ErrRankLost, n.Reason))
				return
			}
			continue // this rank's own abort
		}
		kind := NoticeRankLost
		if n.Kind == pb.Notice_RANK_ABORTED {
			kind = NoticeAbort
		} else {
			s.mu.Lock()
			s.goneJob[n.Rank] = true
			s.mu.Unlock()
		}
		s.deliver(Notice{Kind: kind, Rank: int(n.Rank), Reason: n.Reason, group: n.Group})
	}
}

// streamEnded fails the session when a stream to the rendezvous ends for any
// reason other than this client closing.
func (s *session) streamEnded(which string, err error) {
	if s.ctx.Err() != nil || s.leaving.Load() {
		return
	}
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Reason == reasonDeclaredLost {
			s.fail(NoticeRankLost, int(s.rank), fmt.Errorf("%w: %s", ErrRankLost, st.Message()))
			return
		}
	}
	s.fail(NoticeRendezvousLost, -1, fmt.Errorf("%w: the %s stream to the rendezvous at %s%s ended: %s", ErrRendezvousLost, which, s.cfg.Addr, s.cfg.server(), st.Message()))
}

// fail ends the session with err (every pending and later call returns it)
// and tells the clients.
func (s *session) fail(kind NoticeKind, rank int, err error) {
	s.mu.Lock()
	if s.failed || s.ctx.Err() != nil || s.leaving.Load() {
		s.mu.Unlock()
		return
	}
	s.failed = true
	s.mu.Unlock()
	s.cancel(err)
	s.log.Warn(fmt.Sprintf("rank %d: %v", s.rank, err))
	s.deliver(Notice{Kind: kind, Rank: rank, Reason: err.Error()})
}

// deliver hands n to every open client it concerns. The channels hold two
// notices per rank (its loss and its abort, each sent once), so a full
// channel means a reader that never reads: drop rather than block the
// stream.
func (s *session) deliver(n Notice) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.watchers {
		if !c.concerns(n) {
			continue
		}
		select {
		case c.lost <- n:
		default:
			s.log.Warn(fmt.Sprintf("rank %d: dropped notice %q: Lost channel full", s.rank, n))
		}
	}
}

// shutdown releases everything the session holds; cause is what later calls
// return. A serving rank first waits (at most Config.Timeout) for the other
// ranks to leave when waitForOthers is set.
func (s *session) shutdown(cause error, waitForOthers bool) {
	s.cancel(cause)
	s.wg.Wait()
	if s.conn != nil {
		s.conn.Close()
		untrackSession(s)
	}
	s.mu.Lock()
	for c := range s.watchers {
		close(c.lost)
		delete(s.watchers, c)
	}
	s.mu.Unlock()
	if s.server == nil {
		return
	}
	if waitForOthers {
		wait := time.NewTimer(s.cfg.Timeout)
		select {
		case <-s.server.Done():
		case <-wait.C:
			s.log.Warn(fmt.Sprintf("rank %d: stopping the rendezvous although some ranks have not left after %v", s.rank, s.cfg.Timeout))
		}
		wait.Stop()
	}
	s.server.Stop()
	<-s.served
}

// Rank returns this rank in the client's group (the job for a Client from
// Join, the new group for one from Split).
func (c *Client) Rank() int { return c.rank }

// Size returns the number of ranks in the client's group.
func (c *Client) Size() int { return c.size }

// JobID returns the job's ID (Config.JobID, by default derived from the
// secret), which names shared resources such as /dev/shm/gccl-<JobID>-*.
func (c *Client) JobID() string { return c.sess.cfg.JobID }

// JobRanks returns the job ranks of the client's group, in group-rank order.
func (c *Client) JobRanks() []int {
	out := make([]int, c.size)
	for i := range out {
		out[i] = c.jobRank(i)
	}
	return out
}

func (c *Client) jobRank(groupRank int) int {
	if c.members == nil {
		return groupRank
	}
	return int(c.members[groupRank])
}

// Lost returns the channel of the notices that concern the client's group:
// its members lost, aborts of the group, and the loss of the rendezvous or
// of this rank's membership. Every Client, including those from Split and
// Shrink, has its own channel. It is closed by Close.
func (c *Client) Lost() <-chan Notice { return c.lost }

// concerns reports whether n is news for c's group: a group made by Shrink
// must not hear of the ranks it excluded, nor of its parent's abort.
func (c *Client) concerns(n Notice) bool {
	switch n.Kind {
	case NoticeRankLost:
		return n.Rank == int(c.sess.rank) || c.hasJobRank(n.Rank)
	case NoticeAbort:
		return n.group == c.group
	}
	return true
}

// LostRanks returns the ranks of the client's group (in group numbering)
// that are gone from the job so far, in order: what Shrink should exclude.
// They are the ranks the rendezvous declared lost and those that left (closed
// their last client, say on an error of their own). A rank whose process died
// is declared lost within milliseconds (its connection breaks); a hung one
// after the heartbeat timeout. A rank that left is not announced (every rank
// leaves at the end of a job): LostRanks asks the rendezvous, waiting at most
// goneQueryTimeout, and without an answer reports the losses it was told of.
func (c *Client) LostRanks() []int {
	s := c.sess
	if c.usable("lost ranks") == nil {
		ctx, cancel := context.WithTimeout(s.ctx, goneQueryTimeout)
		resp, err := s.rpc.Gone(ctx, &pb.GoneRequest{Rank: s.rank})
		cancel()
		if err == nil {
			s.mu.Lock()
			for _, r := range resp.Ranks {
				s.goneJob[r] = true
			}
			s.mu.Unlock()
		} else {
			s.log.Warn(fmt.Sprintf("rank %d: cannot ask the rendezvous which ranks left: %v", s.rank, err))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int
	for r := range c.size {
		if s.goneJob[int32(c.jobRank(r))] {
			out = append(out, r)
		}
	}
	return out
}

func (c *Client) hasJobRank(r int) bool {
	if c.members == nil {
		return r >= 0 && r < c.size
	}
	return slices.Contains(c.members, int32(r))
}

// Abort tells every rank of the client's group that this rank gives up on
// it, with reason: their pending and later blocking calls of the group fail
// with ErrAborted, and their Lost channels for the group get a NoticeAbort.
// Other groups, the job's included when c is a sub-client, go on.
func (c *Client) Abort(ctx context.Context, reason string) error {
	if err := c.usable("abort"); err != nil {
		return err
	}
	rctx, done, _ := c.sess.blockingContext(ctx)
	defer done()
	if _, err := c.sess.rpc.Abort(rctx, &pb.AbortRequest{Rank: c.sess.rank, Reason: reason, Group: c.group}); err != nil {
		return c.sess.callError(ctx, c.describe("abort"), err)
	}
	return nil
}

// Close ends the client: its calls fail with ErrClosed and its Lost channel
// closes. The Client from Join and those made from it by Split and Shrink
// share one connection, which stays up while any of them is open, so that
// a group outlives its parent (as NCCL's communicators do). Closing the
// last one leaves the job cleanly (other ranks do not see this rank as
// lost); on the serving rank it then waits until the other ranks left (at
// most Config.Timeout) and stops the rendezvous. Close is idempotent. A
// rendezvous that is gone is not an error of Close.
func (c *Client) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	s := c.sess
	s.mu.Lock()
	if s.watchers[c] {
		delete(s.watchers, c)
		close(c.lost)
	}
	last := len(s.watchers) == 0
	if last {
		// No Split or Shrink may add a client to a session on its way out.
		s.leaving.Store(true)
	}
	s.mu.Unlock()
	if !last {
		return nil
	}
	var err error
	if s.ctx.Err() == nil {
		ctx, cancel := context.WithTimeout(context.Background(), min(s.cfg.Timeout, leaveTimeout))
		if _, lerr := s.rpc.Leave(ctx, &pb.LeaveRequest{Rank: s.rank}); lerr != nil {
			// A rendezvous already gone (stopped, its host dead) has no
			// job left to tell: that is not a failure to close, whether or
			// not this client had noticed yet.
			if err = s.callError(ctx, c.describe("close"), lerr); errors.Is(err, ErrRendezvousLost) {
				err = nil
			}
		}
		cancel()
	}
	s.shutdown(ErrClosed, true)
	return err
}

// usable returns the error of a call on a closed or failed client.
func (c *Client) usable(what string) error {
	if c.closed.Load() {
		return fmt.Errorf("gccl bootstrap: %s: %w", c.describe(what), ErrClosed)
	}
	if c.sess.ctx.Err() != nil {
		return fmt.Errorf("gccl bootstrap: %s: %w", c.describe(what), context.Cause(c.sess.ctx))
	}
	return nil
}

// describe names this rank and the call for error messages.
func (c *Client) describe(what string) string {
	if c.members == nil {
		return fmt.Sprintf("rank %d: %s", c.rank, what)
	}
	return fmt.Sprintf("rank %d (rank %d of group %s): %s", c.sess.rank, c.rank, c.group, what)
}

// connect makes the session's client of the rendezvous at addr. Calls made
// under the returned context end at once when the rendezvous shows the
// wrong TLS key, which wrongKey then reports; end releases the context.
func (s *session) connect(ctx context.Context, cfg *Config, addr string) (callCtx context.Context, end func(), wrongKey func() error, err error) {
	callCtx, cancel := context.WithCancelCause(ctx)
	var pinErr atomic.Pointer[error]
	creds, err := clientCredentials(cfg, func(err error) {
		pinErr.CompareAndSwap(nil, &err)
		cancel(err)
	})
	if err != nil {
		cancel(nil)
		return nil, nil, nil, err
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, dialOptions(cfg.Secret, creds)...)
	if err != nil {
		cancel(nil)
		return nil, nil, nil, fmt.Errorf("%w: rendezvous address %q: %v", ErrInvalidArgument, addr, err)
	}
	s.conn, s.rpc = conn, pb.NewBootstrapClient(conn)
	trackSession(s, addr)
	wrongKey = func() error {
		if p := pinErr.Load(); p != nil {
			return *p
		}
		return nil
	}
	return callCtx, func() { cancel(nil) }, wrongKey, nil
}
