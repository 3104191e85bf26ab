package bootstrap

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	pb "github.com/gccl/gccl/bootstrap/bootstrappb"
	"github.com/gccl/gccl/internal/logx"
)

// secretMetadataKey is the gRPC metadata entry that carries the job secret.
const secretMetadataKey = "gccl-secret"

// maxMessageSize bounds one gRPC message. An all-gather answer holds every
// rank's descriptor (e.g. 4096 ranks × 4 KiB = 16 MiB), well above gRPC's
// 4 MiB default.
const maxMessageSize = 256 << 20

// stopGrace is how long Stop lets answers already written reach clients
// before it closes the connections.
const stopGrace = time.Second

// Server is the rendezvous of one job: it admits the job's ranks, holds the
// key-value store and collective rounds, and watches heartbeats. Rank 0 runs
// one in-process by default (Config.Serve); cmd/gccl-bootstrap runs one
// standalone.
type Server struct {
	pb.UnimplementedBootstrapServer

	secret           []byte
	size             int
	heartbeatTimeout time.Duration
	log              *slog.Logger
	version          string
	listener         net.Listener
	grpcServer       *grpc.Server
	useTLS           bool     // see WithTLS
	tlsFiles         TLSFiles // see WithTLS

	stopped     chan struct{} // closed by Stop
	stopOnce    sync.Once
	monitorDone sync.WaitGroup

	mu             sync.Mutex
	monitoring     bool
	members        []member // by rank
	joined         int      // members that are not absent
	allJoined      chan struct{}
	ended          chan struct{} // closed once every rank joined and then left or was lost
	endedClosed    bool
	gone           int // members left or lost
	kv             map[string][]byte
	kvChanged      chan struct{} // closed and replaced on every change of kv
	rounds         map[string]*round
	failedRounds   map[string]error // so late arrivals get the failure at once
	notices        []*pb.Notice
	noticesChanged chan struct{}         // closed and replaced on every new notice
	abortedGroups  map[string]*pb.Notice // each aborted group's first abort
	grows          growState             // Grow calls (server_grow.go)
}

type memberState int

const (
	absent memberState = iota
	gaveUp             // its Join ended before the job was complete; it may join again
	joined
	left
	lost
)

type member struct {
	state    memberState
	host     string
	pid      int32
	lastSeen time.Time // last heartbeat (or the moment every rank had joined)
	reason   string    // why it was lost
}

// ServerOption configures NewServer.
type ServerOption func(*Server)

// WithHeartbeatTimeout sets how long a rank may stay silent before it is
// declared lost (default DefaultHeartbeatTimeout).
func WithHeartbeatTimeout(d time.Duration) ServerOption {
	return func(s *Server) {
		if d > 0 {
			s.heartbeatTimeout = d
		}
	}
}

// WithLogger sets the logger for joins, leaves, losses and aborts (default:
// gccl's logger, subsystem BOOTSTRAP).
func WithLogger(l *slog.Logger) ServerOption {
	return func(s *Server) {
		if l != nil {
			s.log = l
		}
	}
}

