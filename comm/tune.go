package comm

import (
	"fmt"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/algo/hier"
	"github.com/gccl/gccl/algo/ring"
	"github.com/gccl/gccl/algo/tree"
)

// hierMinBytes is the all-reduce and all-gather size from which jobs on
// several hosts (with several ranks on each) go hierarchical. It is zero:
// measured on two namespaces of two ranks joined by a 2 Gbit/s link
// (tests/twohosts_bench.sh, docs/PERFORMANCE.md), the hierarchical schedule
// beat the tree and the ring from 8 B to 64 MiB, small messages included,
// since it crosses the network fewest times (once each way with two hosts)
// and its extra steps run over shared memory.
const hierMinBytes = 0

// treeMaxBytes is the message size up to which trees beat rings: a tree
// takes 2*log2(n) latency steps against a ring's 2(n-1), but moves each byte
// over more hops. The topology-aware cost model will replace this constant.
const treeMaxBytes = 256 << 10

// exchangeMaxBytes bounds the bytes each rank sends in a one-exchange
// all-reduce or a direct all-gather ((n-1) copies of its input): below it,
// ranks exchange their inputs once instead of running a ring or a tree, one
// one-way hop instead of n-1, 2(n-1) or 2 log2(n). For two ranks the
// transports' benchmarks put the all-reduce's crossover above 64 KiB on shm
// and TCP alike.
const exchangeMaxBytes = 64 << 10

// exchangeMaxRanks is the most ranks that run the one-exchange all-reduce
// and the direct all-gather: each rank receives (and reduces) every other
// rank's input in turn, which stops paying off as n grows.
const exchangeMaxRanks = 8

// choose picks the algorithm for a collective of the given size in bytes.
// scaled says whether the op pre-scales inputs (PreMulSum, float Avg),
// which rules out plans that read a rank's input twice.
func (c *Comm) choose(coll algo.Collective, bytes int, scaled bool) algo.Algorithm {
	if (coll == algo.AllReduce && !scaled || coll == algo.AllGather) && c.algoPref == 0 && c.hier == nil &&
		c.size <= exchangeMaxRanks && bytes*(c.size-1) <= exchangeMaxBytes {
		// All-gather's bytes are one rank's block.
		return algo.Direct
	}
	if coll == algo.AllReduce || coll == algo.AllGather {
		switch {
		case c.algoPref == algo.Hier && c.hier != nil:
			return algo.Hier
		case c.algoPref == 0 && c.hier != nil && bytes >= hierMinBytes:
			return algo.Hier
		}
	}
	switch coll {
	case algo.AllToAll:
		return algo.Pairwise
	case algo.Gather, algo.Scatter:
		return algo.Direct
	case algo.AllReduce, algo.Broadcast, algo.Reduce:
		if c.algoPref == algo.Hier {
			// Forced, but no hierarchy here (one host, or uneven
			// hosts) or not this collective: the flat schedules.
			return algo.Ring
		}
		if c.algoPref != 0 {
			return c.algoPref
		}
		if c.size > 2 && bytes <= treeMaxBytes {
			return algo.Tree
		}
	}
	return algo.Ring
}

// plan returns the cached plan for a collective on this rank.
func (c *Comm) plan(coll algo.Collective, root, bytes int, scaled bool) *algo.Plan {
	k := planKey{coll: coll, alg: c.choose(coll, bytes, scaled), root: root}
	if k == c.lastKey && c.lastPlan != nil {
		return c.lastPlan
	}
	if p := c.plans[k]; p != nil {
		c.lastKey, c.lastPlan = k, p
		return p
	}
	var p *algo.Plan
	switch {
	case k.alg == algo.Hier:
		if k.coll == algo.AllGather {
			p = hier.AllGather(*c.hier, c.rank)
		} else {
			p = hier.AllReduce(*c.hier, c.rank)
		}
	case k.alg == algo.Ring && c.ringOrder != nil:
		// The ring follows the topology's order: generate the plan of
		// this rank's position and relabel positions as ranks.
		pk := k
		pk.root = c.ringPos[k.root]
		var err error
		if p, err = algo.Relabel(generate(pk, c.size, c.ringPos[c.rank]), c.ringOrder); err != nil {
			panic("gccl: " + err.Error()) // setRingOrder checked the order
		}
	default:
		p = generate(k, c.size, c.rank)
	}
	c.plans[k] = p
	c.lastKey, c.lastPlan = k, p
	return p
}

func generate(k planKey, n, r int) *algo.Plan {
	switch k.alg {
	case algo.Tree:
		switch k.coll {
		case algo.AllReduce:
			return tree.AllReduce(n, r)
		case algo.Broadcast:
			return tree.Broadcast(n, r, k.root)
		case algo.Reduce:
			return tree.Reduce(n, r, k.root)
		}
	case algo.Pairwise:
		return algo.PairwiseAllToAll(n, r)
	case algo.Direct:
		switch k.coll {
		case algo.AllReduce:
			return algo.ExchangeAllReduce(n, r)
		case algo.AllGather:
			return algo.DirectAllGather(n, r)
		case algo.Gather:
			return algo.DirectGather(n, r, k.root)
		}
		return algo.DirectScatter(n, r, k.root)
	}
	switch k.coll {
	case algo.AllReduce:
		return ring.AllReduce(n, r)
	case algo.ReduceScatter:
		return ring.ReduceScatter(n, r)
	case algo.AllGather:
		return ring.AllGather(n, r)
	case algo.Broadcast:
		return ring.Broadcast(n, r, k.root)
	case algo.Reduce:
		return ring.Reduce(n, r, k.root)
	}
	panic("gccl: no plan for " + k.coll.String())
}

// setHosts records which host each rank is on, for the hierarchical
// schedules; a job on one host, with one rank per host, or with hosts of
// different sizes keeps the flat ones.
func (c *Comm) setHosts(hostOf []string) {
	c.hier = nil
	clear(c.plans)
	c.multiHost = false
	for _, h := range hostOf {
		c.multiHost = c.multiHost || h != hostOf[0]
	}
	lay, err := hier.LayoutOf(hostOf)
	if err != nil {
		c.log.Info("flat schedules: "+err.Error(), "subsys", "TUNING")
		return
	}
	if len(lay.Hosts) > 1 && lay.PerHost() > 1 {
		c.hier = &lay
		c.log.Info(fmt.Sprintf("%d hosts of %d ranks: hierarchical all-reduce and all-gather", len(lay.Hosts), lay.PerHost()), "subsys", "TUNING")
	}
}

// setRingOrder lays the rings over the ranks in order (ring position i is
// rank order[i]); nil or the identity keeps rank order.
func (c *Comm) setRingOrder(order []int) error {
	clear(c.plans)
	c.ringOrder, c.ringPos = nil, nil
	if order == nil {
		return nil
	}
	if len(order) != c.size {
		return fmt.Errorf("ring order of %d ranks for %d", len(order), c.size)
	}
	pos := make([]int, c.size)
	for i := range pos {
		pos[i] = -1
	}
	identity := true
	for i, r := range order {
		if r < 0 || r >= c.size || pos[r] >= 0 {
			return fmt.Errorf("ring order %v is not a permutation", order)
		}
		pos[r] = i
		identity = identity && r == i
	}
	if !identity {
		c.ringOrder, c.ringPos = order, pos
	}
	return nil
}
