package topo

import "math"

// ringScore ranks a ring: the narrowest hop first (a ring runs at its
// slowest link), then the fewest NUMA crossings, then the closest classes.
type ringScore struct {
	minBW     float64
	crossings int
	typeSum   int
}

func (a ringScore) better(b ringScore) bool {
	if a.minBW != b.minBW {
		return a.minBW > b.minBW
	}
	if a.crossings != b.crossings {
		return a.crossings < b.crossings
	}
	return a.typeSum < b.typeSum
}

// exhaustiveRingLimit bounds the exact search: (n-1)! orders, 40320 at 9.
const exhaustiveRingLimit = 9

// RingOrder orders devs (one entry per rank; a device may repeat when several
// ranks share it, as CPU-only ranks share a NUMA node) into a ring whose
// neighbours have the widest paths between them, then the fewest NUMA
// crossings, then the closest path classes. It returns indices into devs,
// starting with 0. Up to 9 entries the search is exact; beyond, it starts
// from the nearest-neighbour ring and improves it by 2-opt moves.
func (g *Graph) RingOrder(devs []*Node) []int {
	n := len(devs)
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	if n <= 2 || allSame(devs) {
		// Every order scores the same when every rank shares one device
		// (CPU-only ranks of a one-NUMA host), and the searches below keep
		// the first best, the identity: skip them. At 128 ranks of a host
		// they cost 30 ms of CPU in each rank at Init.
		return order
	}
	// Every hop's figures, looked up once: the searches below score
	// O(n³) hops, and a path lookup per hop made 512 ranks take seconds.
	type hopFig struct {
		bw    float64
		cross int
		typ   int
	}
	figs := make([]hopFig, n*n)
	for a := range devs {
		ca := g.LocalCPU(devs[a])
		for b := range devs {
			p := g.summary(devs[a], devs[b])
			f := hopFig{bw: p.bw, typ: int(p.typ)}
			if ca != g.LocalCPU(devs[b]) {
				f.cross = 1
			}
			figs[a*n+b] = f
		}
	}
	hop := func(a, b int) (float64, int, int) {
		f := figs[a*n+b]
		return f.bw, f.cross, f.typ
	}
	score := func(o []int) ringScore {
		s := ringScore{minBW: math.Inf(1)}
		for i := range o {
			bw, c, t := hop(o[i], o[(i+1)%len(o)])
			s.minBW = min(s.minBW, bw)
			s.crossings += c
			s.typeSum += t
		}
		return s
	}
	if n <= exhaustiveRingLimit {
		best := append([]int(nil), order...)
		bestScore := score(best)
		permute(order[1:], func() {
			if s := score(order); s.better(bestScore) {
				bestScore = s
				copy(best, order)
			}
		})
		return best
	}
	// Nearest neighbour from 0, then 2-opt until no reversal helps.
	used := make([]bool, n)
	used[0] = true
	cur := []int{0}
	for len(cur) < n {
		last := cur[len(cur)-1]
		pick, pickScore := -1, ringScore{}
		for j := 0; j < n; j++ {
			if used[j] {
				continue
			}
			bw, c, t := hop(last, j)
			s := ringScore{bw, c, t}
			if pick < 0 || s.better(pickScore) {
				pick, pickScore = j, s
			}
		}
		used[pick] = true
		cur = append(cur, pick)
	}
	bestScore := score(cur)
	for improved := true; improved; {
		improved = false
		for i := 1; i < n-1; i++ {
			for j := i + 1; j < n; j++ {
				reverse(cur[i : j+1])
				if s := score(cur); s.better(bestScore) {
					bestScore, improved = s, true
				} else {
					reverse(cur[i : j+1])
				}
			}
		}
	}
	return cur
}

func allSame(devs []*Node) bool {
	for _, d := range devs[1:] {
		if d != devs[0] {
			return false
		}
	}
	return true
}

// permute calls visit for every permutation of a (Heap's algorithm).
func permute(a []int, visit func()) {
	var gen func(k int)
	gen = func(k int) {
		if k <= 1 {
			visit()
			return
		}
		for i := 0; i < k-1; i++ {
			gen(k - 1)
			if k%2 == 0 {
				a[i], a[k-1] = a[k-1], a[i]
			} else {
				a[0], a[k-1] = a[k-1], a[0]
			}
		}
		gen(k - 1)
	}
	gen(len(a))
}

func reverse(a []int) {
	for i, j := 0, len(a)-1; i < j; i, j = i+1, j-1 {
		a[i], a[j] = a[j], a[i]
	}
}

// RingStats describes a ring over devs in the given order.
type RingStats struct {
	MinBW         float64    // GB/s: the ring's bottleneck
	NUMACrossings int        // hops between different NUMA nodes
	Types         []PathType // the class of each hop, order[i] -> order[i+1]; nil below 2 ranks (no hop)
}

// RingStats returns the bottleneck, crossings and hop classes of a ring.
func (g *Graph) RingStats(devs []*Node, order []int) RingStats {
	s := RingStats{MinBW: math.Inf(1)}
	if len(order) < 2 {
		s.MinBW = 0
		return s
	}
	for i := range order {
		a, b := devs[order[i]], devs[order[(i+1)%len(order)]]
		p := g.summary(a, b)
		s.MinBW = min(s.MinBW, p.bw)
		s.Types = append(s.Types, p.typ)
		if g.LocalCPU(a) != g.LocalCPU(b) {
			s.NUMACrossings++
		}
	}
	return s
}
