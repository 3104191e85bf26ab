package algo

// DoublingAllReduce returns rank's recursive-doubling all-reduce on n ranks
// (Algorithm Doubling, NBlocks = 1, Unscaled): in round j each rank swaps
// its partial result with rank^(1<<j) and reduces the two, so after
// log2(n) rounds every rank holds the whole reduction. Where n is not a
// power of two, each rank r past the largest power p first hands its input
// to rank r-p, which folds it in, and gets the result back at the end. A
// rank sends log2(n) messages (the one exchange sends n-1, each a system
// call and a wake-up over a network transport) over log2(n) dependent
// hops (the exchange's one).
//
// Every rank computes the same expression with the operands in the same
// places, so that the ranks agree to the bit: each reduction puts the
// higher ranks' partial first (msg op acc on the lower side, acc op msg,
// SrcFirst, on the higher). The plan reads In twice (sent, then reduced)
// on ranks below p: only ops without pre-scaling may use it.
func DoublingAllReduce(n, rank int) *Plan {
	p := &Plan{Coll: AllReduce, Algo: Doubling, NRanks: n, Rank: rank, NBlocks: 1, Unscaled: true}
	in, out := InBlock(0), OutBlock(0)
	if n == 1 {
		p.Phases = [][]Step{{CopyStep(in, out).AsFinal()}}
		return p
	}
	pow := 1
	for pow*2 <= n {
		pow *= 2
	}
	if rank >= pow {
		// Folded into rank-pow's result, then given it.
		p.Phases = [][]Step{{SendStep(rank-pow, in), RecvStep(rank-pow, out)}}
		return p
	}
	var steps []Step
	acc := in
	if rank+pow < n {
		steps = append(steps, RecvReduceCopyStep(rank+pow, in, out))
		acc = out
	}
	for bit := 1; bit < pow; bit <<= 1 {
		q := rank ^ bit
		steps = append(steps, SendStep(q, acc))
		s := RecvReduceCopyStep(q, acc, out)
		if rank&bit != 0 {
			s = s.AsSrcFirst()
		}
		steps = append(steps, s)
		acc = out
	}
	steps[len(steps)-1] = steps[len(steps)-1].AsFinal()
	if rank+pow < n {
		steps = append(steps, SendStep(rank+pow, out))
	}
	p.Phases = [][]Step{steps}
	return p
}
