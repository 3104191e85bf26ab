package comm

import (
	"testing"

	"github.com/gccl/gccl/algo"
)

// BenchmarkTelemetryRecord is what recording adds to every operation: the
// record's start and end, with the totals (no file).
func BenchmarkTelemetryRecord(b *testing.B) {
	cs, err := InitLocal(1, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer cs[0].Close()
	c := cs[0]
	x := make([]float32, 8)
	cl := &call{coll: algo.AllReduce, in: viewOf(x), out: viewOf(x), op: Sum, seq: 1}
	b.ReportAllocs()
	for b.Loop() {
		c.telBegin(cl)
		c.telEnd(false)
	}
}

// TestEveryPathHasAName: a record of any path reads back with its name
// (a path missing from pathNames would panic reading it).
func TestEveryPathHasAName(t *testing.T) {
	for p := pathPlan; p <= pathCMA; p++ {
		if int(p) >= len(pathNames) || pathNames[p] == "" {
			t.Errorf("path %d has no name in telemetry", p)
		}
	}
}
