package ibverbs

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/gccl/gccl/internal/logx"
	"github.com/gccl/gccl/internal/verbs"
	"github.com/gccl/gccl/transport"
	"github.com/gccl/gccl/transport/tcp"
)

// Name is the transport's name in descriptors and in the registry's logs
// ("rank 0 -> 1 via TCP instead of IB (...)").
const Name = "IB"

// Priority puts RDMA after shared memory and before TCP.
const Priority = 20

// DefaultQPs is GCCL_IB_QPS_PER_CONNECTION's default, NCCL's: on
// Soft-RoCE two QPs per pair moved 4 MiB sendrecvs ~30% slower than one
// (more QPs, more of rxe's per-QP work on the same CPUs); a NIC whose ports
// or paths a single QP cannot fill wants more.
const DefaultQPs = 1

func init() { transport.Register(ibTransport{}, Priority) }

type ibTransport struct{}

func (ibTransport) Name() string { return Name }

func (ibTransport) Reach(me, peer *transport.Descriptor) transport.Reach { return reach(me, peer) }

// options are the transport's settings from the environment.
type options struct {
	verbs  verbs.Config
	qps    int
	strict bool
}

func optionsFrom(getenv func(string) string) (options, error) {
	vc, err := verbs.ConfigFrom(getenv)
	if err != nil {
		return options{}, errors.New(strings.TrimPrefix(err.Error(), "verbs: "))
	}
	o := options{verbs: vc, qps: DefaultQPs, strict: getenv("GCCL_STRICT") == "1"}
	if v := strings.TrimSpace(getenv("GCCL_IB_QPS_PER_CONNECTION")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxQPs {
			return options{}, fmt.Errorf("GCCL_IB_QPS_PER_CONNECTION=%q: want an integer from 1 to %d", v, MaxQPs)
		}
		o.qps = n
	}
	return o, nil
}

// logger is the Setup's logger, or gccl's (GCCL_DEBUG decides) when the
// Setup's discards.
func logger(s *transport.Setup) *slog.Logger {
	l := s.Logger
	if l == nil || l.Handler() == slog.DiscardHandler {
		l = logx.Default()
	}
	return l.With("rank", s.Rank)
}

// Listen opens the rank's RDMA port when the host has RDMA devices and
// some peer is not served by a faster transport. Without devices (or with
// GCCL_IB_DISABLE=1) it does nothing: no peer expects RDMA then. With
// devices it cannot use, the error says why, and peers on other hosts that
// have devices log the downgrade.
func (ibTransport) Listen(ctx context.Context, s *transport.Setup) (transport.Listener, error) {
	if len(s.Unclaimed) == 0 || strings.TrimSpace(s.Getenv("GCCL_IB_DISABLE")) == "1" {
		return nil, nil
	}
	devs, err := verbs.Devices()
	if errors.Is(err, verbs.ErrNotSupported) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	o, err := optionsFrom(s.Getenv)
	if err != nil {
		return nil, err
	}
	eager, err := transport.EagerConnect(s.Getenv)
	if err != nil {
		return nil, fmt.Errorf("ibverbs: %w", err)
	}
	g, err := newGeometry(s.SlotSize, s.SlotCount, o.qps)
	if err != nil {
		return nil, err
	}
	// Pinned at once: every pair's rings, or, connecting at first use, one
	// pair's (a pair whose registration fails later moves to TCP).
	pairs := uint64(1)
	if eager {
		pairs = uint64(len(s.Unclaimed))
	}
	if why := memlockCheck(pairs * uint64(g.bytes())); why != "" {
		return nil, errors.New(why)
	}
	log := logger(s)
	cand, err := verbs.Choose(devs, o.verbs, verbs.Near{NUMA: -1, LocalRank: s.LocalRank})
	if err != nil {
		return nil, errors.New(strings.TrimPrefix(err.Error(), verbs.ErrNotSupported.Error()+": "))
	}
	log.Info(fmt.Sprintf("NET/IB : Using %s", cand), "subsys", "NET")
	vctx, err := verbs.Open(cand.Device)
	if err != nil {
		return nil, err
	}
	port, err := vctx.CandidatePort(cand)
	var pd *verbs.PD
	if err == nil {
		pd, err = vctx.AllocPD()
	}
	if err != nil {
		vctx.Close()
		return nil, err
	}
	l := &listener{s: *s, o: o, eager: eager, log: log, ctx: vctx, pd: pd, port: port, addr: portAddr{
		Device: cand.Device, Port: port.Num, LinkLayer: port.Attr.LinkLayer, GIDType: port.GID.Type,
		GIDIndex: port.GID.Index, GID: port.GID.GID, LID: port.Attr.LID, MTU: port.Attr.ActiveMTU, QPs: o.qps,
	}}
	// The fallback listens now so that its address travels in the
	// descriptor: a pair that moves to TCP later needs no store round.
	token := sha256.Sum256([]byte("gccl-ib-fallback:" + s.JobID))
	if fb, err := tcp.Listen(s.Rank, s.Size, tcp.Config{SlotSize: s.SlotSize, SlotCount: s.SlotCount, Token: token[:]}); err == nil {
		l.fallback, l.addr.TCP = fb, fb.Addr()
	} else {
		log.Info(fmt.Sprintf("NET/IB : no TCP fallback for pairs whose RDMA fails: %v", err), "subsys", "NET")
	}
	return l, nil
}

// listener is a rank's open port, between Listen and Connect.
type listener struct {
	s         transport.Setup
	o         options
	eager     bool // GCCL_RUNTIME_CONNECT=0
	fallback  *tcp.Listener
	log       *slog.Logger
	ctx       *verbs.Context
	pd        *verbs.PD
	port      verbs.Port
	addr      portAddr
	connected bool
}

func (l *listener) Addr() []byte { return l.addr.marshal() }

// Release closes the device unless Connect handed it to an endpoint.
func (l *listener) Release() error {
	if l.fallback != nil {
		l.fallback.Close()
		l.fallback = nil
	}
	if l.connected || l.ctx == nil {
		return nil
	}
	err := errors.Join(l.pd.Close(), l.ctx.Close())
	l.ctx, l.pd = nil, nil
	return err
}
