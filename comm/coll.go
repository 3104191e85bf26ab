package comm

import (
	"context"
	"fmt"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/internal/reduce"
	"github.com/gccl/gccl/transport"
)

// call is one operation as issued: what to run, on which buffers.
type call struct {
	// The byte-sized fields first, together: an async call copies the
	// whole struct into its Request, a heap object per call.
	coll    algo.Collective
	barrier bool
	isGroup bool
	path    path // how it runs (path.go), set by prepare
	// A variable-size collective (vcoll.go): its tag kind, and its counts
	// (the caller's until the call is detached for the queue).
	vkind                  uint8
	sendCounts, recvCounts []int
	group                  []P2P
	in, out                view
	op                     Op
	root                   int
	seq                    uint64
	holds                  streamHolds // the streams the call holds (streams.go)
}

func (cl *call) name() string {
	switch {
	case cl.barrier:
		return "Barrier"
	case cl.isGroup:
		return "Group"
	case cl.vkind != 0:
		return tagKindName(cl.vkind)
	}
	return cl.coll.String()
}

// The collectives. Each has four forms: a method on Buffers and a generic
// function on typed host slices, each blocking or async. Blocking forms take
// a context: its cancellation or deadline ends the call and aborts the Comm.
// Async forms return a Request at once; the buffers must stay untouched until
// it completes.

// AllReduce reduces send across all ranks with op and leaves the result in
// recv on every rank. send and recv have equal length; they may be the same
// slice (in place) but must not otherwise overlap.
func AllReduce[T Scalar](ctx context.Context, c *Comm, send, recv []T, op Op) error {
	return c.issue(ctx, &call{coll: algo.AllReduce, in: viewOf(send), out: viewOf(recv), op: op})
}

// AllReduceAsync is the async form of AllReduce.
func AllReduceAsync[T Scalar](c *Comm, send, recv []T, op Op) *Request {
	return c.issueAsync(&call{coll: algo.AllReduce, in: viewOf(send), out: viewOf(recv), op: op})
}

// AllReduce is the Buffer form of the generic AllReduce.
func (c *Comm) AllReduce(ctx context.Context, send, recv Buffer, op Op) error {
	return c.issueBuffers(ctx, algo.AllReduce, send, recv, op, 0)
}

// AllReduceAsync is the Buffer form of the generic AllReduceAsync.
func (c *Comm) AllReduceAsync(send, recv Buffer, op Op) *Request {
	return c.issueBuffersAsync(algo.AllReduce, send, recv, op, 0)
}

// ReduceScatter reduces send (Size() blocks of len(recv) elements) across
// ranks with op; rank r receives block r of the result in recv. recv may be
// block r of send itself (in place).
func ReduceScatter[T Scalar](ctx context.Context, c *Comm, send, recv []T, op Op) error {
	return c.issue(ctx, &call{coll: algo.ReduceScatter, in: viewOf(send), out: viewOf(recv), op: op})
}

// ReduceScatterAsync is the async form of ReduceScatter.
func ReduceScatterAsync[T Scalar](c *Comm, send, recv []T, op Op) *Request {
	return c.issueAsync(&call{coll: algo.ReduceScatter, in: viewOf(send), out: viewOf(recv), op: op})
}

// ReduceScatter is the Buffer form of the generic ReduceScatter.
func (c *Comm) ReduceScatter(ctx context.Context, send, recv Buffer, op Op) error {
	return c.issueBuffers(ctx, algo.ReduceScatter, send, recv, op, 0)
}

// ReduceScatterAsync is the Buffer form of the generic ReduceScatterAsync.
func (c *Comm) ReduceScatterAsync(send, recv Buffer, op Op) *Request {
	return c.issueBuffersAsync(algo.ReduceScatter, send, recv, op, 0)
}

// AllGather gathers every rank's send into recv (Size() blocks of len(send)
// elements, block r from rank r) on every rank. send may be block r of recv
// itself (in place).
func AllGather[T Scalar](ctx context.Context, c *Comm, send, recv []T) error {
	return c.issue(ctx, &call{coll: algo.AllGather, in: viewOf(send), out: viewOf(recv)})
}

// AllGatherAsync is the async form of AllGather.
func AllGatherAsync[T Scalar](c *Comm, send, recv []T) *Request {
	return c.issueAsync(&call{coll: algo.AllGather, in: viewOf(send), out: viewOf(recv)})
}