// NewServer listens on addr (host:port; port 0 picks a free one, see Addr)
// for a job of size ranks that share secret. Call Serve to serve and Stop to
// stop. Ranks must run this build's Version and ProtocolVersion.
func NewServer(addr, secret string, size int, opts ...ServerOption) (*Server, error) {
	secret = strings.ToLower(secret) // as Join does
	if err := checkSecret(secret); err != nil {
		return nil, fmt.Errorf("gccl bootstrap: server: %w", err)
	}
	if size < 1 {
		return nil, fmt.Errorf("gccl bootstrap: server: %w: size %d; a job has at least one rank", ErrInvalidArgument, size)
	}
	s := &Server{
		secret:           []byte(secret),
		size:             size,
		heartbeatTimeout: DefaultHeartbeatTimeout,
		version:          Version,
		stopped:          make(chan struct{}),
		members:          make([]member, size),
		allJoined:        make(chan struct{}),
		ended:            make(chan struct{}),
		kv:               map[string][]byte{},
		kvChanged:        make(chan struct{}),
		rounds:           map[string]*round{},
		failedRounds:     map[string]error{},
		noticesChanged:   make(chan struct{}),
		abortedGroups:    map[string]*pb.Notice{},
	}
	for _, o := range opts {
		o(s)
	}
	if s.log == nil {
		s.log = logx.Default().With("subsys", "BOOTSTRAP")
	}
	creds, err := s.serverCredentialsOption()
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("gccl bootstrap: server: listen on %s: %w (is another job or gccl-bootstrap using the port? set GCCL_BOOTSTRAP_ADDR)", addr, err)
	}
	s.listener = lis
	s.grpcServer = grpc.NewServer(
		creds,
		grpc.UnaryInterceptor(s.authenticateUnary),
		grpc.StreamInterceptor(s.authenticateStream),
		grpc.MaxRecvMsgSize(maxMessageSize),
		grpc.MaxSendMsgSize(maxMessageSize),
	)
	pb.RegisterBootstrapServer(s.grpcServer, s)
	return s, nil
}

// Addr returns the address the server listens on.
func (s *Server) Addr() string { return s.listener.Addr().String() }

// Serve serves the rendezvous until Stop. It returns nil after Stop.
func (s *Server) Serve() error {
	s.mu.Lock()
	select {
	case <-s.stopped:
		s.mu.Unlock()
		return nil
	default:
	}
	if !s.monitoring {
		s.monitoring = true
		s.monitorDone.Add(1)
		go s.monitorHeartbeats()
	}
	s.mu.Unlock()
	s.log.Info(fmt.Sprintf("rendezvous serving %d ranks on %s", s.size, s.Addr()))
	err := s.grpcServer.Serve(s.listener)
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	select {
	case <-s.stopped:
		return nil
	default:
	}
	return fmt.Errorf("gccl bootstrap: server on %s: %w", s.Addr(), err)
}

// Stop stops the server: pending blocking calls fail with ErrRendezvousLost,
// connections close and the port is released. It is safe to call more than
// once and from several goroutines.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		close(s.stopped) // under mu so that Serve either starts the monitor before or not at all
		s.mu.Unlock()
		graceful := make(chan struct{})
		go func() {
			s.grpcServer.GracefulStop()
			close(graceful)
		}()
		select {
		case <-graceful:
		case <-time.After(stopGrace):
			s.grpcServer.Stop()
			<-graceful
		}
		s.listener.Close() // in case Serve never ran
		s.monitorDone.Wait()
	})
}

// Done is closed when the job has ended: every rank joined and then left or
// was lost.
func (s *Server) Done() <-chan struct{} { return s.ended }

// Err reports how the job went: nil while it runs or if every rank left
// cleanly; otherwise an error wrapping ErrAborted or ErrRankLost that names
// the ranks.
func (s *Server) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.notices {
		if n.Kind == pb.Notice_RANK_ABORTED {
			return fmt.Errorf("%w by rank %d%s: %s", ErrAborted, n.Rank, groupNote(n.Group), n.Reason)
		}
	}
	var lostRanks []int
	for r, m := range s.members {
		if m.state == lost {
			lostRanks = append(lostRanks, r)
		}
	}
	if len(lostRanks) > 0 {
		return fmt.Errorf("%w: ranks %s (first: rank %d: %s)", ErrRankLost, rankList(lostRanks), lostRanks[0], s.members[lostRanks[0]].reason)
	}
	return nil
}

