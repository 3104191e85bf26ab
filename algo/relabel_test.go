package algo_test

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/algo/ring"
	"github.com/gccl/gccl/algo/sim"
	"github.com/gccl/gccl/algo/tree"
)

// Every ring schedule laid over random rank orders is still correct and
// deadlock-free: relabelling is how the communicator follows the topology.
func TestRelabelSimulates(t *testing.T) {
	gens := map[string]func(n, pos, rootPos int) *algo.Plan{
		"allreduce":     func(n, pos, _ int) *algo.Plan { return ring.AllReduce(n, pos) },
		"reducescatter": func(n, pos, _ int) *algo.Plan { return ring.ReduceScatter(n, pos) },
		"allgather":     func(n, pos, _ int) *algo.Plan { return ring.AllGather(n, pos) },
		"broadcast":     ring.Broadcast,
		"reduce":        ring.Reduce,
		"tree-reduce":   tree.Reduce,
		"direct-gather": algo.DirectGather,
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for name, gen := range gens {
		for n := 1; n <= 9; n++ {
			for trial := 0; trial < 3; trial++ {
				order := rng.Perm(n)
				rootPos := rng.IntN(n)
				plans := make([]*algo.Plan, n)
				for pos := range n {
					p, err := algo.Relabel(gen(n, pos, rootPos), order)
					if err != nil {
						t.Fatal(err)
					}
					if err := p.Validate(); err != nil {
						t.Fatalf("%s n=%d order %v: %v", name, n, order, err)
					}
					plans[p.Rank] = p
				}
				for _, opt := range []sim.Options{{QueueCap: 2, Chunks: 3}, {QueueCap: 4, Chunks: 1, Order: sim.Random, Seed: 7}} {
					if err := sim.Run(plans, opt); err != nil {
						t.Fatalf("%s n=%d order %v root position %d: %v", name, n, order, rootPos, err)
					}
				}
			}
		}
	}
}

func TestRelabelRejectsBadOrders(t *testing.T) {
	p := ring.AllReduce(3, 0)
	for _, order := range [][]int{{0, 1}, {0, 1, 1}, {0, 1, 3}, {-1, 0, 1}} {
		if _, err := algo.Relabel(p, order); err == nil || !strings.Contains(err.Error(), "relabel") {
			t.Errorf("order %v: %v", order, err)
		}
	}
}

// Relabelling along the identity changes nothing.
func TestRelabelIdentity(t *testing.T) {
	p := ring.ReduceScatter(4, 2)
	q, err := algo.Relabel(p, []int{0, 1, 2, 3})
	if err != nil || q.String() != p.String() {
		t.Fatalf("identity relabel:\n%s\nwant\n%s (%v)", q, p, err)
	}
}
