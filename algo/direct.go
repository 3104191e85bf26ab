package algo

// DirectGather returns rank's gather plan on n ranks (Algorithm Direct,
// NBlocks = n): every non-root rank sends its block straight to the root,
// which copies its own block and then receives the others in increasing rank
// order. Each sender has its own connection to the root, so the fixed order
// cannot deadlock.
//
// (The name carries the algorithm because Gather is the Collective.)
func DirectGather(n, rank, root int) *Plan {
	var steps []Step
	if rank == root {
		steps = append(steps, CopyStep(InBlock(root), OutBlock(root)))
		for p := 0; p < n; p++ {
			if p != root {
				steps = append(steps, RecvStep(p, OutBlock(p)))
			}
		}
	} else {
		steps = append(steps, SendStep(root, InBlock(rank)))
	}
	return &Plan{Coll: Gather, Algo: Direct, NRanks: n, Rank: rank, Root: root, NBlocks: n, Phases: [][]Step{steps}}
}

// DirectScatter returns rank's scatter plan on n ranks (Algorithm Direct,
// NBlocks = n): the root copies its own block and then sends block p to each
// rank p != root in increasing order; every other rank receives its block.
//
// (The name carries the algorithm because Scatter is the Collective.)
func DirectScatter(n, rank, root int) *Plan {
	var steps []Step
	if rank == root {
		steps = append(steps, CopyStep(InBlock(root), OutBlock(root)))
		for p := 0; p < n; p++ {
			if p != root {
				steps = append(steps, SendStep(p, InBlock(p)))
			}
		}
	} else {
		steps = append(steps, RecvStep(root, OutBlock(rank)))
	}
	return &Plan{Coll: Scatter, Algo: Direct, NRanks: n, Rank: rank, Root: root, NBlocks: n, Phases: [][]Step{steps}}
}

// DirectAllGather returns rank's all-gather plan on n ranks (Algorithm
// Direct, NBlocks = n): the rank sends its block to every other rank, copies
// it into its own output, and receives the others' blocks. A ring takes
// n-1 dependent hops; this takes one, for small messages (the tuner bounds
// the n-1 copies each rank sends). Ranks send in the order rank+1, rank+2,
// ... and receive in the order rank-1, rank-2, ..., so the first block a
// rank waits for is the first one its sender sent; every sender has its
// own connection, so the order cannot deadlock.
func DirectAllGather(n, rank int) *Plan {
	var steps []Step
	for i := 1; i < n; i++ {
		steps = append(steps, SendStep((rank+i)%n, InBlock(rank)))
	}
	steps = append(steps, CopyStep(InBlock(rank), OutBlock(rank)))
	for i := 1; i < n; i++ {
		p := (rank - i + n) % n
		steps = append(steps, RecvStep(p, OutBlock(p)))
	}
	return &Plan{Coll: AllGather, Algo: Direct, NRanks: n, Rank: rank, NBlocks: n, Phases: [][]Step{steps}}
}
