package topo

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkBuild measures parsing a published file and building its graph
// with every path (what Init pays once per host).
func BenchmarkBuild(b *testing.B) {
	for _, name := range fixtureNames {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name[:4], func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				doc, err := ParseXML(bytes.NewReader(data))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := Build(doc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRingOrder8 measures the exact ring search over 8 GPUs.
func BenchmarkRingOrder8(b *testing.B) {
	g := loadFixture(b, "ibm-gx3d-8xH100-nvswitch-roce-topo-dump.xml")
	for i := 0; i < b.N; i++ {
		g.RingOrder(g.Nodes[GPU])
	}
}

// BenchmarkRingOrderManyRanks measures the heuristic ring search over a
// host of 384 ranks, as Job.RingOrder runs it at Init (384 ranks took 1.5 s
// when every scored hop looked its path up again).
func BenchmarkRingOrderManyRanks(b *testing.B) {
	g, devs := ringOrderRanks(b)
	for b.Loop() {
		g.RingOrder(devs)
	}
}

// BenchmarkDetect measures detection on this machine.
func BenchmarkDetect(b *testing.B) {
	for i := 0; i < b.N; i++ {
		if _, err := (Detector{}).Detect(); err != nil {
			b.Skip(err)
		}
	}
}
