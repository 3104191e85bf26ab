package algo

// ExchangeAllReduce returns rank's one-exchange all-reduce on n = 1 or 2
// ranks (Algorithm Direct, NBlocks = 1, Unscaled): each rank sends its whole
// input to the other and reduces the other's input with its own. A ring
// makes two dependent one-way hops; this makes one, which is what small
// messages pay for. Both ranks compute x0 op x1 in opposite operand order,
// which is bitwise the same for the commutative ops (+, *, min, max), so the
// ranks agree; with more ranks the orders would differ, so n > 2 panics.
// The plan reads In twice: only ops without pre-scaling may use it.
func ExchangeAllReduce(n, rank int) *Plan {
	p := &Plan{Coll: AllReduce, Algo: Direct, NRanks: n, Rank: rank, NBlocks: 1, Unscaled: true}
	switch n {
	case 1:
		p.Phases = [][]Step{{CopyStep(InBlock(0), OutBlock(0)).AsFinal()}}
	case 2:
		peer := 1 - rank
		p.Phases = [][]Step{{
			SendStep(peer, InBlock(0)),
			RecvReduceCopyStep(peer, InBlock(0), OutBlock(0)).AsFinal(),
		}}
	default:
		panic("algo: ExchangeAllReduce needs 1 or 2 ranks")
	}
	return p
}
