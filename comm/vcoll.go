package comm

import (
	"context"

	"github.com/gccl/gccl/transport"
)

// The variable-size collectives: AllToAllV and AllGatherV, as MPI's
// MPI_Alltoallv and MPI_Allgatherv, Gloo's alltoallv and allgatherv, and
// PyTorch's all_to_all_single with split sizes. Each block has its own
// count, and the blocks lie back to back in rank order (PyTorch's split
// sizes; there are no displacements).
//
// They run as one group of sends and receives (Group): every rank sends
// its block to each peer and receives each peer's block at once, and its
// own block is a local copy. Unlike a Group, they are collectives: numbered
// with the others, so that a call one rank refuses for bad arguments is
// seen by its peers' next call as a mismatch; and every pair of ranks
// exchanges one message each way even for an empty block, each tagged with
// the operation, its number, the block's count and the data type, so that
// a rank expecting another count from a peer than the peer sends fails
// with ErrMismatch at once.

// AllToAllV sends block p of send (sendCounts[p] elements, the blocks back
// to back in rank order) to rank p, and receives rank p's block for this
// rank into block p of recv (recvCounts[p] elements, likewise). Each rank's
// counts must add up to its buffer's length, and sendCounts[p] on rank r
// must equal recvCounts[r] on rank p: a rank that expects another count
// than its peer sends gets ErrMismatch. Counts may be zero. send may equal
// recv (in place, the same slice; the blocks sent are staged first) but
// must not otherwise overlap it. The counts are only read during the call.
func AllToAllV[T Scalar](ctx context.Context, c *Comm, send []T, sendCounts []int, recv []T, recvCounts []int) error {
	return c.issue(ctx, &call{vkind: tagAllToAllV, in: viewOf(send), out: viewOf(recv), sendCounts: sendCounts, recvCounts: recvCounts})
}

// AllToAllVAsync is the async form of AllToAllV. The counts are read (and
// checked) before it returns, so the caller may reuse them at once; the
// buffers must stay untouched until the Request completes.
func AllToAllVAsync[T Scalar](c *Comm, send []T, sendCounts []int, recv []T, recvCounts []int) *Request {
	return c.issueAsync(&call{vkind: tagAllToAllV, in: viewOf(send), out: viewOf(recv), sendCounts: sendCounts, recvCounts: recvCounts})
}

// AllToAllV is the Buffer form of the generic AllToAllV. Device buffers
// move through host staging of the whole buffers (like an in-place
// AllToAll of device buffers); passing the same DeviceBuffer as send and
// recv is in place.
func (c *Comm) AllToAllV(ctx context.Context, send Buffer, sendCounts []int, recv Buffer, recvCounts []int) error {
	var cl call
	if err := vBuffersCall(&cl, tagAllToAllV, send, sendCounts, recv, recvCounts); err != nil {
		return c.rejected("AllToAllV", err)
	}
	return c.issue(ctx, &cl)
}

// AllToAllVAsync is the Buffer form of the generic AllToAllVAsync.
func (c *Comm) AllToAllVAsync(send Buffer, sendCounts []int, recv Buffer, recvCounts []int) *Request {
	cl := new(call)
	if err := vBuffersCall(cl, tagAllToAllV, send, sendCounts, recv, recvCounts); err != nil {
		return doneRequest(c.rejected("AllToAllV", err))
	}
	return c.issueAsync(cl)
}

// AllGatherV gathers every rank's send into recv on every rank: block p of
// recv (recvCounts[p] elements, the blocks back to back in rank order)
// receives rank p's send. Every rank passes the same recvCounts, which add
// up to len(recv); this rank's send holds recvCounts[Rank()] elements. A
// rank whose counts disagree with a peer's gets ErrMismatch. Counts may be
// zero. send may be this rank's block of recv itself (in place) but must
// not otherwise overlap it. The counts are only read during the call.
func AllGatherV[T Scalar](ctx context.Context, c *Comm, send, recv []T, recvCounts []int) error {
	return c.issue(ctx, &call{vkind: tagAllGatherV, in: viewOf(send), out: viewOf(recv), recvCounts: recvCounts})
}

// AllGatherVAsync is the async form of AllGatherV. The counts are read
// (and checked) before it returns, so the caller may reuse them at once;
// the buffers must stay untouched until the Request completes.
func AllGatherVAsync[T Scalar](c *Comm, send, recv []T, recvCounts []int) *Request {
	return c.issueAsync(&call{vkind: tagAllGatherV, in: viewOf(send), out: viewOf(recv), recvCounts: recvCounts})
}

// AllGatherV is the Buffer form of the generic AllGatherV. Device buffers
// move through host staging of the whole buffers.
func (c *Comm) AllGatherV(ctx context.Context, send, recv Buffer, recvCounts []int) error {
	var cl call
	if err := vBuffersCall(&cl, tagAllGatherV, send, nil, recv, recvCounts); err != nil {
		return c.rejected("AllGatherV", err)
	}
	return c.issue(ctx, &cl)
}

// AllGatherVAsync is the Buffer form of the generic AllGatherVAsync.
func (c *Comm) AllGatherVAsync(send, recv Buffer, recvCounts []int) *Request {
	cl := new(call)
	if err := vBuffersCall(cl, tagAllGatherV, send, nil, recv, recvCounts); err != nil {
		return doneRequest(c.rejected("AllGatherV", err))
	}
	return c.issueAsync(cl)
}

