// Package hier generates hierarchical schedules for jobs that span hosts:
// the all-reduce runs a reduce-scatter among the ranks of each host, an
// all-reduce among the ranks with the same local index across hosts (one
// "rail" per local index), and an all-gather within each host again.
//
// With H hosts of L ranks and an N-byte vector, a flat ring over all n = HL
// ranks (hosts contiguous) pushes 2N(n-1)/n bytes through each link between
// two hosts; the hierarchical schedule pushes 2N(H-1)/H between two hosts
// in all, split over L rails. For 2 hosts of 2 ranks that is N instead of
// 1.5N through one shared link (a third less time where the network is the
// bottleneck), and with a NIC per rail each NIC carries 1/L of it. The
// price is 2(L-1) extra intra-host steps, cheap next to the network.
//
// The plan is one phase: the three stages run back to back on each chunk,
// so chunk c crosses the network while chunk c+1 is reduced inside the
// host (pipelined across stages, like the ring all-reduce's two halves).
// Each stage is a ring schedule from package ring with its peers mapped to
// global ranks and its blocks to sub-blocks: NBlocks = L*H, and local
// block s of a host-level ring is the H sub-blocks s*H .. s*H+H-1, of which
// the cross-host ring on rail s reduces one each. A host-level stage runs
// its ring once per sub-block index, one ring after the other: interleaving
// them step by step would put H messages on a connection before the first
// fused step and need H+1 slots instead of the ring's 2.
package hier

import (
	"fmt"
	"slices"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/algo/ring"
)

// Layout is the placement of a job's ranks on hosts: Hosts[h] lists the
// global ranks on host h, in local order. Every host has the same number of
// ranks.
type Layout struct {
	Hosts [][]int
}

// LayoutOf groups ranks 0..len(hostOf)-1 by host: ranks with equal hostOf
// values share a host; hosts are ordered by their lowest rank, and ranks in
// a host by rank. It fails when hosts hold different numbers of ranks, which
// the hierarchical schedules do not handle.
func LayoutOf(hostOf []string) (Layout, error) {
	index := map[string]int{}
	var lay Layout
	for r, h := range hostOf {
		i, ok := index[h]
		if !ok {
			i = len(lay.Hosts)
			index[h] = i
			lay.Hosts = append(lay.Hosts, nil)
		}
		lay.Hosts[i] = append(lay.Hosts[i], r)
	}
	if len(lay.Hosts) == 0 {
		return Layout{}, fmt.Errorf("hier: no ranks")
	}
	for _, h := range lay.Hosts {
		if len(h) != len(lay.Hosts[0]) {
			return Layout{}, fmt.Errorf("hier: hosts hold different numbers of ranks (%d and %d)", len(lay.Hosts[0]), len(h))
		}
	}
	return lay, nil
}

// Ranks is the number of ranks in the job.
func (l Layout) Ranks() int { return len(l.Hosts) * l.PerHost() }

// PerHost is the number of ranks on each host.
func (l Layout) PerHost() int { return len(l.Hosts[0]) }

// place returns rank's host and local index.
func (l Layout) place(rank int) (host, local int) {
	for h, rs := range l.Hosts {
		if i := slices.Index(rs, rank); i >= 0 {
			return h, i
		}
	}
	return -1, -1
}

