package ibverbs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gccl/gccl/internal/verbs"
	"github.com/gccl/gccl/transport"
	"github.com/gccl/gccl/transport/tcp"
)

// How long Close waits for what it posted to complete and for its peers'
// close notices, and Abort for its abort notices to go out. (Vars so that
// tests can shorten them.)
var (
	closeLinger = 2 * time.Second
	abortLinger = 200 * time.Millisecond
)

// Endpoint is a rank's RDMA attachment to its peers. Try calls, Commit,
// Release, PrepareWait and Wait belong to one goroutine at a time (the
// rank's executor); Close and Abort may come from any goroutine, even
// while that one is inside a call.
//
// The owner does all the work: its calls poll the CQ (ibv_poll_cq, no
// system call) when a ring looks empty or full, and post the WRITEs. A
// second goroutine only sleeps: when the owner is about to sleep on the
// rank's bell (PrepareWait), it arms the CQ's completion channel, and the
// waiter rings the bell at the next completion. A rank that polls is never
// woken per message.
type Endpoint struct {
	rank, size int
	slotSize   int
	name       string // "NET/IB/rxe0:1"
	bell       transport.Bell
	log        *slog.Logger

	ctx   *verbs.Context
	pd    *verbs.PD
	port  verbs.Port
	me    portAddr
	cq    *verbs.CQ
	conns []*conn // by rank, from the pair's first use; nil for self and peers served otherwise
	list  []*conn // the connections that are up
	wcs   []verbs.WC
	dirty []*conn // connections with receives to post again or a credit owed

	// Setting pairs up at their first use (pair.go).
	o        options
	store    transport.Store
	job      string
	addrs    []portAddr // by rank; Device "" for peers served otherwise
	geos     []geometry // by rank
	pending  []*conn    // set-ups whose outcome is not applied yet
	setupCtx context.Context
	endSetup context.CancelFunc
	setups   sync.WaitGroup
	closing  *error // while Close drains: the reason its notices carry

	registered atomic.Int64 // bytes registered with the device (MemStats)

	// Pairs whose RDMA connection failed, carried by TCP (connecting each
	// pair at its first use too).
	fallback *tcp.Endpoint
	viaTCP   []atomic.Bool

	// By peer: the error its pair fails with, once the set-up knows it
	// (SetupFailure).
	setupFailures []atomic.Pointer[error]

	// owner is ownerBusy while the owner is inside a call, ownerSetUp while
	// a set-up goroutine applies outcomes, ownerClosed once Close took over.
	owner   atomic.Int32
	closed  atomic.Bool
	closeMu sync.Mutex

	waiting    atomic.Bool // the CQ is armed and the waiter sleeps on it
	armFailed  atomic.Bool
	armc       chan struct{}
	waiterDone chan struct{}
}

var _ transport.Endpoint = (*Endpoint)(nil)

func (e *Endpoint) Rank() int     { return e.rank }
func (e *Endpoint) Size() int     { return e.size }
func (e *Endpoint) Name() string  { return e.name }
func (e *Endpoint) SlotSize() int { return e.slotSize }
func (e *Endpoint) Seq() uint64   { return e.bell.Seq() }

// Via names what carries traffic to peer: this endpoint's name, or TCP for
// a pair whose RDMA connection failed.
func (e *Endpoint) Via(peer int) string {
	if peer >= 0 && peer < len(e.viaTCP) && e.viaTCP[peer].Load() {
		return transport.Via(e.fallback, peer)
	}
	return e.name
}

const (
	ownerBusy   = 1
	ownerClosed = 2
)

// enter makes the caller the owner for one call, or reports false once
// Close has taken the endpoint over.
func (e *Endpoint) enter() bool {
	if e.owner.CompareAndSwap(0, ownerBusy) {
		return true
	}
	return e.enterSlow()
}

func (e *Endpoint) leave() { e.owner.Store(0) }

// conn returns the connection with peer, starting its set-up at the first
// use.
func (e *Endpoint) conn(peer int) (*conn, error) {
	if peer < 0 || peer >= e.size || peer == e.rank {
		return nil, fmt.Errorf("ibverbs: rank %d has no peer %d", e.rank, peer)
	}
	if !e.enter() {
		return nil, transport.ErrClosed
	}
	defer e.leave()
	return e.use(peer)
}

// Sender returns the sending half of the connection to peer.
func (e *Endpoint) Sender(peer int) (transport.Sender, error) {
	c, err := e.conn(peer)
	if err != nil {
		return nil, err
	}
	return (*sender)(c), nil
}

// Receiver returns the receiving half of the connection from peer.
func (e *Endpoint) Receiver(peer int) (transport.Receiver, error) {
	c, err := e.conn(peer)
	if err != nil {
		return nil, err
	}
	return (*receiver)(c), nil
}

// progress polls the CQ dry and applies what completed, then posts the
// receives consumed and the credits owed. It reports whether anything
// completed. The caller is the owner (inside enter).
func (e *Endpoint) progress() bool {
	if len(e.pending) > 0 {
		e.applyPending()
	}
	any := false
	for {
		n, err := e.cq.Poll(e.wcs)
		if err != nil {
			if !e.closed.Load() {
				for _, c := range e.list {
					c.fail(fmt.Errorf("ibverbs: polling %s: %w", e.name, err))
				}
			}
			return true
		}
		for i := range e.wcs[:n] {
			wc := &e.wcs[i]
			k, j, p := splitWRID(wc.WRID)
			if p < 0 || p >= len(e.conns) || e.conns[p] == nil || j >= e.conns[p].g.qps {
				continue // not ours: cannot happen
			}
			c := e.conns[p]
			if wc.Status != verbs.WCSuccess {
				switch k {
				case wrData:
					c.sqData[j]--
				case wrCtl:
					c.sqCtl--
				}
				c.failWC(k, wc)
				continue
			}
			c.complete(k, j, wc)
		}
		any = any || n > 0
		if n < len(e.wcs) {
			break
		}
	}
	for len(e.dirty) > 0 {
		c := e.dirty[len(e.dirty)-1]
		e.dirty = e.dirty[:len(e.dirty)-1]
		c.finish(false)
	}
	return any
}

