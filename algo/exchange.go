package algo

// ExchangeAllReduce returns rank's one-exchange all-reduce on n ranks
// (Algorithm Direct, NBlocks = 1, Unscaled): each rank sends its whole input
// to every other rank and reduces all n inputs itself. A ring makes 2(n-1)
// dependent one-way hops and a tree 2 log2(n); this makes one, which is what
// small messages pay for, at the price of n-1 copies of the input on the
// wire from each rank (the tuner bounds that).
//
// Every rank computes the same expression, x(n-1) op (... op (x1 op x0)),
// with the operands in the same places, so that the ranks agree to the bit
// in floating point, NaN operands of min and max included: rank 0 folds
// each incoming x(k) into its accumulator (msg op acc); rank 1 starts with
// x1 op x0 (SrcFirst); a higher rank accumulates in Tmp from x0 and folds
// its own input in at its turn (LocalReduce). The plan reads In more than
// once: only ops without pre-scaling may use it.
func ExchangeAllReduce(n, rank int) *Plan {
	p := &Plan{Coll: AllReduce, Algo: Direct, NRanks: n, Rank: rank, NBlocks: 1, Unscaled: true}
	in, out := InBlock(0), OutBlock(0)
	if n == 1 {
		p.Phases = [][]Step{{CopyStep(in, out).AsFinal()}}
		return p
	}
	var steps []Step
	for k := range n {
		if k != rank {
			steps = append(steps, SendStep(k, in))
		}
	}
	// The accumulator starts as x1 op x0 in Out on ranks 0 and 1. The
	// others start it as x0 and fold their own input in later, so they
	// keep it in Tmp: in place, Out is In.
	acc, next := out, 2
	switch rank {
	case 0:
		steps = append(steps, RecvReduceCopyStep(1, in, out))
	case 1:
		steps = append(steps, RecvReduceCopyStep(0, in, out).AsSrcFirst())
	default:
		acc, next = TmpBlock(0), 1
		steps = append(steps, RecvStep(0, acc))
	}
	for k := next; k < n; k++ {
		dst := acc
		if k == n-1 && k != rank {
			dst = out
		}
		if k == rank {
			steps = append(steps, LocalReduceStep(in, acc))
		} else {
			steps = append(steps, RecvReduceCopyStep(k, acc, dst))
		}
	}
	steps[len(steps)-1] = steps[len(steps)-1].AsFinal()
	if acc != out && rank == n-1 {
		steps = append(steps, CopyStep(acc, out))
	}
	p.Phases = [][]Step{steps}
	return p
}
