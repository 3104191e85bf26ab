package comm

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/algo/hier"
	"github.com/gccl/gccl/algo/ring"
	"github.com/gccl/gccl/algo/tree"
	"github.com/gccl/gccl/algo/tune"
)

// The tuner is the cost model's (algo/tune): the run-time choice and
// gccl-perf --simulate price the same schedules with the same figures,
// calibrated on this machine class (docs/PERFORMANCE.md, "Calibrating the
// tuner"). A communicator works its tables out once, for its layout (at
// creation, and again when setHosts learns the hosts), and each call
// looks its size up: no model arithmetic, lock or allocation per call.

// retune asks the cost model for this communicator's tables: hostOf names
// each rank's host (nil: all on one, as in-process ranks are).
func (c *Comm) retune(hostOf []string) {
	var perHost []int
	if len(hostOf) != c.size {
		perHost = []int{c.size}
	} else {
		index := map[string]int{}
		for _, h := range hostOf {
			i, ok := index[h]
			if !ok {
				i = len(perHost)
				index[h] = i
				perHost = append(perHost, 0)
			}
			perHost[i]++
		}
	}
	intra := "shm"
	if c.intraNet {
		intra = "tcp"
	}
	sys, err := tune.HostOver(intra, perHost...)
	if err == nil {
		c.tuner, err = tune.NewTuner(sys, c.algoPref)
	}
	if err != nil {
		panic("gccl: tuner: " + err.Error()) // Host and NewTuner take any layout and GCCL_ALGO newComm accepts
	}
	// Once per communicator at INFO where hosts are known (setHosts:
	// multi-process jobs), else at DEBUG (in-process ranks, many at once).
	level := slog.LevelDebug
	if hostOf != nil {
		level = slog.LevelInfo
	}
	if c.log.Enabled(context.Background(), level) {
		c.log.Log(context.Background(), level, "tuner for "+sys.Name+": "+c.tuner.String(), "subsys", "TUNING")
	}
}

// choose picks the algorithm for a collective of the given size in bytes
// (each rank's input: the all-gather's block). scaled says whether the op
// pre-scales inputs (PreMulSum, float Avg), which rules out plans that
// read a rank's input twice.
func (c *Comm) choose(coll algo.Collective, bytes int, scaled bool) algo.Algorithm {
	return c.tuner.Choose(coll, bytes, scaled)
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
	case algo.Doubling:
		return algo.DoublingAllReduce(n, r)
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
// schedules (a job on one host, with one rank per host, or with hosts of
// different sizes keeps the flat ones) and the tuner.
func (c *Comm) setHosts(hostOf []string) {
	c.hier = nil
	clear(c.plans)
	c.lastPlan = nil
	c.retune(hostOf)
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
		c.log.Info(fmt.Sprintf("%d hosts of %d ranks: hierarchical all-reduce and all-gather where the tuner picks them", len(lay.Hosts), lay.PerHost()), "subsys", "TUNING")
	}
}

// setRingOrder lays the rings over the ranks in order (ring position i is
// rank order[i]); nil or the identity keeps rank order.
func (c *Comm) setRingOrder(order []int) error {
	clear(c.plans)
	c.lastPlan = nil
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

// intraOverNetwork reports whether no two ranks of one host share memory
// (each host has at most one rank that published a shared-memory address:
// GCCL_SHM_DISABLE=1, or /dev/shm unusable), while some host has several:
// their pairs go over a network transport, which the tuner prices as TCP
// inside a host. Every rank computes it from the same descriptors (hosts
// and shm by rank), so all choose the same schedules.
func intraOverNetwork(hosts []string, shm []bool) bool {
	ranks, withShm := map[string]int{}, map[string]int{}
	several := false
	for p, h := range hosts {
		ranks[h]++
		several = several || ranks[h] > 1
		if shm[p] {
			withShm[h]++
			if withShm[h] > 1 {
				return false
			}
		}
	}
	return several
}