// AllReduce returns rank's hierarchical all-reduce plan. With one host it is
// the host's reduce-scatter and all-gather (a ring all-reduce); with one
// rank per host it is the ring over the hosts.
func AllReduce(lay Layout, rank int) *algo.Plan {
	H, L := len(lay.Hosts), lay.PerHost()
	h, l := lay.place(rank)
	if h < 0 {
		panic(fmt.Sprintf("hier: rank %d is on no host of the layout", rank))
	}
	hostRank := func(i int) int { return lay.Hosts[h][i] }
	railRank := func(i int) int { return lay.Hosts[i][l] }
	var steps []algo.Step
	if L > 1 {
		// Stage 1: reduce-scatter within the host, local block s = the H
		// sub-blocks of super-block s. Its results are complete only when
		// there is a single host.
		for j := range H {
			for _, s := range ring.ReduceScatter(L, l).Phases[0] {
				st := mapStep(s, hostRank, func(b int) int { return b*H + j })
				st.Final = st.Final && H == 1
				steps = append(steps, st)
			}
		}
	}
	if H == 2 && L > 1 {
		// Stage 2 on two hosts: the rail's two ranks swap their partial
		// super-blocks and each reduces the other's into its own. That is
		// the bytes of a two-rank ring, but one dependent hop per chunk
		// instead of two, so the network link stays busy. Both ranks
		// compute host 1's partial op host 0's (the second host's rank
		// puts its own operand first), so they agree to the bit, NaN
		// operands of min and max included; Out is already pre-scaled by
		// stage 1, so reading it twice is safe for every op.
		peer := lay.Hosts[1-h][l]
		for j := range H {
			steps = append(steps, algo.SendStep(peer, algo.OutBlock(l*H+j)))
		}
		for j := range H {
			st := algo.RecvReduceCopyStep(peer, algo.OutBlock(l*H+j), algo.OutBlock(l*H+j)).AsFinal()
			if h == 1 {
				st = st.AsSrcFirst()
			}
			steps = append(steps, st)
		}
	} else if H > 1 {
		// Stage 2: all-reduce across hosts on this rank's super-block,
		// starting from the host's partial sums in Out (read from In only
		// when stage 1 did not run, so In is pre-scaled exactly once).
		for _, s := range ring.AllReduce(H, h).Phases[0] {
			st := mapStep(s, railRank, func(b int) int { return l*H + b })
			if L > 1 && st.Src.Buf == algo.In {
				st.Src.Buf = algo.Out
			}
			steps = append(steps, st)
		}
	}
	if L > 1 {
		// Stage 3: all-gather of the finished super-blocks within the host.
		for j := range H {
			for _, s := range ring.AllGather(L, l).Phases[0] {
				st := mapStep(s, hostRank, func(b int) int { return b*H + j })
				if st.Src.Buf == algo.In {
					st.Src.Buf = algo.Out
				}
				steps = append(steps, st)
			}
		}
	}
	if L == 1 && H == 1 {
		steps = ring.AllReduce(1, 0).Phases[0]
	}
	return &algo.Plan{
		Coll:    algo.AllReduce,
		Algo:    algo.Hier,
		NRanks:  lay.Ranks(),
		Rank:    rank,
		NBlocks: L * H,
		Phases:  [][]algo.Step{steps},
	}
}

// mapStep rewrites a step of a sub-group's schedule into the job's: peer i
// of the sub-group is global rank peer(i), and block b is block(b).
func mapStep(s algo.Step, peer func(int) int, block func(int) int) algo.Step {
	if s.SendPeer >= 0 {
		s.SendPeer = peer(s.SendPeer)
	}
	if s.RecvPeer >= 0 {
		s.RecvPeer = peer(s.RecvPeer)
	}
	if s.Src.Valid() {
		s.Src.Block = block(s.Src.Block)
	}
	if s.Dst.Valid() {
		s.Dst.Block = block(s.Dst.Block)
	}
	return s
}

// AllGather returns rank's hierarchical all-gather plan (NBlocks = n, block
// b is rank b's contribution): an all-gather across hosts on each rail,
// then, once per host's worth of blocks, an all-gather within the host. Each
// block crosses to every other host once, on its own rail.
func AllGather(lay Layout, rank int) *algo.Plan {
	H, L := len(lay.Hosts), lay.PerHost()
	h, l := lay.place(rank)
	if h < 0 {
		panic(fmt.Sprintf("hier: rank %d is on no host of the layout", rank))
	}
	var steps []algo.Step
	if H > 1 {
		// Stage 1: the rail's ring; its block i is the block of the rank
		// with this local index on host i.
		for _, s := range ring.AllGather(H, h).Phases[0] {
			steps = append(steps, mapStep(s,
				func(i int) int { return lay.Hosts[i][l] },
				func(i int) int { return lay.Hosts[i][l] }))
		}
	}
	if L > 1 {
		// Stage 2: within the host, one ring per host's blocks, which
		// this host's ranks now hold one each (in Out, or still in In
		// when there is a single host).
		for j := range H {
			for _, s := range ring.AllGather(L, l).Phases[0] {
				st := mapStep(s,
					func(i int) int { return lay.Hosts[h][i] },
					func(i int) int { return lay.Hosts[j][i] })
				if H > 1 && st.Src.Buf == algo.In {
					st.Src.Buf = algo.Out
				}
				steps = append(steps, st)
			}
		}
	}
	if L == 1 && H == 1 {
		steps = ring.AllGather(1, 0).Phases[0]
	}
	return &algo.Plan{
		Coll:    algo.AllGather,
		Algo:    algo.Hier,
		NRanks:  lay.Ranks(),
		Rank:    rank,
		NBlocks: lay.Ranks(),
		Phases:  [][]algo.Step{steps},
	}
}
