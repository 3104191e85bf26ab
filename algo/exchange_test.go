package algo_test

import (
	"testing"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/algo/sim"
)

func TestExchangeAllReduce(t *testing.T) {
	for _, n := range []int{1, 2} {
		plans := make([]*algo.Plan, n)
		for r := range plans {
			plans[r] = algo.ExchangeAllReduce(n, r)
			if err := plans[r].Validate(); err != nil {
				t.Fatal(err)
			}
			if !plans[r].Unscaled {
				t.Fatal("the exchange reads In twice and must say so")
			}
		}
		for _, q := range []int{1, 4} {
			for _, c := range []int{1, 3} {
				if err := sim.Run(plans, sim.Options{QueueCap: q, Chunks: c}); err != nil {
					t.Fatalf("n=%d K=%d C=%d: %v", n, q, c, err)
				}
			}
		}
	}
	// Without the Unscaled mark the simulator rejects the second read of
	// In, which is what keeps pre-scaled ops away from this plan.
	plans := []*algo.Plan{algo.ExchangeAllReduce(2, 0), algo.ExchangeAllReduce(2, 1)}
	for _, p := range plans {
		p.Unscaled = false
	}
	if err := sim.Run(plans, sim.Options{QueueCap: 1, Chunks: 1}); err == nil {
		t.Fatal("simulator accepted an unmarked plan that reads In twice")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("ExchangeAllReduce accepted 3 ranks")
		}
	}()
	algo.ExchangeAllReduce(3, 0)
}
