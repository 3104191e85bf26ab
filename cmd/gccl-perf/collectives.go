package main

import (
	"context"

	"github.com/gccl/gccl/comm"
)

// collKind names the operation a benchmark runs.
type collKind int

const (
	kindAllReduce collKind = iota
	kindAllGather
	kindReduceScatter
	kindBroadcast
	kindReduce
	kindAllToAll
	kindGather
	kindScatter
	kindSendRecv
)

// collective is one benchmark: how nccl-tests sizes its buffers, which
// columns apply, and how its bandwidth is scored.
type collective struct {
	name     string
	kind     collKind
	reducing bool // takes a reduction op (the redop column; "none" otherwise)
	rooted   bool // takes a root (the root column; -1 otherwise)
	// perRankCount: the count column is one rank's block of count/n elements
	// and the algorithm bandwidth counts all n blocks.
	perRankCount bool
	// rootOnlyOutput: only the root's receive buffer is defined afterwards,
	// so only the root checks it (as nccl-tests does for reduce and gather).
	rootOnlyOutput bool
}

// collectives lists the benchmarks in the order nccl-tests documents them.
var collectives = []*collective{
	{name: "all_reduce", kind: kindAllReduce, reducing: true},
	{name: "all_gather", kind: kindAllGather, perRankCount: true},
	{name: "reduce_scatter", kind: kindReduceScatter, reducing: true, perRankCount: true},
	{name: "broadcast", kind: kindBroadcast, rooted: true},
	{name: "reduce", kind: kindReduce, reducing: true, rooted: true, rootOnlyOutput: true},
	{name: "alltoall", kind: kindAllToAll, perRankCount: true},
	{name: "gather", kind: kindGather, rooted: true, perRankCount: true, rootOnlyOutput: true},
	{name: "scatter", kind: kindScatter, rooted: true, perRankCount: true},
	{name: "sendrecv", kind: kindSendRecv},
}

// layout is how one rank's buffers are cut for a given element count, the
// counts of nccl-tests' getCollByteCount for the same test.
type layout struct {
	sendCount, recvCount int // elements the collective reads and writes
	paramCount           int // the count argument: the table's count column
	// In place, send and receive are views of one buffer starting at these
	// offsets (in elements) times the rank: all-gather and gather send from
	// their own block of the output, reduce-scatter and scatter receive into
	// their own block of the input.
	sendInPlaceOffset, recvInPlaceOffset int
}

// layoutFor returns the buffer layout for count elements (the size divided
// by the element size) on n ranks. Tests that split data across ranks round
// count down to a multiple of n, so the size column can be smaller than the
// size asked for, exactly as in nccl-tests:
//
//	all_reduce, broadcast, reduce, sendrecv: send = recv = count
//	all_gather, gather:     send = count/n,     recv = (count/n)*n, param count/n
//	reduce_scatter, scatter: send = (count/n)*n, recv = count/n,    param count/n
//	alltoall:                send = recv = (count/n)*n,             param count/n
func (t *collective) layoutFor(count, n int) layout {
	block := count / n
	switch t.kind {
	case kindAllGather, kindGather:
		return layout{sendCount: block, recvCount: block * n, paramCount: block, sendInPlaceOffset: block}
	case kindReduceScatter, kindScatter:
		return layout{sendCount: block * n, recvCount: block, paramCount: block, recvInPlaceOffset: block}
	case kindAllToAll:
		return layout{sendCount: block * n, recvCount: block * n, paramCount: block}
	}
	return layout{sendCount: count, recvCount: count, paramCount: count}
}

// busBW returns nccl-tests' bus-bandwidth factor for test on n ranks:
// busbw = algbw * busBW(test, n). It converts the algorithm bandwidth into
// the bandwidth each rank's link must carry, so that numbers are comparable
// across rank counts (see nccl-tests' doc/PERFORMANCE.md).
func busBW(test string, n int) float64 {
	switch test {
	case "all_reduce":
		return 2 * float64(n-1) / float64(n)
	case "all_gather", "reduce_scatter", "alltoall", "gather", "scatter":
		return float64(n-1) / float64(n)
	}
	return 1 // broadcast, reduce, sendrecv
}

