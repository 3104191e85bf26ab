package ibverbs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/gccl/gccl/internal/verbs"
	"github.com/gccl/gccl/transport"
)

// Store keys: what rank a publishes for its pair with rank b, in the job's
// store (namespaced per communicator by the store itself).
func infoKey(job string, a, b int) string     { return pairKey(job, "qp", a, b) }
func readyKey(job string, a, b int) string    { return pairKey(job, "ready", a, b) }
func recordedKey(job string, a, b int) string { return pairKey(job, "recorded", a, b) }

func pairKey(job, kind string, a, b int) string {
	return fmt.Sprintf("gccl-ib/%s/%s/%d-%d", job, kind, a, b)
}

// Connect returns the endpoint to peers, each pair connecting over qps RC
// QPs (the smaller of the two ranks' GCCL_IB_QPS_PER_CONNECTION) at its
// first use (pair.go); under GCCL_RUNTIME_CONNECT=0 it connects every pair
// first and returns once all are up or moved to TCP (and, under
// GCCL_STRICT=1, fails if any RDMA pair failed).
func (l *listener) Connect(ctx context.Context, bell transport.Bell, peers []*transport.Descriptor) (transport.Endpoint, error) {
	s := &l.s
	if s.Store == nil {
		return nil, errors.New("ibverbs: no key-value store to exchange queue pairs through")
	}
	l.connected = true
	e := &Endpoint{rank: s.Rank, size: s.Size, slotSize: s.SlotSize, bell: bell, log: l.log,
		name: "NET/IB/" + l.addr.Name(), ctx: l.ctx, pd: l.pd, port: l.port, me: l.addr,
		o: l.o, store: s.Store, job: s.JobID, addrs: make([]portAddr, s.Size), geos: make([]geometry, s.Size),
		conns: make([]*conn, s.Size), viaTCP: make([]atomic.Bool, s.Size), setupFailures: make([]atomic.Pointer[error], s.Size), wcs: make([]verbs.WC, 64)}
	e.setupCtx, e.endSetup = context.WithCancel(context.Background())
	fb := l.fallback
	l.fallback = nil
	fail := func(err error) (transport.Endpoint, error) {
		if fb != nil {
			fb.Close() // not handed to an endpoint yet
		}
		e.discard()
		return nil, err
	}
	depth := 16
	tcpAddrs := make([]string, s.Size)
	var tcpPeers []int
	for _, d := range peers {
		a, err := parseAddr(d.Addr(Name))
		if err != nil {
			return fail(fmt.Errorf("ibverbs: rank %d: %w", d.Rank, err))
		}
		g, err := newGeometry(s.SlotSize, s.SlotCount, min(l.o.qps, a.QPs))
		if err != nil {
			return fail(err)
		}
		e.addrs[d.Rank], e.geos[d.Rank] = a, g
		depth += g.cqDepth()
		if a.TCP != "" {
			tcpAddrs[d.Rank] = a.TCP
			tcpPeers = append(tcpPeers, d.Rank)
		}
	}
	var err error
	if e.cq, err = l.ctx.CreateCQ(depth, true); err != nil {
		return fail(err)
	}
	if fb != nil {
		// Pairs connect over it only when they move there.
		fb.SetBell(bell)
		if e.fallback, err = fb.ConnectLazy(tcpPeers, tcpAddrs, nil); err != nil {
			return fail(fmt.Errorf("ibverbs: the TCP fallback: %w", err))
		}
		fb = nil
	}
	e.armc, e.waiterDone = make(chan struct{}, 1), make(chan struct{})
	go e.waiter()
	if len(peers) > 0 {
		e.log.Info("NET/IB : RDMA carries host memory only: device buffers cross hosts through registered host staging (GPUDirect RDMA is not used yet)", "subsys", "NET")
	}
	if !l.eager {
		return e, nil
	}
	stop := context.AfterFunc(ctx, e.endSetup) // Connect's deadline bounds the store calls
	err = e.connectAll(peers)
	stop()
	if err != nil {
		return fail(err)
	}
	return e, nil
}

// connectAll sets up every pair with peers (GCCL_RUNTIME_CONNECT=0): each
// step of the exchange for all of them before the next, from this
// goroutine, so that a rank has one store call in flight at a time.
func (e *Endpoint) connectAll(peers []*transport.Descriptor) error {
	xs := make([]*exchange, 0, len(peers))
	for _, d := range peers {
		c, _, err := e.add(d.Rank)
		if err != nil {
			return err
		}
		xs = append(xs, &exchange{c: c})
	}
	live := xs
	for _, step := range steps {
		next := live[:0:0]
		for _, x := range live {
			if step(x, e) {
				next = append(next, x)
			}
		}
		live = next
	}
	var lines []string
	var errs []error
	for _, x := range xs {
		x.c.setup.Store(&x.r)
	}
	e.applyPending()
	for _, x := range xs {
		switch c := x.c; {
		case c.err == nil:
		case e.o.strict && x.r.err == nil && x.r.why != "":
			lines = append(lines, downgrade(e.rank, c.peer, x.r.why))
		default:
			errs = append(errs, c.err)
		}
	}
	if len(lines) > 0 {
		return fmt.Errorf("%w: GCCL_STRICT=1 forbids a downgrade: %s", verbs.ErrNotSupported, strings.Join(lines, "; "))
	}
	return errors.Join(errs...)
}

// discard releases an endpoint Connect could not finish.
func (e *Endpoint) discard() {
	e.closed.Store(true)
	e.owner.Store(ownerClosed)
	if e.fallback != nil {
		e.fallback.Close()
	}
	e.release()
}
