package comm

import (
	"context"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/gccl/gccl/internal/memops"
)

// Request is an operation in flight. Operations issued async on one Comm
// complete in issue order, like work on a CUDA stream.
type Request struct {
	err      error
	c        *Comm // whose queue runs it; nil for a request done at issue
	finished atomic.Bool
	// done is made by the first Done or sleeping Wait: a request waited
	// for by the goroutine that runs it never needs one.
	mu   sync.Mutex
	done chan struct{}
}

// Done is closed when the operation completes.
func (r *Request) Done() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done == nil {
		r.done = make(chan struct{})
		if r.finished.Load() {
			close(r.done)
		}
	}
	return r.done
}

// complete publishes the outcome of a finished operation.
func (r *Request) complete(err error) {
	r.err = err
	r.mu.Lock()
	r.finished.Store(true) // under mu: Done closes what it makes after this
	if r.done != nil {
		close(r.done)
	}
	r.mu.Unlock()
}

// Err returns the operation's error once it completed, nil before.
func (r *Request) Err() error {
	if r.finished.Load() {
		return r.err
	}
	return nil
}

// Wait blocks until the operation completes and returns its error, or
// returns ctx's error if ctx ends first. Ending the wait does not cancel the
// operation: it still runs in order (abort the Comm to stop it).
//
// A Wait that finds the operation still queued, and no operation of its
// Comm running, runs the queue itself, in order, up to this operation: the
// waiting goroutine does the work instead of waking the progress goroutine
// and sleeping until it is done. Its ctx is then looked at between
// operations (each one still ends at the Comm's timeout). Where the
// progress thread is pinned (Config.ProgressCPUs), only it runs them.
func (r *Request) Wait(ctx context.Context) error {
	if r.finished.Load() {
		return r.err
	}
	if r.c != nil && r.c.async.runFor(r.c, ctx, r) {
		return r.err
	}
	select {
	case <-r.Done():
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// detach copies a call for the queue. The group is copied element by
// element so that the caller's variadic slice never escapes: a blocking
// Group that runs in place stays allocation-free. So are a variable-size
// collective's counts.
func (cl *call) detach() call {
	d := call{coll: cl.coll, barrier: cl.barrier, isGroup: cl.isGroup, in: cl.in, out: cl.out, op: cl.op, root: cl.root, seq: cl.seq, holds: cl.holds, path: cl.path}
	if cl.group != nil {
		d.group = make([]P2P, len(cl.group))
		copy(d.group, cl.group)
	}
	if cl.vkind != 0 {
		// The counts are copied too: the caller may reuse them as soon as
		// the call returns.
		d.vkind = cl.vkind
		d.sendCounts = append([]int(nil), cl.sendCounts...)
		d.recvCounts = append([]int(nil), cl.recvCounts...)
	}
	return d
}

func doneRequest(err error) *Request {
	r := &Request{}
	r.complete(err)
	return r
}

// asyncState is the Comm's queue of operations and the progress goroutine
// that runs them. Whoever runs queued operations (the progress goroutine,
// or a goroutine that waits for one of them) holds runner while it takes
// them from the queue and runs them, so they run one at a time, in issue
// order.
//
// The queue is a ring of calls with one producer (the goroutine inside the
// Comm: enter admits one) and one consumer (runner's holder): the call is
// stored in its slot, not in the Request, and the two ends meet only
// through head and tail. Why: with a channel of Requests both ends took the
// channel's lock for every operation, and each Request carried its copy of
// the call, a 320-byte heap object per async call; in a loop of async
// 8-byte all-reduces the two made about a third of the issuing and running
// goroutines' time (docs/PERFORMANCE.md, "The async queue").
type asyncState struct {
	mu      sync.Mutex // stopped, last, the ring's start, and pushes against stop
	ring    *[asyncQueueLen]queued
	head    atomic.Uint64 // the next slot to run (consumer)
	tail    atomic.Uint64 // the next slot to fill (producer)
	full    atomic.Bool   // the producer waits for half the queue to run
	space   chan struct{} // wakes it then
	kick    chan struct{} // the progress goroutine should look at the queue
	runner  sync.Mutex
	last    *Request
	stopped bool
	closed  atomic.Bool // stop was called: run what is left, then exit
	exited  chan struct{}
}

// pending is how many operations are queued or running.
func (a *asyncState) pending() int64 { return int64(a.tail.Load() - a.head.Load()) }

// queued is a slot of the ring: the call and the Request it completes.
type queued struct {
	cl call
	r  *Request
}

const asyncQueueLen = 1024

// issueAsync validates a call on the caller's goroutine (so the error of a
// bad call is immediate) and queues it.
func (c *Comm) issueAsync(cl *call) *Request {
	if err := c.enter(); err != nil {
		return doneRequest(err)
	}
	defer c.leave()
	if err := c.prepare(cl); err != nil {
		return doneRequest(err)
	}
	if err := c.holdStreams(cl); err != nil {
		return doneRequest(err)
	}
	if cl.path == pathDeviceFlags && c.async.pending() == 0 {
		// Queueing on the stream does not block: no progress goroutine.
		return doneRequest(c.run(context.Background(), cl))
	}
	r := &Request{c: c}
	if !c.async.push(c, cl, r) {
		cl.releaseStreams()
		r.complete(c.closedErr())
	}
	return r
}

// waitQueued runs a blocking call through the queue, behind earlier async
// calls, and waits for it. A context that ends first aborts the Comm, as it
// would for a call run in place.
func (c *Comm) waitQueued(ctx context.Context, cl *call) error {
	r := &Request{}
	if !c.async.push(c, cl, r) {
		cl.releaseStreams()
		return c.closedErr()
	}
	if c.async.runFor(c, ctx, r) {
		return r.err
	}
	select {
	case <-r.Done():
		return r.err
	case <-ctx.Done():
		c.fail(ctx.Err())
		<-r.Done()
		return &OpError{Op: cl.name(), Rank: c.rank, Seq: cl.seq, Peer: -1, Err: ctx.Err()}
	}
}

// push queues cl (detached) for r, waiting for a free slot if the queue is
// full. Only the goroutine inside the Comm calls it; mu keeps stop out
// while it stores, so that nothing is queued after the progress goroutine
// ran what was left.
func (a *asyncState) push(c *Comm, cl *call, r *Request) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		return false
	}
	if a.ring == nil {
		a.ring = new([asyncQueueLen]queued)
		// Its 80 pages' first touches here, not one every 12 operations
		// of the first lap ("First touches" in docs/PERFORMANCE.md). The
		// ring is all zero and no one else sees it yet: the prefault's
		// writes of zero bypass no write barrier that matters.
		_ = memops.Prefault(unsafe.Slice((*byte)(unsafe.Pointer(a.ring)), unsafe.Sizeof(*a.ring)), true)
		a.space = make(chan struct{}, 1)
		a.kick = make(chan struct{}, 1)
		a.exited = make(chan struct{})
		go a.progress(c)
	}
	t := a.tail.Load()
	for t-a.head.Load() == asyncQueueLen {
		a.mu.Unlock()
		a.waitSpace(t)
		a.mu.Lock()
		if a.stopped {
			return false
		}
	}
	q := &a.ring[t%asyncQueueLen]
	q.cl, q.r = cl.detach(), r
	a.last = r
	a.tail.Store(t + 1)
	a.nudge()
	return true
}