// algBytes is the byte count nccl-tests divides by the time to get algbw:
// count*typesize, where for the per-rank-count tests (all_gather,
// reduce_scatter, alltoall, gather, scatter) count is the whole n-block
// buffer, so that for them algbw is the total data size over the time.
func (t *collective) algBytes(l layout, typeSize, n int) int64 {
	b := int64(l.paramCount) * int64(typeSize)
	if t.perRankCount {
		b *= int64(n)
	}
	return b
}

// sizeBytes is the size column: the larger of the send and receive buffers.
func (l layout) sizeBytes(typeSize int) int64 {
	return int64(max(l.sendCount, l.recvCount)) * int64(typeSize)
}

// opArgs is one issue of a collective by one rank.
type opArgs struct {
	send, recv comm.Buffer
	op         comm.Op
	root       int
	next, prev int // sendrecv: the ranks sent to and received from
}

// run issues the collective and waits for it.
func (t *collective) run(ctx context.Context, c *comm.Comm, a *opArgs) error {
	switch t.kind {
	case kindAllReduce:
		return c.AllReduce(ctx, a.send, a.recv, a.op)
	case kindAllGather:
		return c.AllGather(ctx, a.send, a.recv)
	case kindReduceScatter:
		return c.ReduceScatter(ctx, a.send, a.recv, a.op)
	case kindBroadcast:
		return c.Broadcast(ctx, a.send, a.recv, a.root)
	case kindReduce:
		return c.Reduce(ctx, a.send, a.recv, a.op, a.root)
	case kindAllToAll:
		return c.AllToAll(ctx, a.send, a.recv)
	case kindGather:
		return c.Gather(ctx, a.send, a.recv, a.root)
	case kindScatter:
		return c.Scatter(ctx, a.send, a.recv, a.root)
	}
	return c.Group(ctx, comm.SendBuffer(a.next, a.send), comm.RecvBuffer(a.prev, a.recv))
}

// start issues the collective asynchronously.
func (t *collective) start(c *comm.Comm, a *opArgs) *comm.Request {
	switch t.kind {
	case kindAllReduce:
		return c.AllReduceAsync(a.send, a.recv, a.op)
	case kindAllGather:
		return c.AllGatherAsync(a.send, a.recv)
	case kindReduceScatter:
		return c.ReduceScatterAsync(a.send, a.recv, a.op)
	case kindBroadcast:
		return c.BroadcastAsync(a.send, a.recv, a.root)
	case kindReduce:
		return c.ReduceAsync(a.send, a.recv, a.op, a.root)
	case kindAllToAll:
		return c.AllToAllAsync(a.send, a.recv)
	case kindGather:
		return c.GatherAsync(a.send, a.recv, a.root)
	case kindScatter:
		return c.ScatterAsync(a.send, a.recv, a.root)
	}
	return c.GroupAsync(comm.SendBuffer(a.next, a.send), comm.RecvBuffer(a.prev, a.recv))
}

// allRanks as a source rank means that an output element is the reduction
// of every rank's input element at the source index.
const allRanks = -1

// source says where element j of rank r's output comes from: element idx of
// rank src's input, or of every rank's input reduced when src is allRanks.
// block is the per-rank block count (layout.paramCount).
func (t *collective) source(r, n, root, block, j int) (src, idx int) {
	switch t.kind {
	case kindAllReduce, kindReduce:
		return allRanks, j
	case kindReduceScatter:
		return allRanks, r*block + j
	case kindAllGather, kindGather:
		return j / block, j % block
	case kindBroadcast:
		return root, j
	case kindScatter:
		return root, r*block + j
	case kindAllToAll:
		return j / block, r*block + j%block
	}
	return (r - 1 + n) % n, j // sendrecv
}
