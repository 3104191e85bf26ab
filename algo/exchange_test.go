package algo_test

import (
	"testing"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/algo/internal/gentest"
	"github.com/gccl/gccl/algo/sim"
)

var exchange = []gentest.Generator{
	{Name: "exchange", Gen: func(n, rank, _ int) *algo.Plan { return algo.ExchangeAllReduce(n, rank) }},
}

func TestExchangeGolden(t *testing.T) { gentest.Golden(t, exchange, *update) }

// TestExchangeSimulate also checks, through the simulator, that every rank
// reduces the inputs in the same order with the operands in the same places.
func TestExchangeSimulate(t *testing.T) { gentest.Simulate(t, exchange) }

func TestExchangeAllReduce(t *testing.T) {
	for _, n := range gentest.SimSizes {
		for r := range n {
			p := algo.ExchangeAllReduce(n, r)
			if err := p.Validate(); err != nil {
				t.Fatal(err)
			}
			if !p.Unscaled || p.NBlocks != 1 || p.Algo != algo.Direct {
				t.Fatalf("n=%d rank %d: header %+v; the exchange is Direct, has one block and reads In twice", n, r, p)
			}
		}
	}
	// Without the Unscaled mark the simulator rejects the second read of
	// In, which is what keeps pre-scaled ops away from this plan.
	for _, n := range []int{2, 3} {
		plans := sim.Plans(n, func(r int) *algo.Plan { return algo.ExchangeAllReduce(n, r) })
		for _, p := range plans {
			p.Unscaled = false
		}
		if err := sim.Run(plans, sim.Options{QueueCap: 1, Chunks: 1}); err == nil {
			t.Fatalf("n=%d: simulator accepted an unmarked plan that reads In twice", n)
		}
	}
}