// authenticate admits only calls that carry the job secret. The compare is
// constant-time so that the secret cannot be guessed byte by byte.
func (s *Server) authenticate(ctx context.Context, method string) error {
	if err := s.checkTLSMode(ctx, method); err != nil {
		return err
	}
	md, _ := metadata.FromIncomingContext(ctx)
	got := md.Get(secretMetadataKey)
	if len(got) == 1 && subtle.ConstantTimeCompare([]byte(got[0]), s.secret) == 1 {
		return nil
	}
	from := "unknown peer"
	if p, ok := peer.FromContext(ctx); ok {
		from = p.Addr.String()
	}
	s.log.Warn(fmt.Sprintf("rejected %s from %s: wrong job secret", method, from))
	return statusError(codes.Unauthenticated, reasonWrongSecret,
		"wrong job secret: the rendezvous at %s serves another job (or this rank's GCCL_SECRET differs); give every rank the same GCCL_SECRET", s.Addr())
}

func (s *Server) authenticateUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := s.authenticate(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (s *Server) authenticateStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := s.authenticate(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}

// errWaitTimedOut is await's answer when the call's own timeout passed; the
// caller turns it into a status that says what was missing.
var errWaitTimedOut = errors.New("wait timed out")

// newTimer returns a channel that fires after timeoutMs (never when 0) and
// its stop function.
func newTimer(timeoutMs int64) (<-chan time.Time, func() bool) {
	if timeoutMs <= 0 {
		return nil, func() bool { return false }
	}
	t := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
	return t.C, t.Stop
}

// await blocks until ch is closed (nil), the timer fires (errWaitTimedOut),
// the call ends or the server stops. (An abort fails a call through what it
// waits for: its round, or the store's change channel.)
func (s *Server) await(ctx context.Context, ch <-chan struct{}, timer <-chan time.Time) error {
	select {
	case <-ch:
		return nil
	case <-timer:
		return errWaitTimedOut
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	case <-s.stopped:
		return s.stoppedError()
	}
}

func (s *Server) stoppedError() error {
	return statusError(codes.Unavailable, reasonServerStopped, "the rendezvous at %s stopped", s.Addr())
}

// abortErrorLocked is the error of every blocking call of group once a rank
// aborted it. Groups are independent, as NCCL's communicators are: the
// survivors of an aborted group can still make a new one (Shrink).
func (s *Server) abortErrorLocked(group string) error {
	n := s.abortedGroups[group]
	if n == nil {
		return nil
	}
	if group == worldGroup {
		return statusError(codes.Aborted, reasonAborted, "job aborted by rank %d: %s", n.Rank, n.Reason)
	}
	return statusError(codes.Aborted, reasonAborted, "group %s aborted by rank %d: %s", group, n.Rank, n.Reason)
}

// groupNote names a group other than the whole job, for messages.
func groupNote(group string) string {
	if group == "" || group == worldGroup {
		return ""
	}
	return " (group " + group + ")"
}

// memberLocked checks that rank has joined and is still part of the job.
func (s *Server) memberLocked(rank int32) error {
	// Members grow beyond the job's first ranks with Grow.
	if rank < 0 || int(rank) >= len(s.members) {
		return statusError(codes.InvalidArgument, reasonNotMember, "rank %d is outside 0..%d", rank, len(s.members)-1)
	}
	switch m := s.members[rank]; m.state {
	case absent, gaveUp:
		return statusError(codes.FailedPrecondition, reasonNotMember, "rank %d has not joined the job", rank)
	case left:
		return statusError(codes.FailedPrecondition, reasonNotMember, "rank %d has left the job (closed its client)", rank)
	case lost:
		return statusError(codes.Aborted, reasonDeclaredLost, "the rendezvous declared rank %d lost (%s); it can no longer take part in the job", rank, m.reason)
	}
	return nil
}

// rankList formats ranks compactly for messages ("1, 3, 5" or the first 16
// and a count).
func rankList(ranks []int) string {
	const show = 16
	var b []byte
	for i, r := range ranks {
		if i == show {
			b = fmt.Appendf(b, " and %d more", len(ranks)-show)
			break
		}
		if i > 0 {
			b = append(b, ", "...)
		}
		b = fmt.Appendf(b, "%d", r)
	}
	return string(b)
}