// vBuffersCall makes the call of a Buffer form of a variable-size
// collective in cl, as buffersCall does for the others.
func vBuffersCall(cl *call, kind uint8, send Buffer, sendCounts []int, recv Buffer, recvCounts []int) error {
	if err := buffersCall(cl, 0, send, recv, Op{}, 0); err != nil {
		return err
	}
	cl.vkind, cl.sendCounts, cl.recvCounts = kind, sendCounts, recvCounts
	return nil
}

// validateV checks a variable-size collective's arguments on this rank.
// That each count matches the peer's happens as data arrives.
func (c *Comm) validateV(cl *call) error {
	n, r := c.size, c.rank
	in, out := cl.in, cl.out
	if !in.ok {
		return invalid("send buffer is nil")
	}
	if !out.ok {
		return invalid("receive buffer is nil")
	}
	if in.dt != out.dt {
		return invalid("send buffer holds %v but receive buffer holds %v", in.dt, out.dt)
	}
	dt := in.dt
	if !dt.Valid() {
		return invalid("unknown data type %v", dt)
	}
	esz := dt.Size()
	if len(in.b)%esz != 0 || len(out.b)%esz != 0 {
		return invalid("buffer length is not a multiple of the %v element size", dt)
	}
	ni, no := len(in.b)/esz, len(out.b)/esz
	if err := checkCounts("receive", cl.recvCounts, n, no); err != nil {
		return err
	}
	if cl.vkind == tagAllToAllV {
		if err := checkCounts("send", cl.sendCounts, n, ni); err != nil {
			return err
		}
		if cl.sendCounts[r] != cl.recvCounts[r] {
			return invalid("rank %d sends itself %d elements but receives %d from itself", r, cl.sendCounts[r], cl.recvCounts[r])
		}
		return sameOrDisjoint(in.b, out.b)
	}
	if ni != cl.recvCounts[r] {
		return invalid("send has %d elements but recvCounts[%d], this rank's block, is %d", ni, r, cl.recvCounts[r])
	}
	if own := out.b[displacement(cl.recvCounts, r)*esz:]; sameMem(own, in.b) {
		return nil // in place
	}
	if overlap(out.b, in.b) {
		return invalid("send and receive buffers overlap, and the send buffer is not this rank's block of the receive buffer")
	}
	return nil
}

// checkCounts checks that counts has a count for each of n ranks, none
// negative, adding up to total.
func checkCounts(what string, counts []int, n, total int) error {
	if len(counts) != n {
		return invalid("%d %s counts for %d ranks", len(counts), what, n)
	}
	sum := 0
	for p, k := range counts {
		if k < 0 {
			return invalid("%s count for rank %d is negative (%d)", what, p, k)
		}
		if k > total-sum { // no overflow: sum <= total
			return invalid("%s counts add up to more than the %s buffer's %d elements", what, what, total)
		}
		sum += k
	}
	if sum != total {
		return invalid("%s counts add up to %d but the %s buffer holds %d elements", what, sum, what, total)
	}
	return nil
}

// displacement is where block p starts, in elements.
func displacement(counts []int, p int) int {
	d := 0
	for _, k := range counts[:p] {
		d += k
	}
	return d
}

// runV runs a validated variable-size collective on host memory (device
// buffers were staged by runHeld) as one group of sends and receives.
func (c *Comm) runV(ctx context.Context, cl *call) error {
	n, r := c.size, c.rank
	dt := cl.dtype()
	esz := dt.Size()
	if cap(c.vOps) < 2*n {
		c.vOps = make([]P2P, 2*n)
	}
	base := transport.MakeTag(cl.vkind, cl.seq)
	bits := uint16(dt) & 0xf
	in, out := cl.in.b, cl.out.b
	var ops []P2P
	// The ops go in order of distance, the k-th send to rank r+k and the
	// k-th receive from rank r-k, so that ranks do not all start with the
	// same peer.
	if cl.vkind == tagAllToAllV {
		ops = c.vOps[:2*n]
		soff, roff := 0, 0
		for p := range n {
			sb := in[soff : soff+cl.sendCounts[p]*esz]
			rb := out[roff : roff+cl.recvCounts[p]*esz]
			soff, roff = soff+len(sb), roff+len(rb)
			ops[2*((p-r+n)%n)] = vOp(p, false, dt, sb, base, cl.sendCounts[p], bits)
			ops[2*((r-p+n)%n)+1] = vOp(p, true, dt, rb, base, cl.recvCounts[p], bits)
		}
		// The pair at distance 0 is the send to self and the receive from
		// self: runGroup copies it (after staging the sends if in place).
	} else {
		ops = c.vOps[:2*(n-1)]
		roff := 0
		for p := range n {
			rb := out[roff : roff+cl.recvCounts[p]*esz]
			roff += len(rb)
			if p == r {
				if !sameMem(rb, in) {
					copy(rb, in)
				}
				continue
			}
			ops[2*((p-r+n)%n-1)] = vOp(p, false, dt, in, base, len(in)/esz, bits)
			ops[2*((r-p+n)%n-1)+1] = vOp(p, true, dt, rb, base, cl.recvCounts[p], bits)
		}
	}
	err := c.runGroup(ctx, cl.name(), base, ops, false, false)
	clear(ops) // the caller's buffers are not kept alive
	return err
}

// vOp is one send or receive of a variable-size collective: its tag checks
// the block's count and the data type.
func vOp(peer int, recv bool, dt DataType, b []byte, base transport.Tag, count int, bits uint16) P2P {
	return P2P{peer: peer, recv: recv, v: view{dt: dt, b: b, ok: true},
		tag: base.WithCheck(transport.ArgCheck(uint64(count), bits))}
}
