package algo_test

import (
	"strings"
	"testing"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/algo/internal/gentest"
	"github.com/gccl/gccl/algo/sim"
)

var determ = []gentest.Generator{
	{Name: "determ_allreduce", Gen: func(n, rank, _ int) *algo.Plan { return algo.DeterministicAllReduce(n, rank) }},
	{Name: "determ_reducescatter", Gen: func(n, rank, _ int) *algo.Plan { return algo.DeterministicReduceScatter(n, rank) }},
}

func TestDeterministicGolden(t *testing.T) { gentest.Golden(t, determ, *update) }

// TestDeterministicSimulate proves the plans (no deadlock, right result at
// one and two slots per connection, one and three chunks) and, beyond that,
// that every result is the left fold of the contributions in rank order.
func TestDeterministicSimulate(t *testing.T) {
	gentest.Simulate(t, determ)
	for _, g := range determ {
		for _, n := range gentest.SimSizes {
			plans := sim.Plans(n, func(r int) *algo.Plan { return g.Gen(n, r, 0) })
			for _, opts := range gentest.SimOptions(1) {
				if err := sim.RunRankOrder(plans, opts); err != nil {
					t.Errorf("%s n=%d %+v: %v", g.Name, n, opts, err)
				}
			}
		}
	}
}

// The one-exchange all-reduce folds as x2 op (x1 op x0), the operands out
// of place; the rank-order check must see it, or it proves nothing.
func TestRankOrderCatchesExchange(t *testing.T) {
	plans := sim.Plans(3, func(r int) *algo.Plan { return algo.ExchangeAllReduce(3, r) })
	err := sim.RunRankOrder(plans, sim.Options{QueueCap: 2, Chunks: 1})
	if err == nil || !strings.Contains(err.Error(), "not in rank order") {
		t.Fatalf("the exchange all-reduce (x2 op (x1 op x0)) passed the rank-order check: %v", err)
	}
}

func TestDeterministicPlansReadInOnce(t *testing.T) {
	for _, n := range gentest.SimSizes {
		for r := range n {
			for _, p := range []*algo.Plan{algo.DeterministicAllReduce(n, r), algo.DeterministicReduceScatter(n, r)} {
				if err := p.Validate(); err != nil {
					t.Fatal(err)
				}
				if p.Unscaled || p.NBlocks != n || p.Algo != algo.Direct {
					t.Fatalf("n=%d rank %d: header %+v: want Direct, n blocks, not Unscaled (PreMulSum must run on it)", n, r, p)
				}
			}
		}
	}
}