// AllGather is the Buffer form of the generic AllGather.
func (c *Comm) AllGather(ctx context.Context, send, recv Buffer) error {
	return c.issueBuffers(ctx, algo.AllGather, send, recv, Op{}, 0)
}

// AllGatherAsync is the Buffer form of the generic AllGatherAsync.
func (c *Comm) AllGatherAsync(send, recv Buffer) *Request {
	return c.issueBuffersAsync(algo.AllGather, send, recv, Op{}, 0)
}

// Broadcast copies root's send into recv on every rank. send is read only at
// the root and may be nil elsewhere; it may equal recv (in place).
func Broadcast[T Scalar](ctx context.Context, c *Comm, send, recv []T, root int) error {
	return c.issue(ctx, &call{coll: algo.Broadcast, in: viewOf(send), out: viewOf(recv), root: root})
}

// BroadcastAsync is the async form of Broadcast.
func BroadcastAsync[T Scalar](c *Comm, send, recv []T, root int) *Request {
	return c.issueAsync(&call{coll: algo.Broadcast, in: viewOf(send), out: viewOf(recv), root: root})
}

// Broadcast is the Buffer form of the generic Broadcast.
func (c *Comm) Broadcast(ctx context.Context, send, recv Buffer, root int) error {
	return c.issueBuffers(ctx, algo.Broadcast, send, recv, Op{}, root)
}

// BroadcastAsync is the Buffer form of the generic BroadcastAsync.
func (c *Comm) BroadcastAsync(send, recv Buffer, root int) *Request {
	return c.issueBuffersAsync(algo.Broadcast, send, recv, Op{}, root)
}

// Reduce reduces send across ranks with op into recv at root. recv is
// written only at the root and may be nil elsewhere; it may equal send.
func Reduce[T Scalar](ctx context.Context, c *Comm, send, recv []T, op Op, root int) error {
	return c.issue(ctx, &call{coll: algo.Reduce, in: viewOf(send), out: viewOf(recv), op: op, root: root})
}

// ReduceAsync is the async form of Reduce.
func ReduceAsync[T Scalar](c *Comm, send, recv []T, op Op, root int) *Request {
	return c.issueAsync(&call{coll: algo.Reduce, in: viewOf(send), out: viewOf(recv), op: op, root: root})
}

// Reduce is the Buffer form of the generic Reduce.
func (c *Comm) Reduce(ctx context.Context, send, recv Buffer, op Op, root int) error {
	return c.issueBuffers(ctx, algo.Reduce, send, recv, op, root)
}

// ReduceAsync is the Buffer form of the generic ReduceAsync.
func (c *Comm) ReduceAsync(send, recv Buffer, op Op, root int) *Request {
	return c.issueBuffersAsync(algo.Reduce, send, recv, op, root)
}

// AllToAll sends block p of send (Size() equal blocks) to rank p, which
// stores it as block r of its recv, r being the sender. send may equal recv
// (in place, staged through a scratch buffer).
func AllToAll[T Scalar](ctx context.Context, c *Comm, send, recv []T) error {
	return c.issue(ctx, &call{coll: algo.AllToAll, in: viewOf(send), out: viewOf(recv)})
}

// AllToAllAsync is the async form of AllToAll.
func AllToAllAsync[T Scalar](c *Comm, send, recv []T) *Request {
	return c.issueAsync(&call{coll: algo.AllToAll, in: viewOf(send), out: viewOf(recv)})
}

// AllToAll is the Buffer form of the generic AllToAll.
func (c *Comm) AllToAll(ctx context.Context, send, recv Buffer) error {
	return c.issueBuffers(ctx, algo.AllToAll, send, recv, Op{}, 0)
}

// AllToAllAsync is the Buffer form of the generic AllToAllAsync.
func (c *Comm) AllToAllAsync(send, recv Buffer) *Request {
	return c.issueBuffersAsync(algo.AllToAll, send, recv, Op{}, 0)
}

// Gather collects every rank's send into recv at root (Size() blocks of
// len(send), block r from rank r). recv is used only at the root; the root's
// send may be its own block of recv (in place).
func Gather[T Scalar](ctx context.Context, c *Comm, send, recv []T, root int) error {
	return c.issue(ctx, &call{coll: algo.Gather, in: viewOf(send), out: viewOf(recv), root: root})
}

// GatherAsync is the async form of Gather.
func GatherAsync[T Scalar](c *Comm, send, recv []T, root int) *Request {
	return c.issueAsync(&call{coll: algo.Gather, in: viewOf(send), out: viewOf(recv), root: root})
}

