package ibverbs

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/gccl/gccl/internal/verbs"
	"github.com/gccl/gccl/transport"
)

// Connecting a pair. A pair's memory, QPs and exchange are made at its first
// use, the endpoint's first Sender or Receiver for the peer, so that a rank
// registers rings only for the peers its plans use. The owner allocates the
// connection's region and returns at once; a goroutine per pair registers
// the region, creates the QPs and runs the exchange through the job's store
// (publish this side, read the peer's, connect the QPs, publish whether that
// worked, read the peer's verdict; when RDMA failed, one more round, below),
// so a first use in any order cannot deadlock. Until the pair is up its
// sends wait in the send ring (up to count messages, as for a slow peer)
// and its receives find nothing.
//
// The outcome is applied by whoever owns the endpoint next: the owner's own
// progress, or the set-up goroutine itself when the owner is away (so that
// what a rank queued goes out even while it waits on another transport or
// is outside any call). Up: the queued messages are posted. RDMA failed on
// either side: the pair moves to the endpoint's TCP fallback, with a WARN
// naming the pair and the reason, and what was queued is copied there in
// order; under GCCL_STRICT=1 the pair fails instead. The exchange itself
// failed (the store): the pair fails with that error.
//
// A pair that fails may end its rank at once (a program exits on the first
// error), and its peer would then see only a lost rank. So before either
// side applies a failure, each records it where SetupFailure finds it and
// publishes that it did, then waits for the peer's word: when a rank can
// first act on the failure, its peer already holds the cause.

// setupResult is what a pair's set-up found.
type setupResult struct {
	why string // RDMA failed on one side or the other, and why; "" when it is up
	err error  // the exchange failed: the pair fails with it
}

// testHookOutcome, when set (tests), runs in a pair's set-up before it
// publishes the outcome.
var testHookOutcome func(rank, peer int)

// storeRetry is how long a set-up waits before asking the store again when
// a read timed out: a peer may first use the pair much later.
var storeRetry = 100 * time.Millisecond

// use returns the connection with peer, starting its set-up at the first
// use. The caller owns the endpoint.
func (e *Endpoint) use(peer int) (*conn, error) {
	c, fresh, err := e.add(peer)
	if fresh {
		e.setups.Add(1)
		go e.setUp(c)
	}
	return c, err
}

// add returns the connection with peer, making it (memory only) if it is
// new.
func (e *Endpoint) add(peer int) (*conn, bool, error) {
	if c := e.conns[peer]; c != nil {
		return c, false, nil
	}
	if e.addrs[peer].Device == "" {
		return nil, false, &transport.PeerError{Peer: peer, Err: fmt.Errorf("ibverbs: rank %d does not connect to rank %d over RDMA", e.rank, peer)}
	}
	c := e.newConn(peer, e.geos[peer])
	e.conns[peer] = c
	e.pending = append(e.pending, c)
	return c, true, nil
}

