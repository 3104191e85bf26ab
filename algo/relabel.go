package algo

import "fmt"

// Relabel turns the plan of position pos in a schedule over ranks 0..n-1
// into the plan of rank order[pos] in the same schedule laid over the ranks
// in the given order: ring position i becomes rank order[i]. Peers and the
// root are mapped, and so are blocks when there is one per rank (NBlocks ==
// n), since block b of ReduceScatter, AllGather, Gather, Scatter and
// AllToAll belongs to rank b; for AllReduce the mapping just renames the
// parts of the vector, consistently on every rank. order must be a
// permutation of 0..n-1.
//
// This is how rings follow the topology: the schedule generators stay on
// 0..n-1, and the communicator relabels their plans along the ring order
// the topology chose (each host's ranks together, fast links adjacent).
func Relabel(p *Plan, order []int) (*Plan, error) {
	n := p.NRanks
	if len(order) != n {
		return nil, fmt.Errorf("algo: relabel of a %d-rank plan with %d ranks", n, len(order))
	}
	seen := make([]bool, n)
	for _, r := range order {
		if r < 0 || r >= n || seen[r] {
			return nil, fmt.Errorf("algo: relabel order %v is not a permutation of 0..%d", order, n-1)
		}
		seen[r] = true
	}
	q := *p
	q.Rank = order[p.Rank]
	if p.Coll == Broadcast || p.Coll == Reduce || p.Coll == Gather || p.Coll == Scatter {
		q.Root = order[p.Root]
	}
	perBlock := p.NBlocks == n
	q.Phases = make([][]Step, len(p.Phases))
	for i, ph := range p.Phases {
		q.Phases[i] = make([]Step, len(ph))
		for j, s := range ph {
			if s.SendPeer >= 0 {
				s.SendPeer = order[s.SendPeer]
			}
			if s.RecvPeer >= 0 {
				s.RecvPeer = order[s.RecvPeer]
			}
			if perBlock {
				if s.Src.Valid() {
					s.Src.Block = order[s.Src.Block]
				}
				if s.Dst.Valid() {
					s.Dst.Block = order[s.Dst.Block]
				}
			}
			q.Phases[i][j] = s
		}
	}
	return &q, nil
}
