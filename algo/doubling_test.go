package algo_test

import (
	"testing"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/algo/internal/gentest"
)

var doubling = []gentest.Generator{
	{Name: "doubling", Gen: func(n, rank, _ int) *algo.Plan { return algo.DoublingAllReduce(n, rank) }},
}

func TestDoublingGolden(t *testing.T) { gentest.Golden(t, doubling, *update) }

// TestDoublingSimulate also checks, through the simulator, that every rank
// ends with the same expression, operands in the same places.
func TestDoublingSimulate(t *testing.T) { gentest.Simulate(t, doubling) }

func TestDoublingAllReduce(t *testing.T) {
	for _, n := range gentest.SimSizes {
		for r := range n {
			p := algo.DoublingAllReduce(n, r)
			if err := p.Validate(); err != nil {
				t.Fatal(err)
			}
			if !p.Unscaled || p.NBlocks != 1 || p.Algo != algo.Doubling {
				t.Fatalf("n=%d rank %d: header %+v", n, r, p)
			}
			// log2 sends per rank of the power-of-two group, one more to
			// hand a folded rank its result; one send for a folded rank.
			sends := 0
			for _, s := range p.Phases[0] {
				if s.Prim.Sends() {
					sends++
				}
			}
			pow, lg := 1, 0
			for pow*2 <= n {
				pow, lg = pow*2, lg+1
			}
			want := lg
			switch {
			case r >= pow:
				want = 1
			case r+pow < n:
				want = lg + 1
			}
			if sends != want {
				t.Fatalf("n=%d rank %d: %d sends, want %d:\n%s", n, r, sends, want, p)
			}
		}
	}
}
