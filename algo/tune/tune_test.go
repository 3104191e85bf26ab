package tune

import (
	"bytes"
	"errors"
	"flag"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/topo"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func fixture(name string) string { return filepath.Join("..", "..", "topo", "testdata", name) }

const (
	ibmFile   = "ibm-gx3d-8xH100-nvswitch-roce-topo-dump.xml"
	awsFile   = "aws-p5.48xlarge-8xH100-efa-topo.xml"
	azureFile = "azure-ndv4-8xA100-ib-topo.xml"
)

func system(t *testing.T, file string, nodes int) System {
	t.Helper()
	g, err := topo.ReadFile(fixture(file))
	if err != nil {
		t.Fatal(err)
	}
	sys, err := FromGraph(file, g, nodes, 0)
	if err != nil {
		t.Fatal(err)
	}
	return sys
}

// The published nccl-tests figure for 8x H100 SXM over NVSwitch, ring
// all-reduce without NVLink SHARP, at large sizes: about 370 GB/s busbw.
const publishedH100RingBusBW = 370.0

func TestIBMH100RingAllReduce(t *testing.T) {
	sys := system(t, ibmFile, 1)
	// The intra-node figure is the graph's: 18 NVLinks × NCCL's 20.6 GB/s.
	if want := 18 * topo.BWNVLinkSM90; math.Abs(sys.Intra.BW-want) > 1e-9 {
		t.Fatalf("intra bandwidth %.2f, want 18 × 20.6 = %.2f", sys.Intra.BW, want)
	}
	if sys.Intra.LatencyUs != NCCLNVLinkLatencyUs {
		t.Errorf("intra latency %.1f, want NVLink's %.1f", sys.Intra.LatencyUs, NCCLNVLinkLatencyUs)
	}
	for _, size := range []int64{1 << 30, 8 << 30} {
		p, err := Predict(sys, algo.AllReduce, size)
		if err != nil {
			t.Fatal(err)
		}
		ring := p.ByAlgorithm[algo.Ring]
		if rel := math.Abs(ring.BusBW-publishedH100RingBusBW) / publishedH100RingBusBW; rel > 0.20 {
			t.Errorf("%d B: ring busbw %.1f GB/s, %.0f%% from the published %.0f", size, ring.BusBW, 100*rel, publishedH100RingBusBW)
		}
		if p.Algorithm != algo.Ring {
			t.Errorf("%d B on one node: chose %s, want ring", size, p.Algorithm)
		}
		// The figure is the model's arithmetic, not a constant: time =
		// base + 14 steps + bytes × 2·7/8 / bw.
		want := NCCLBaseLatencyUs + 14*NCCLNVLinkLatencyUs + float64(size)*2*7/8/(sys.Intra.BW*1e3)
		if math.Abs(ring.TimeUs-want) > 1e-6*want {
			t.Errorf("%d B: time %.3f µs, want %.3f", size, ring.TimeUs, want)
		}
	}
}

func TestChoiceAcrossSizesAndNodes(t *testing.T) {
	// 64 nodes: trees' log2 latency wins small messages, rings win large.
	sys := system(t, ibmFile, 64)
	small, err := Predict(sys, algo.AllReduce, 8)
	if err != nil {
		t.Fatal(err)
	}
	if small.Algorithm == algo.Ring {
		t.Errorf("8 B on 64 nodes: chose ring (%.0f µs) over tree (%.0f µs)", small.TimeUs, small.ByAlgorithm[algo.Tree].TimeUs)
	}
	large, err := Predict(sys, algo.AllReduce, 8<<30)
	if err != nil {
		t.Fatal(err)
	}
	if large.Algorithm == algo.Tree {
		t.Errorf("8 GiB on 64 nodes: chose tree")
	}
	// Across nodes the network bounds the ring: 8 × 200 Gb/s = 200 GB/s.
	if r := large.ByAlgorithm[algo.Ring].BusBW; r > 200 || r < 180 {
		t.Errorf("8 GiB ring busbw on 64 nodes %.1f, want just under 200", r)
	}
	// Time grows with size for every algorithm.
	prev := [algo.NumAlgorithms]float64{}
	for size := int64(8); size <= 1<<30; size *= 4 {
		p, err := Predict(sys, algo.AllReduce, size)
		if err != nil {
			t.Fatal(err)
		}
		for a := algo.Algorithm(0); a < algo.NumAlgorithms; a++ {
			if e := p.ByAlgorithm[a]; e.Supported && e.TimeUs < prev[a] {
				t.Errorf("%s: %d B takes %.2f µs, less than a smaller size's %.2f", a, size, e.TimeUs, prev[a])
			} else {
				prev[a] = e.TimeUs
			}
		}
		if p.TimeUs > min(p.ByAlgorithm[algo.Ring].TimeUs, p.ByAlgorithm[algo.Tree].TimeUs, p.ByAlgorithm[algo.Hier].TimeUs) {
			t.Errorf("%d B: chosen %s is not the fastest", size, p.Algorithm)
		}
	}
	// Only all-reduce has trees and the hierarchical schedule.
	p, err := Predict(sys, algo.AllGather, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if p.Algorithm != algo.Ring || p.ByAlgorithm[algo.Tree].Supported || p.ByAlgorithm[algo.Hier].Supported {
		t.Errorf("all-gather: %+v", p)
	}
}

func TestPCIOnlySkeletons(t *testing.T) {
	// Without NVLink in the file, rings run over PCI: bounded by the
	// narrowest hop (AWS: Gen4 x16 switch uplinks, 24 GB/s; Azure: AMD's
	// 16 GB/s between sockets).
	for _, c := range []struct {
		file string
		bw   float64
	}{{awsFile, 24}, {azureFile, topo.BWAMD}} {
		sys := system(t, c.file, 1)
		if math.Abs(sys.Intra.BW-c.bw) > 1e-9 || sys.Intra.LatencyUs != NCCLPCILatencyUs {
			t.Errorf("%s: intra %+v, want %.1f GB/s at PCI latency", c.file, sys.Intra, c.bw)
		}
	}
	// Two AWS nodes: 32 EFA NICs, each limited by its Gen4 x8 link (12 GB/s).
	if sys := system(t, awsFile, 2); math.Abs(sys.Inter.BW-32*12) > 1e-9 {
		t.Errorf("p5 network %.1f GB/s, want 384", sys.Inter.BW)
	}
	// Azure's NICs have no ports in the file: their PCI links count.
	if sys := system(t, azureFile, 2); math.Abs(sys.Inter.BW-8*24) > 1e-9 {
		t.Errorf("NDv4 network %.1f GB/s, want 8 × 24", sys.Inter.BW)
	}
}

// Measured on this machine (docs/PERFORMANCE.md): 2-rank all-reduce times
// the calibration did not use.
func TestThisMachineAgainstMeasurements(t *testing.T) {
	cases := []struct {
		transport string
		bytes     int64
		measured  float64 // µs
	}{
		{"shm", 1 << 20, 342}, {"shm", 16 << 20, 5250}, {"shm", 256 << 20, 93200},
		{"tcp", 1 << 20, 800}, {"tcp", 16 << 20, 10600},
	}
	for _, c := range cases {
		sys, err := ThisMachine(c.transport, 2)
		if err != nil {
			t.Fatal(err)
		}
		p, err := Predict(sys, algo.AllReduce, c.bytes)
		if err != nil {
			t.Fatal(err)
		}
		if rel := math.Abs(p.ByAlgorithm[algo.Ring].TimeUs-c.measured) / c.measured; rel > 0.25 {
			t.Errorf("%s %d B: predicted %.0f µs, measured %.0f (%.0f%% off)", c.transport, c.bytes, p.ByAlgorithm[algo.Ring].TimeUs, c.measured, 100*rel)
		}
	}
	if _, err := ThisMachine("ib", 2); err == nil {
		t.Error("no error for an uncalibrated transport")
	}
}

func TestChunk(t *testing.T) {
	sys := system(t, ibmFile, 1)
	for size := int64(0); size <= 1<<32; size = size*2 + 1 {
		c := sys.chunk(algo.Ring, size)
		if c < sys.MinChunkBytes || c > sys.MaxChunkBytes || c&(c-1) != 0 {
			t.Fatalf("%d B: chunk %d not a power of two in [%d, %d]", size, c, sys.MinChunkBytes, sys.MaxChunkBytes)
		}
	}
	// Large messages on NVLink: the largest chunk (370 GB/s × 3.4 µs × 4 is
	// 5 MB). Shared memory here: 2.88 GB/s × 0.5 µs × 4 ≈ 5.8 kB -> 8 KiB.
	if c := sys.chunk(algo.Ring, 1<<30); c != sys.MaxChunkBytes {
		t.Errorf("1 GiB on H100: chunk %d", c)
	}
	host, _ := ThisMachine("shm", 2)
	if c := host.chunk(algo.Ring, 1<<30); c != 8<<10 {
		t.Errorf("1 GiB over shm: chunk %d, want 8 KiB", c)
	}
}

// TestChunkOneRankPerNode: with one rank per node the ring uses only the
// network, so the chunk comes from it (FromGraph leaves Intra zero). It used
// to take min(Intra.BW, Inter.BW) = 0 and always give MinChunkBytes.
func TestChunkOneRankPerNode(t *testing.T) {
	g, err := topo.ReadFile(fixture(ibmFile))
	if err != nil {
		t.Fatal(err)
	}
	one, err := FromGraph("ibm", g, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	// GPU 0's nearest NIC runs at 200 Gb/s: 25 GB/s × 14 µs × 4 = 1.4 MB,
	// rounded up to 2 MiB.
	if one.Inter.BW != 25 || one.Inter.LatencyUs != NCCLNetLatencyUs {
		t.Fatalf("network %.1f GB/s, %.1f µs; want 25 GB/s, %.1f µs", one.Inter.BW, one.Inter.LatencyUs, NCCLNetLatencyUs)
	}
	p, err := Predict(one, algo.AllReduce, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(2 << 20); p.ChunkBytes != want {
		t.Errorf("1 GiB, 2 nodes x 1 rank: chunk %d, want %d", p.ChunkBytes, want)
	}
	// A rank's share still bounds it: 1 MiB over 2 ranks is 512 KiB.
	if c := one.chunk(algo.Ring, 1<<20); c != 512<<10 {
		t.Errorf("1 MiB, 2 nodes x 1 rank: chunk %d, want %d", c, 512<<10)
	}
	// One rank in all moves nothing: the smallest chunk.
	alone, err := FromGraph("ibm", g, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if c := alone.chunk(algo.Ring, 1<<30); c != alone.MinChunkBytes {
		t.Errorf("1 GiB, one rank: chunk %d, want %d", c, alone.MinChunkBytes)
	}
}

// TestTableStepsStopAtMaxInt64: a step past math.MaxInt64 ends the table.
// size × StepFactor used to wrap to a larger positive size (1e18 × 1000 to
// 3875820019684212736) and be priced as the next row.
func TestTableStepsStopAtMaxInt64(t *testing.T) {
	sys := system(t, ibmFile, 1)
	rows, err := Table(sys, TableSpec{Collective: algo.AllReduce, MinBytes: 1, MaxBytes: math.MaxInt64, StepFactor: 1000, Type: "int8", TypeSize: 1, RedOp: "sum"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 7 || rows[len(rows)-1].Bytes != 1e18 {
		t.Fatalf("%d rows ending at %d bytes, want 7 (1 B to 1e18 B)", len(rows), rows[len(rows)-1].Bytes)
	}
	for i := 1; i < len(rows); i++ {
		if rows[i].Bytes != rows[i-1].Bytes*1000 {
			t.Errorf("row %d: %d bytes after %d with step factor 1000", i, rows[i].Bytes, rows[i-1].Bytes)
		}
	}
	rows, err = Table(sys, TableSpec{Collective: algo.AllReduce, MinBytes: math.MaxInt64 - 5, MaxBytes: math.MaxInt64, StepBytes: 10, Type: "int8", TypeSize: 1, RedOp: "sum"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Errorf("step bytes past math.MaxInt64: %d rows, want 1", len(rows))
	}
}

func TestErrors(t *testing.T) {
	good, _ := ThisMachine("shm", 2)
	bad := []System{
		{Nodes: 0, RanksPerNode: 1},
		{Nodes: 1, RanksPerNode: 2},
		{Nodes: 2, RanksPerNode: 1, Intra: Link{BW: 1}},
		{Nodes: 1, RanksPerNode: 2, Intra: Link{BW: 1, LatencyUs: -1}},
		{Nodes: 1, RanksPerNode: 2, Intra: Link{BW: math.NaN()}},
		{Nodes: 1, RanksPerNode: 2, Intra: Link{BW: 1}, TreeEfficiency: 2},
	}
	for _, s := range bad {
		if _, err := Predict(s, algo.AllReduce, 8); err == nil {
			t.Errorf("%+v: no error", s)
		}
	}
	if _, err := Predict(good, algo.AllReduce, -1); err == nil {
		t.Error("negative size: no error")
	}
	if _, err := Predict(good, algo.AllToAll, 8); !errors.Is(err, ErrUnsupported) {
		t.Errorf("all-to-all: %v, want ErrUnsupported", err)
	}
	spec := TableSpec{Collective: algo.AllReduce, MinBytes: 8, MaxBytes: 64, StepFactor: 2, Type: "float", TypeSize: 4, RedOp: "sum"}
	for _, mod := range []func(*TableSpec){
		func(s *TableSpec) { s.TypeSize = 0 },
		func(s *TableSpec) { s.MaxBytes = 4 },
		func(s *TableSpec) { s.StepFactor = 1 },
		func(s *TableSpec) { s.Force = "butterfly" },
		func(s *TableSpec) { s.Force = "hier" }, // one node
	} {
		s := spec
		mod(&s)
		if _, err := Table(good, s); err == nil {
			t.Errorf("%+v: no error", s)
		}
	}
	g, _ := topo.ReadFile(fixture(ibmFile))
	if _, err := FromGraph("x", g, 1, 9); err == nil {
		t.Error("9 ranks on 8 GPUs: no error")
	}
	if err := Simulate(&bytes.Buffer{}, SimOptions{TopoFile: "/nonexistent.xml", TableSpec: spec}); err == nil {
		t.Error("missing topology file: no error")
	}
}

func TestBusFactor(t *testing.T) {
	for _, c := range []struct {
		coll algo.Collective
		n    int
		want float64
	}{{algo.AllReduce, 8, 1.75}, {algo.AllGather, 8, 0.875}, {algo.ReduceScatter, 4, 0.75}, {algo.Broadcast, 8, 1}, {algo.AllReduce, 1, 1}} {
		if got := BusFactor(c.coll, c.n); got != c.want {
			t.Errorf("%s on %d: %g, want %g", c.coll, c.n, got, c.want)
		}
	}
}

// TestSimulateGolden pins the --simulate table for each fixture (one and two
// nodes). go test ./algo/tune -run Golden -update rewrites them.
func TestSimulateGolden(t *testing.T) {
	for _, file := range []string{ibmFile, awsFile, azureFile} {
		for _, nodes := range []int{1, 2} {
			var out bytes.Buffer
			err := Simulate(&out, SimOptions{TopoFile: fixture(file), Nodes: nodes, TableSpec: TableSpec{
				Collective: algo.AllReduce, MinBytes: 8, MaxBytes: 8 << 30, StepFactor: 8, Type: "float", TypeSize: 4, RedOp: "sum"}})
			if err != nil {
				t.Fatal(err)
			}
			got := out.String()
			golden := filepath.Join("testdata", strings.TrimSuffix(file, ".xml")+"-"+string(rune('0'+nodes))+"node.golden")
			if *update {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("%s differs; rerun with -update after checking:\n%s", golden, got)
			}
		}
	}
}

func TestCollectiveByName(t *testing.T) {
	for name, want := range map[string]algo.Collective{"all_reduce": algo.AllReduce, "all_gather": algo.AllGather,
		"reduce_scatter": algo.ReduceScatter, "broadcast": algo.Broadcast, "reduce": algo.Reduce} {
		got, ok := CollectiveByName(name)
		if !ok || got != want {
			t.Errorf("%s: %v %v", name, got, ok)
		}
		if _, err := Predict(system(t, ibmFile, 2), got, 1<<20); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, name := range []string{"alltoall", "gather", "scatter", "sendrecv", ""} {
		if _, ok := CollectiveByName(name); ok {
			t.Errorf("%s: modelled", name)
		}
	}
}