// Gather is the Buffer form of the generic Gather.
func (c *Comm) Gather(ctx context.Context, send, recv Buffer, root int) error {
	return c.issueBuffers(ctx, algo.Gather, send, recv, Op{}, root)
}

// GatherAsync is the Buffer form of the generic GatherAsync.
func (c *Comm) GatherAsync(send, recv Buffer, root int) *Request {
	return c.issueBuffersAsync(algo.Gather, send, recv, Op{}, root)
}

// Scatter sends block r of root's send (Size() blocks of len(recv)) to rank
// r's recv. send is used only at the root; the root's recv may be its own
// block of send (in place).
func Scatter[T Scalar](ctx context.Context, c *Comm, send, recv []T, root int) error {
	return c.issue(ctx, &call{coll: algo.Scatter, in: viewOf(send), out: viewOf(recv), root: root})
}

// ScatterAsync is the async form of Scatter.
func ScatterAsync[T Scalar](c *Comm, send, recv []T, root int) *Request {
	return c.issueAsync(&call{coll: algo.Scatter, in: viewOf(send), out: viewOf(recv), root: root})
}

// Scatter is the Buffer form of the generic Scatter.
func (c *Comm) Scatter(ctx context.Context, send, recv Buffer, root int) error {
	return c.issueBuffers(ctx, algo.Scatter, send, recv, Op{}, root)
}

// ScatterAsync is the Buffer form of the generic ScatterAsync.
func (c *Comm) ScatterAsync(send, recv Buffer, root int) *Request {
	return c.issueBuffersAsync(algo.Scatter, send, recv, Op{}, root)
}

// Barrier returns once every rank has entered it.
func (c *Comm) Barrier(ctx context.Context) error {
	return c.issue(ctx, &call{barrier: true})
}

// BarrierAsync is the async form of Barrier.
func (c *Comm) BarrierAsync() *Request { return c.issueAsync(&call{barrier: true}) }

// buffersCall makes the call of a Buffer form of a collective in cl, the
// caller's: a blocking call keeps it on its stack, allocating nothing.
func buffersCall(cl *call, coll algo.Collective, send, recv Buffer, op Op, root int) error {
	in, err := viewOfBuffer(send)
	if err != nil {
		return err
	}
	out, err := viewOfBuffer(recv)
	if err != nil {
		return err
	}
	if in.dev != nil && recv == send {
		out = in // one device buffer as both: in place, one staging
	}
	*cl = call{coll: coll, in: in, out: out, op: op, root: root}
	return nil
}

func (c *Comm) issueBuffers(ctx context.Context, coll algo.Collective, send, recv Buffer, op Op, root int) error {
	var cl call
	if err := buffersCall(&cl, coll, send, recv, op, root); err != nil {
		return c.rejected(coll.String(), err)
	}
	return c.issue(ctx, &cl)
}

func (c *Comm) issueBuffersAsync(coll algo.Collective, send, recv Buffer, op Op, root int) *Request {
	cl := new(call)
	if err := buffersCall(cl, coll, send, recv, op, root); err != nil {
		return doneRequest(c.rejected(coll.String(), err))
	}
	return c.issueAsync(cl)
}

// rejected numbers a call that failed before it was issued, so that its
// peers, which did issue it, see a mismatch on the next call instead of
// silently pairing it with a different one.
func (c *Comm) rejected(op string, err error) error {
	c.collSeq++
	return &OpError{Op: op, Rank: c.rank, Seq: c.collSeq, Peer: -1, Err: err}
}

// issue runs a blocking call on the caller's goroutine.
func (c *Comm) issue(ctx context.Context, cl *call) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	if err := c.prepare(cl); err != nil {
		return err
	}
	if err := c.holdStreams(cl); err != nil {
		return err
	}
	if c.async.pending() > 0 {
		// Earlier async calls still run: keep issue order by queueing.
		return c.waitQueued(ctx, cl)
	}
	return c.run(ctx, cl)
}

// prepare numbers and validates a call.
func (c *Comm) prepare(cl *call) error {
	if cl.isGroup {
		cl.path = pathGroup
		return c.prepareGroup(cl.group)
	}
	c.collSeq++
	cl.seq = c.collSeq
	if err := c.validate(cl); err != nil {
		return &OpError{Op: cl.name(), Rank: c.rank, Seq: cl.seq, Peer: -1, Err: err}
	}
	cl.path = c.classify(cl)
	return nil
}