// waitSpace sleeps until the consumer has run half of a full queue: woken
// for every freed slot, the producer would trade a wake-up and a sleep
// with the consumer for every operation.
func (a *asyncState) waitSpace(t uint64) {
	a.full.Store(true)
	if t-a.head.Load() > asyncQueueLen/2 { // after the flag: slots freed before it was set are seen here
		<-a.space
	}
	a.full.Store(false)
}

// nudge wakes the progress goroutine if it sleeps.
func (a *asyncState) nudge() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// runFor runs the queue on a waiter's goroutine up to r (see
// Request.Wait), unless the progress thread is pinned, and reports whether
// r is finished.
func (a *asyncState) runFor(c *Comm, ctx context.Context, r *Request) bool {
	if len(c.progressCPUs) == 0 && ctx.Err() == nil {
		a.runQueued(c, ctx, r)
	}
	return r.finished.Load()
}

// runQueued runs queued operations in order on the caller's goroutine,
// until until (nil: the queue) is done or ctx ends, unless another
// goroutine runs them already.
func (a *asyncState) runQueued(c *Comm, ctx context.Context, until *Request) {
	if !a.runner.TryLock() {
		return
	}
	defer a.release()
	for ctx.Err() == nil && (until == nil || !until.finished.Load()) {
		if !a.runNext(c) {
			return
		}
	}
}

// runNext runs the operation at the head of the queue, if there is one
// (the caller holds runner). Its slot is freed only after it ran: the
// call is run in place.
func (a *asyncState) runNext(c *Comm) bool {
	h := a.head.Load()
	if h == a.tail.Load() {
		return false
	}
	q := &a.ring[h%asyncQueueLen]
	err := c.run(context.Background(), &q.cl)
	r := q.r
	*q = queued{} // the call's buffers and the Request are the caller's again
	a.head.Store(h + 1)
	if a.full.Load() && a.tail.Load()-(h+1) <= asyncQueueLen/2 {
		select {
		case a.space <- struct{}{}:
		default:
		}
	}
	r.complete(err)
	return true
}

// release lets go of the queue, and wakes the progress goroutine if
// operations are left: it may have found the queue taken and gone back to
// sleep.
func (a *asyncState) release() {
	a.runner.Unlock()
	if a.head.Load() != a.tail.Load() {
		a.nudge()
	}
}

func (a *asyncState) progress(c *Comm) {
	defer close(a.exited)
	if len(c.progressCPUs) > 0 {
		if err := pinThread(c.progressCPUs); err != nil {
			c.log.Warn("cannot pin the progress thread", "subsys", "INIT", "cpus", c.progressCPUs, "err", err)
		}
	}
	bg := context.Background()
	for range a.kick {
		a.runQueued(c, bg, nil)
		if a.closed.Load() {
			// stop was called: no more pushes. Run what is left (after
			// any helper that still runs one), then exit.
			a.runner.Lock()
			for a.runNext(c) {
			}
			a.runner.Unlock()
			return
		}
	}
}

// drain waits until every queued operation has completed.
func (a *asyncState) drain() {
	a.mu.Lock()
	last := a.last
	a.mu.Unlock()
	if last != nil {
		<-last.Done()
	}
}

// stop ends the progress goroutine once the queue is empty; queued
// operations of an aborted Comm fail at once.
func (a *asyncState) stop(c *Comm) {
	a.mu.Lock()
	if a.stopped {
		a.mu.Unlock()
		return
	}
	a.stopped = true
	started, exited := a.ring != nil, a.exited
	a.mu.Unlock()
	if started {
		a.closed.Store(true)
		a.nudge()
		<-exited
	}
}
