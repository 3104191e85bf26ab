package main

import (
	"testing"
	"time"

	"github.com/gccl/gccl/comm"
)

// allReduceFloat64 applies op to the values as an all-reduce would.
func allReduceFloat64(values []float64, op comm.Op) float64 {
	acc := values[0]
	for _, v := range values[1:] {
		switch op.Kind {
		case comm.OpMin:
			acc = min(acc, v)
		case comm.OpMax:
			acc = max(acc, v)
		default:
			acc += v
		}
	}
	return acc
}

// Combining times across processes with one all-reduce gives what
// combining them in one process gives, for every -a.
func TestTimeReductionMatchesCombineTimes(t *testing.T) {
	for _, times := range [][]time.Duration{
		{30, 10, 50},
		{7 * time.Millisecond, 7*time.Millisecond + 1, 7*time.Millisecond + 2},
		{123456789, 1, 987654321, 42},
		{5 * time.Second},
	} {
		for _, mode := range []averageMode{averageRank0, averageMean, averageMin, averageMax} {
			contributions := make([]float64, len(times))
			for r, d := range times {
				contributions[r] = timeContribution(mode, r, d)
			}
			reduced := allReduceFloat64(contributions, timeReductionOp(mode))
			got := timeFromReduction(mode, reduced, len(times))
			if want := combineTimes(times, mode); got != want {
				t.Errorf("-a %d over %v: all-reduce gives %v, in-process %v", mode, times, got, want)
			}
		}
	}
}
