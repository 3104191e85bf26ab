package algo

// PairwiseAllToAll returns rank's all-to-all plan on n ranks (Algorithm
// Pairwise, NBlocks = n; block b of In is for rank b, block b of Out is from
// rank b). After copying its own block, in round k = 1..n-1 every rank sends
// to rank+k and receives from rank-k, so each round is a permutation and every
// pair of ranks exchanges exactly once. SendRecv progresses both directions
// at once, which keeps rounds where rank+k == rank-k (k = n/2) and any
// connection capacity deadlock-free.
//
// (The name carries the algorithm because AllToAll is the Collective.)
func PairwiseAllToAll(n, rank int) *Plan {
	steps := make([]Step, 0, n)
	steps = append(steps, CopyStep(InBlock(rank), OutBlock(rank)))
	for k := 1; k < n; k++ {
		to := (rank + k) % n
		from := (rank - k + n) % n
		steps = append(steps, SendRecvStep(to, InBlock(to), from, OutBlock(from)))
	}
	return &Plan{Coll: AllToAll, Algo: Pairwise, NRanks: n, Rank: rank, NBlocks: n, Phases: [][]Step{steps}}
}
