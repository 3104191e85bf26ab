package algo

// Deterministic reductions: schedules in which every element of the result
// is the left fold of the ranks' contributions in rank order,
// (((x0 op x1) op x2) op ...) op x(n-1), whatever the element's place in
// the message. The owner of a block (rank b owns block b) receives every
// other rank's piece of it directly and folds the pieces in rank order;
// which rank owns an element changes with the message's length, the order
// of its operands does not. Each rank sends and receives (n-1)/n of the
// vector per phase, as a ring does, in one hop instead of n-1.
//
// The owner keeps its own (pre-scaled) contribution in Out until its turn
// comes and accumulates the ranks before it in Tmp, so that in place (Out
// is In) its input is read once, before anything overwrites it. Each rank's
// In is read exactly once (sent, or copied into Out), so the plans are not
// Unscaled: PreMulSum and float Avg scale every contribution before the
// fold.

// DeterministicReduceScatter returns rank's deterministic reduce-scatter
// plan on n ranks (Algorithm Direct, NBlocks = n, one phase): rank r sends
// block p of its input to every rank p != r (in the order r+1, r+2, ...)
// and folds the n pieces of block r in rank order into Out.
func DeterministicReduceScatter(n, rank int) *Plan {
	return &Plan{Coll: ReduceScatter, Algo: Direct, NRanks: n, Rank: rank, NBlocks: n,
		Phases: [][]Step{determReduceScatterSteps(n, rank)}}
}

// DeterministicAllReduce returns rank's deterministic all-reduce plan on n
// ranks (Algorithm Direct, NBlocks = n, two phases): the reduce-scatter of
// DeterministicReduceScatter into block rank of Out, then a direct
// all-gather of the owners' blocks (sends in the order rank+1, rank+2, ...,
// receives in the order rank-1, rank-2, ..., as DirectAllGather).
func DeterministicAllReduce(n, rank int) *Plan {
	p := &Plan{Coll: AllReduce, Algo: Direct, NRanks: n, Rank: rank, NBlocks: n,
		Phases: [][]Step{determReduceScatterSteps(n, rank)}}
	if n == 1 {
		return p
	}
	var gather []Step
	for i := 1; i < n; i++ {
		gather = append(gather, SendStep((rank+i)%n, OutBlock(rank)))
	}
	for i := 1; i < n; i++ {
		q := (rank - i + n) % n
		gather = append(gather, RecvStep(q, OutBlock(q)))
	}
	p.Phases = append(p.Phases, gather)
	return p
}

// determReduceScatterSteps: send the other owners their pieces, then fold
// block rank as x0 op x1 op ... op x(n-1), left to right.
func determReduceScatterSteps(n, rank int) []Step {
	own, acc := OutBlock(rank), TmpBlock(rank)
	var steps []Step
	for i := 1; i < n; i++ {
		q := (rank + i) % n
		steps = append(steps, SendStep(q, InBlock(q)))
	}
	// The own piece goes to Out first (pre-scaled): in place it is read
	// there before any result lands.
	steps = append(steps, CopyStep(InBlock(rank), own))
	if rank > 0 {
		// Ranks 0..rank-1 accumulate in Tmp, then the own piece joins as
		// the right operand (LocalReduce: Dst = Src op Dst).
		steps = append(steps, RecvStep(0, acc))
		for p := 1; p < rank; p++ {
			steps = append(steps, RecvReduceCopyStep(p, acc, acc).AsSrcFirst())
		}
		steps = append(steps, LocalReduceStep(acc, own))
	}
	for p := rank + 1; p < n; p++ {
		steps = append(steps, RecvReduceCopyStep(p, own, own).AsSrcFirst())
	}
	steps[len(steps)-1] = steps[len(steps)-1].AsFinal()
	return steps
}
