// Package ring generates ring schedules: ring all-reduce, reduce-scatter and
// all-gather over ranks 0 -> 1 -> ... -> n-1 -> 0, and pipelined chains for
// the rooted broadcast and reduce.
//
// Every plan is a single phase, so the executor runs the whole schedule once
// per chunk index and consecutive chunks pipeline around the ring. With n = 1
// every plan is a single local Copy.
package ring

import "github.com/gccl/gccl/algo"

// MinSlots is the least number of slots per connection that the ring
// all-reduce, reduce-scatter and all-gather need to make progress. A fused
// step (receive, then send what it received) holds its incoming message while
// it waits for a free outgoing slot; after every rank's first send, each
// connection of the ring holds one message, so with a single slot every rank
// waits for its successor in a cycle. The chains of Broadcast and Reduce have
// no cycle and work with one slot.
const MinSlots = 2

// mod returns x mod n in [0, n).
func mod(x, n int) int { return ((x % n) + n) % n }

func plan(coll algo.Collective, n, rank, root, nblocks int, steps []algo.Step) *algo.Plan {
	return &algo.Plan{
		Coll:    coll,
		Algo:    algo.Ring,
		NRanks:  n,
		Rank:    rank,
		Root:    root,
		NBlocks: nblocks,
		Phases:  [][]algo.Step{steps},
	}
}

// reduceScatterSteps appends the reduce-scatter half of the ring for rank,
// except the last step: in step s the rank reduces block rank-s-1 (the block
// its predecessor started on one step earlier) and passes it on, so that after
// n-1 steps the partial sum arriving at rank covers all ranks but itself and
// belongs to block rank.
func reduceScatterSteps(steps []algo.Step, n, rank int) []algo.Step {
	next, prev := mod(rank+1, n), mod(rank-1, n)
	steps = append(steps, algo.SendStep(next, algo.InBlock(mod(rank-1, n))))
	for s := 1; s <= n-2; s++ {
		steps = append(steps, algo.RecvReduceSendStep(prev, next, algo.InBlock(mod(rank-s-1, n))))
	}
	return steps
}

// allGatherSteps appends the receiving half of a ring all-gather for rank,
// whose first step sent block rank: in step k the rank receives block rank-k
// (what its predecessor got one step earlier), stores it and forwards it,
// except for the last block, which has gone around the whole ring.
func allGatherSteps(steps []algo.Step, n, rank int) []algo.Step {
	next, prev := mod(rank+1, n), mod(rank-1, n)
	for k := 1; k <= n-2; k++ {
		steps = append(steps, algo.RecvCopySendStep(prev, next, algo.OutBlock(mod(rank-k, n))))
	}
	return append(steps, algo.RecvStep(prev, algo.OutBlock(mod(rank-n+1, n))))
}

// AllReduce returns rank's ring all-reduce plan on n ranks (NBlocks = n): a
// reduce-scatter whose last step completes block rank and, fused with it, the
// start of an all-gather of the completed blocks; 2(n-1) transfers per rank.
func AllReduce(n, rank int) *algo.Plan {
	if n == 1 {
		return plan(algo.AllReduce, 1, 0, 0, 1, []algo.Step{algo.CopyStep(algo.InBlock(0), algo.OutBlock(0)).AsFinal()})
	}
	next, prev := mod(rank+1, n), mod(rank-1, n)
	steps := make([]algo.Step, 0, 2*n-1)
	steps = reduceScatterSteps(steps, n, rank)
	steps = append(steps, algo.RecvReduceCopySendStep(prev, next, algo.InBlock(rank), algo.OutBlock(rank)).AsFinal())
	steps = allGatherSteps(steps, n, rank)
	return plan(algo.AllReduce, n, rank, 0, n, steps)
}

// ReduceScatter returns rank's ring reduce-scatter plan on n ranks
// (NBlocks = n): rank ends with the complete reduction of block rank.
func ReduceScatter(n, rank int) *algo.Plan {
	if n == 1 {
		return plan(algo.ReduceScatter, 1, 0, 0, 1, []algo.Step{algo.CopyStep(algo.InBlock(0), algo.OutBlock(0)).AsFinal()})
	}
	prev := mod(rank-1, n)
	steps := make([]algo.Step, 0, n)
	steps = reduceScatterSteps(steps, n, rank)
	steps = append(steps, algo.RecvReduceCopyStep(prev, algo.InBlock(rank), algo.OutBlock(rank)).AsFinal())
	return plan(algo.ReduceScatter, n, rank, 0, n, steps)
}

// AllGather returns rank's ring all-gather plan on n ranks (NBlocks = n):
// each rank copies its own block into place and sends it around the ring.
func AllGather(n, rank int) *algo.Plan {
	if n == 1 {
		return plan(algo.AllGather, 1, 0, 0, 1, []algo.Step{algo.CopyStep(algo.InBlock(0), algo.OutBlock(0))})
	}
	next := mod(rank+1, n)
	steps := make([]algo.Step, 0, n)
	steps = append(steps, algo.CopySendStep(next, algo.InBlock(rank), algo.OutBlock(rank)))
	steps = allGatherSteps(steps, n, rank)
	return plan(algo.AllGather, n, rank, 0, n, steps)
}

// Broadcast returns rank's broadcast plan on n ranks (NBlocks = 1): a
// pipelined chain root -> root+1 -> ... -> root-1 (mod n).
func Broadcast(n, rank, root int) *algo.Plan {
	var step algo.Step
	next, prev := mod(rank+1, n), mod(rank-1, n)
	switch pos := mod(rank-root, n); {
	case n == 1:
		step = algo.CopyStep(algo.InBlock(0), algo.OutBlock(0))
	case pos == 0:
		step = algo.CopySendStep(next, algo.InBlock(0), algo.OutBlock(0))
	case pos == n-1:
		step = algo.RecvStep(prev, algo.OutBlock(0))
	default:
		step = algo.RecvCopySendStep(prev, next, algo.OutBlock(0))
	}
	return plan(algo.Broadcast, n, rank, root, 1, []algo.Step{step})
}

// Reduce returns rank's reduce plan on n ranks (NBlocks = 1): a pipelined
// chain root+1 -> root+2 -> ... -> root (mod n) that ends at the root, the
// only rank with an Out buffer.
func Reduce(n, rank, root int) *algo.Plan {
	var step algo.Step
	next, prev := mod(rank+1, n), mod(rank-1, n)
	switch pos := mod(rank-root-1, n); {
	case n == 1:
		step = algo.CopyStep(algo.InBlock(0), algo.OutBlock(0)).AsFinal()
	case pos == 0:
		step = algo.SendStep(next, algo.InBlock(0))
	case pos == n-1:
		step = algo.RecvReduceCopyStep(prev, algo.InBlock(0), algo.OutBlock(0)).AsFinal()
	default:
		step = algo.RecvReduceSendStep(prev, next, algo.InBlock(0))
	}
	return plan(algo.Reduce, n, rank, root, 1, []algo.Step{step})
}