// setUp connects the pair, publishes the outcome and rings the bell, then
// applies it unless the owner did first.
func (e *Endpoint) setUp(c *conn) {
	defer e.setups.Done()
	x := exchange{c: c}
	for _, step := range steps {
		if !step(&x, e) {
			break
		}
	}
	if testHookOutcome != nil {
		testHookOutcome(e.rank, c.peer)
	}
	c.setup.Store(&x.r)
	e.bell.Ring()
	for !c.applied.Load() && !e.closed.Load() {
		if e.owner.CompareAndSwap(0, ownerSetUp) {
			if !e.closed.Load() {
				e.applyPending()
			}
			e.owner.Store(0)
			return
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// exchange is one pair's set-up: this side, then the peer's through the
// store, in three steps that each publish before they read, so the peer's
// first use may come before or after this one. A step reports false once
// the outcome is known.
type exchange struct {
	c *conn
	r setupResult
}

var steps = []func(*exchange, *Endpoint) bool{(*exchange).publish, (*exchange).join, (*exchange).verdict, (*exchange).record, (*exchange).settle}

// publish sets up this side and publishes it (or why it failed).
func (x *exchange) publish(e *Endpoint) bool {
	c := x.c
	info := pairInfo{}
	if err := c.open(); err != nil {
		x.r.why = fmt.Sprintf("rank %d could not set up its side: %v", e.rank, err)
		info.Failed = x.r.why
	} else {
		info = c.info()
	}
	if err := e.store.Set(e.setupCtx, infoKey(e.job, e.rank, c.peer), info.marshal()); err != nil {
		x.r.err = fmt.Errorf("ibverbs: publishing the QPs for rank %d: %w", c.peer, err)
		return false
	}
	return true
}

// join reads the peer's side, connects the QPs to it and publishes
// whether that worked.
func (x *exchange) join(e *Endpoint) bool {
	c := x.c
	b, err := e.storeGet(infoKey(e.job, c.peer, e.rank))
	if err != nil {
		x.r.err = fmt.Errorf("ibverbs: reading rank %d's QPs: %w", c.peer, err)
		return false
	}
	p, err := parsePairInfo(b)
	switch {
	case err != nil:
		if x.r.why == "" {
			x.r.why = err.Error()
		}
	case p.Failed != "" && x.r.why == "":
		x.r.why = p.Failed
	case x.r.why == "":
		if err := c.connect(p, e.o.verbs); err != nil {
			x.r.why = err.Error()
		}
	}
	if err := e.store.Set(e.setupCtx, readyKey(e.job, e.rank, c.peer), []byte(x.r.why)); err != nil {
		x.r.err = fmt.Errorf("ibverbs: publishing the state of the QPs for rank %d: %w", c.peer, err)
		return false
	}
	return true
}

// verdict reads whether the peer's side connected.
func (x *exchange) verdict(e *Endpoint) bool {
	c := x.c
	b, err := e.storeGet(readyKey(e.job, c.peer, e.rank))
	if err != nil {
		x.r.err = fmt.Errorf("ibverbs: reading the state of rank %d's QPs: %w", c.peer, err)
		return false
	}
	if x.r.why == "" && len(b) > 0 {
		x.r.why = fmt.Sprintf("on rank %d: %s", c.peer, b)
	}
	return x.r.why != "" // both sides found that RDMA failed
}

// record keeps the error the failed pair will fail with, if it cannot move
// to TCP, for SetupFailure, and publishes that this side holds it.
func (x *exchange) record(e *Endpoint) bool {
	c := x.c
	if err := e.refusal(c.peer, x.r.why); err != nil {
		e.setupFailures[c.peer].Store(&err)
	}
	if err := e.store.Set(e.setupCtx, recordedKey(e.job, e.rank, c.peer), nil); err != nil {
		x.r.err = fmt.Errorf("ibverbs: publishing the outcome for rank %d: %w", c.peer, err)
		return false
	}
	return true
}

// settle waits until the peer recorded the failure too. A pair that fails
// for good fails with the recorded error even when the peer's word cannot be
// read: the peer read this side's word, applied the failure and exited, and
// took the rendezvous with it when it served it (rank 0).
func (x *exchange) settle(e *Endpoint) bool {
	c := x.c
	if _, err := e.storeGet(recordedKey(e.job, c.peer, e.rank)); err != nil && e.SetupFailure(c.peer) == nil {
		x.r.err = fmt.Errorf("ibverbs: reading whether rank %d recorded the outcome: %w", c.peer, err)
	}
	return false
}

// SetupFailure reports why the pair with peer failed its set-up and could
// not move to TCP, once this side knows, even before the pair's owner
// applied it; nil otherwise. A rank that sees peer lost reports this as the
// cause: the peer stopped on the same failure. Safe from any goroutine.
func (e *Endpoint) SetupFailure(peer int) error {
	if peer < 0 || peer >= len(e.setupFailures) {
		return nil
	}
	if p := e.setupFailures[peer].Load(); p != nil {
		return *p
	}
	return nil
}

// storeGet reads key, asking again while the store times out and the
// endpoint is open.
func (e *Endpoint) storeGet(key string) ([]byte, error) {
	for {
		b, err := e.store.Get(e.setupCtx, key)
		if err == nil || e.setupCtx.Err() != nil || !errors.Is(err, transport.ErrTimeout) {
			return b, err
		}
		time.Sleep(storeRetry)
	}
}

// applyPending applies the set-ups that ended. The caller owns the
// endpoint.
func (e *Endpoint) applyPending() {
	for i := 0; i < len(e.pending); {
		c := e.pending[i]
		r := c.setup.Load()
		if r == nil {
			i++
			continue
		}
		e.pending = slices.Delete(e.pending, i, i+1)
		e.apply(c, r)
		c.applied.Store(true)
	}
}

func (e *Endpoint) apply(c *conn, r *setupResult) {
	switch {
	case r.err != nil:
		c.fail(r.err)
	case r.why == "":
		c.up = true
		e.list = append(e.list, c)
		e.logUp(c)
		c.postQueued()
		if c.creditOwed { // for messages taken before the outcome
			c.sendCredit()
		}
		if e.closing != nil {
			// Up while Close drains: the peer waits for this side's notice.
			c.sendNotice(*e.closing)
		}
	default:
		// RDMA failed: record ran, and kept the error if the pair may
		// not move to TCP.
		if p := e.setupFailures[c.peer].Load(); p != nil {
			c.fail(*p)
		} else {
			e.toTCP(c, downgrade(e.rank, c.peer, r.why))
		}
	}
}

// refusal is the error of a pair whose RDMA failed (why) when it may not
// move to TCP: under GCCL_STRICT=1, or with no fallback; nil when it may.
func (e *Endpoint) refusal(peer int, why string) error {
	line := downgrade(e.rank, peer, why)
	switch {
	case e.o.strict:
		return fmt.Errorf("%w: GCCL_STRICT=1 forbids a downgrade: %s", verbs.ErrNotSupported, line)
	case e.fallback == nil:
		return fmt.Errorf("ibverbs: %s, but this rank has no TCP fallback", line)
	}
	return nil
}

// downgrade is the WARN (or, under GCCL_STRICT=1, the error) of a pair
// whose RDMA failed.
func downgrade(rank, peer int, why string) string {
	return fmt.Sprintf("rank %d -> %d via TCP instead of IB (%s)", rank, peer, why)
}

func (e *Endpoint) logUp(c *conn) {
	a := e.addrs[c.peer]
	qps := "1 QP"
	if c.g.qps > 1 {
		qps = fmt.Sprintf("%d QPs", c.g.qps)
	}
	e.log.Info(fmt.Sprintf("rank %d -> %d via %s (%s, GID %d %s; peer %s GID %v; %s, MTU %v)",
		e.rank, c.peer, e.name, e.me.Fabric(), e.me.GIDIndex, e.me.GID, a.Name(), a.GID, qps,
		min(e.me.MTU.Bytes(), a.MTU.Bytes())), "subsys", "INIT")
}

// postQueued posts the messages committed before the pair was up.
func (c *conn) postQueued() {
	for seq := c.credit; seq < c.tail; seq++ {
		off := c.g.sendOff(int(seq % uint64(c.g.count)))
		n, _, _ := header(c.buf[off:])
		if !c.post(seq, n) {
			return
		}
	}
}

// toTCP hands the pair to the TCP fallback: the messages queued so far go
// there in order, and every later call goes through it. Nothing came from
// the peer over RDMA, which decided the same at the same point.
func (e *Endpoint) toTCP(c *conn, line string) {
	s, err := e.fallback.Sender(c.peer)
	var r transport.Receiver
	if err == nil {
		r, err = e.fallback.Receiver(c.peer)
	}
	if err != nil {
		c.fail(fmt.Errorf("ibverbs: %s: %w", line, err))
		return
	}
	for seq := range c.tail {
		off := c.g.sendOff(int(seq % uint64(c.g.count)))
		n, _, tag := header(c.buf[off:])
		if err := resend(s, c.buf[off+hdrSize:off+hdrSize+n], transport.Tag(tag)); err != nil {
			c.fail(fmt.Errorf("ibverbs: %s: handing over queued message %d of %d: %w", line, seq, c.tail, err))
			return
		}
	}
	c.tcpS, c.tcpR = s, r
	if err := c.release(); err != nil {
		e.log.Warn(fmt.Sprintf("ibverbs: releasing the RDMA side of the pair %d -> %d: %v", e.rank, c.peer, err), "subsys", "NET")
	}
	e.viaTCP[c.peer].Store(true)
	e.log.Warn(line, "subsys", "INIT")
}

// handOver commits, through the fallback, the message reserved in the send
// ring before the pair moved there.
func (c *conn) handOver(tag transport.Tag) {
	off := c.g.sendOff(int(c.tail%uint64(c.g.count))) + hdrSize
	if err := resend(c.tcpS, c.buf[off:off+c.n], tag); err != nil {
		c.fail(fmt.Errorf("ibverbs: rank %d -> %d via TCP: handing over the reserved message: %w", c.e.rank, c.peer, err))
	}
}

// resend sends msg through s, which has room: the fallback holds as many
// messages as the send ring.
func resend(s transport.Sender, msg []byte, tag transport.Tag) error {
	b, ok, err := s.TryReserve(len(msg))
	if err == nil && !ok {
		err = errors.New("no room")
	}
	if err != nil {
		return err
	}
	copy(b, msg)
	s.Commit(tag)
	return nil
}

// ownerSetUp is Endpoint.owner while a set-up goroutine applies outcomes.
const ownerSetUp = 3

// enterSlow waits out a set-up goroutine applying outcomes (short), and
// reports false once Close took the endpoint over.
func (e *Endpoint) enterSlow() bool {
	for {
		switch e.owner.Load() {
		case ownerClosed:
			return false
		case 0:
			if e.owner.CompareAndSwap(0, ownerBusy) {
				return true
			}
		default:
			runtime.Gosched()
		}
	}
}