// run executes a prepared call, and then releases the streams it holds.
func (c *Comm) run(ctx context.Context, cl *call) error {
	if cl.holds.n == 0 {
		return c.runHeld(ctx, cl)
	}
	err := cl.streamsReady()
	if err != nil {
		err = &OpError{Op: cl.name(), Rank: c.rank, Seq: cl.seq, Peer: -1, Err: fmt.Errorf("waiting for the work queued on the buffers' streams: %w", err)}
		c.fail(err)
	} else {
		err = c.runHeld(ctx, cl)
	}
	cl.releaseStreams()
	return err
}

func (c *Comm) runCollective(ctx context.Context, cl *call) error {
	kind := uint8(cl.coll)
	if cl.barrier {
		kind = tagBarrier
		cl.coll = algo.AllReduce
		cl.in = view{dt: Uint8, b: c.barrier[:1], ok: true}
		cl.out = cl.in
		cl.op = Max
	}
	a := &c.args
	*a = collArgs{esz: cl.dtype().Size()}
	a.in, a.out = cl.in.b, cl.out.b
	n := c.size
	switch cl.coll {
	case algo.AllReduce:
		a.count, a.split, a.inAll, a.outAll = len(a.out)/a.esz, true, true, true
	case algo.Broadcast:
		a.count, a.split, a.inAll, a.outAll = len(a.out)/a.esz, true, true, true
	case algo.Reduce:
		a.count, a.split, a.inAll, a.outAll = len(a.in)/a.esz, true, true, true
	case algo.ReduceScatter:
		a.count, a.inAll = len(a.out)/a.esz, true
	case algo.AllGather:
		a.count, a.outAll = len(a.in)/a.esz, true
	case algo.AllToAll:
		a.count, a.inAll, a.outAll = len(a.in)/a.esz/n, true, true
		if sameMem(a.in, a.out) {
			// In place: stage the input so blocks can be overwritten
			// before they are sent.
			if cap(c.scratch) < len(a.in) {
				c.scratch = make([]byte, len(a.in))
			}
			a.in = c.scratch[:len(a.in)]
			copy(a.in, a.out)
		}
	case algo.Gather:
		a.count, a.outAll = len(a.in)/a.esz, true
	case algo.Scatter:
		a.count, a.inAll = len(a.out)/a.esz, true
	}
	if cl.coll.Reducing() {
		c.setOp(a, cl)
	}
	if cl.path == pathSymmetric {
		return c.runSym(ctx, a, cl)
	}
	a.plan = c.plan(cl.coll, cl.root, a.count*a.esz, a.premul)
	if a.plan.Unscaled && a.premul {
		return fmt.Errorf("gccl: internal error: plan %v %v reads inputs twice but %v pre-scales them", a.plan.Coll, a.plan.Algo, cl.op)
	}
	x := &c.exec
	tag := transport.MakeTag(kind, cl.seq).WithCheck(transport.ArgCheck(uint64(a.count), cl.argBits()))
	x.begin(ctx, cl.name(), cl.seq, tag)
	return x.runPlan(a)
}

// setOp resolves the kernels for a reducing call.
func (c *Comm) setOp(a *collArgs, cl *call) {
	dt := cl.dtype()
	kop := reduce.Sum
	switch cl.op.Kind {
	case OpProd:
		kop = reduce.Prod
	case OpMin:
		kop = reduce.Min
	case OpMax:
		kop = reduce.Max
	case OpAvg:
		if dt.IsFloat() {
			a.premul, a.s = true, 1/float64(c.size)
		} else {
			a.post = true
		}
	case OpPreMulSum:
		a.premul, a.s = true, cl.op.Scalar
	}
	a.red = reduce.Lookup(dt, kop)
	if a.premul {
		a.scale, a.axpy = reduce.Scale(dt), reduce.Axpy(dt)
	}
	if a.post {
		a.div = reduce.Div(dt)
	}
}

// argBits packs the arguments besides the count that every rank of a
// collective must pass alike, for the check in its messages' tags: the
// type, the op of a reduction, the root (modulo 512) of a rooted one.
func (cl *call) argBits() uint16 {
	b := uint16(cl.dtype()) & 0xf
	if cl.coll.Reducing() {
		b |= uint16(cl.op.Kind&0x7) << 4
	}
	if cl.coll.Rooted() {
		b |= uint16(cl.root&0x1ff) << 7
	}
	return b
}

func (cl *call) dtype() DataType {
	if cl.barrier {
		return Uint8
	}
	if cl.out.ok {
		return cl.out.dt
	}
	return cl.in.dt
}