// settle posts every receive consumed and every credit owed, before the
// owner sleeps: while it sleeps, its peers must have every slot.
func (e *Endpoint) settle() {
	for _, c := range e.list {
		c.finish(true)
	}
}

// PrepareWait readies the endpoint for its owner to sleep on the bell: it
// arms the completion channel (once per sleep; the waiter rings the bell at
// the next completion), then polls once, since a completion that came
// before the arming raises no event; if that finds one, it rings the bell
// so the sleep ends at once.
func (e *Endpoint) PrepareWait() {
	if !e.enter() {
		return // closed
	}
	if e.fallback != nil {
		e.fallback.PrepareWait()
	}
	if !e.waiting.Load() {
		if err := e.cq.Arm(); err != nil {
			e.leave()
			if !e.armFailed.Swap(true) {
				e.log.Warn("ibverbs: cannot arm the completion channel; a sleeping rank polls instead", "subsys", "NET", "err", err)
			}
			e.bell.Ring()
			return
		}
		e.waiting.Store(true)
		select {
		case e.armc <- struct{}{}:
		default:
		}
	}
	found := e.progress()
	e.settle()
	e.leave()
	if found {
		e.bell.Ring()
	}
}

// waiter sleeps on the completion channel each time PrepareWait arms it,
// and rings the bell when it fires.
func (e *Endpoint) waiter() {
	defer close(e.waiterDone)
	for range e.armc {
		err := e.cq.WaitEvent(time.Time{})
		e.waiting.Store(false)
		e.bell.Ring()
		if err != nil {
			if !e.closed.Load() {
				e.log.Warn("ibverbs: waiting on the completion channel failed", "subsys", "NET", "err", err)
			}
			return
		}
	}
}

// Wait sleeps on the rank's bell, after PrepareWait.
func (e *Endpoint) Wait(ctx context.Context, seen uint64, deadline time.Time) error {
	if e.closed.Load() {
		return transport.ErrClosed
	}
	e.PrepareWait()
	return e.bell.Wait(ctx, seen, deadline)
}

// Close tells every peer that this rank is done (they see
// transport.ErrPeerClosed once they have taken what it sent), waits a
// moment for what it posted to complete and for the peers' own notices,
// then destroys the QPs, the memory registrations, the CQ and its
// completion channel, and closes the device.
func (e *Endpoint) Close() error { return e.shut(nil) }

// Abort is Close after a failure: peers see transport.ErrPeerClosed
// carrying err's text, and it waits only briefly for that notice to leave.
func (e *Endpoint) Abort(err error) {
	if err == nil {
		err = errors.New("aborted")
	}
	e.shut(err)
}

func (e *Endpoint) shut(reason error) error {
	e.closeMu.Lock()
	defer e.closeMu.Unlock()
	if e.closed.Swap(true) {
		return nil
	}
	// A rank asleep on the bell should see ErrClosed now.
	e.bell.Ring()
	// Take the endpoint over from the owner and the set-ups: their turns
	// are short.
	for !e.owner.CompareAndSwap(0, ownerClosed) {
		runtime.Gosched()
	}
	linger := closeLinger
	if reason != nil {
		linger = abortLinger
	}
	e.closing = &reason
	for _, c := range e.list {
		c.sendNotice(reason)
	}
	e.drain(time.Now().Add(linger), reason == nil)
	// What moved to TCP, even while draining, goes out now.
	var fb error
	if e.fallback != nil {
		if reason == nil {
			fb = e.fallback.Close()
		} else {
			e.fallback.Abort(reason)
		}
	}
	err := errors.Join(fb, e.release())
	e.bell.Ring()
	return err
}

// drain polls until every connection has nothing outstanding and, when
// closing, its peer's notice came, and every pair with messages queued is
// up and has posted them; or until the deadline.
func (e *Endpoint) drain(deadline time.Time, peers bool) {
	for {
		done := true
		for _, c := range e.list {
			if c.err == nil && (!c.idle() || peers && c.peerState == peerOpen) {
				done = false
				break
			}
		}
		for _, c := range e.pending {
			if peers && c.tail > 0 {
				done = false
			}
		}
		if done || !time.Now().Before(deadline) {
			return
		}
		if !e.progress() {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// release frees every verbs object, children first, and ends the waiter.
func (e *Endpoint) release() error {
	var errs []error
	if e.endSetup != nil {
		e.endSetup() // a set-up waiting on the store gives up
		e.setups.Wait()
	}
	for _, c := range e.conns {
		if c != nil {
			errs = append(errs, c.release())
		}
	}
	var cqErr error
	if e.cq != nil {
		cqErr = e.cq.Close() // ends a WaitEvent
		errs = append(errs, cqErr)
	}
	if e.armc != nil {
		close(e.armc)
		if cqErr == nil || !e.waiting.Load() {
			<-e.waiterDone
		}
	}
	if e.pd != nil {
		errs = append(errs, e.pd.Close())
	}
	if e.ctx != nil {
		errs = append(errs, e.ctx.Close())
	}
	return errors.Join(errs...)
}
