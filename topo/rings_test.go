package topo

import (
	"slices"
	"strings"
	"testing"
)

func TestRingOrderAzure(t *testing.T) {
	g := loadFixture(t, "azure-ndv4-8xA100-ib-topo.xml")
	// Devices in bus-id order, which interleaves the NUMA nodes' GPUs
	// badly: 0001,0002 (numa1), 0003,0004 (numa0), 000b,000c (numa3),
	// 000d,000e (numa2).
	devs := g.sortedNodes(GPU)
	order := g.RingOrder(devs)
	st := g.RingStats(devs, order)
	// Four bridges on four sockets: a ring must cross sockets 4 times, and
	// each pair under one bridge should be neighbours (PIX).
	if st.NUMACrossings != 4 {
		t.Errorf("ring %v crosses NUMA nodes %d times, want 4", order, st.NUMACrossings)
	}
	pix := 0
	for _, ty := range st.Types {
		if ty == PathPIX {
			pix++
		}
	}
	if pix != 4 {
		t.Errorf("ring %v has %d PIX hops (%v), want 4", order, pix, st.Types)
	}
	if seen := slices.Clone(order); len(seen) != 8 {
		t.Fatalf("ring %v", order)
	} else {
		slices.Sort(seen)
		for i, v := range seen {
			if v != i {
				t.Fatalf("ring %v is not a permutation", order)
			}
		}
	}
}

func TestRingOrderIBM(t *testing.T) {
	g := loadFixture(t, "ibm-gx3d-8xH100-nvswitch-roce-topo-dump.xml")
	devs := g.sortedNodes(GPU)
	order := g.RingOrder(devs)
	st := g.RingStats(devs, order)
	if !near(st.MinBW, 18*BWNVLinkSM90) || st.NUMACrossings != 2 {
		t.Errorf("ring %v: bottleneck %.1f, %d crossings; want %.1f and 2", order, st.MinBW, st.NUMACrossings, 18*BWNVLinkSM90)
	}
}

func TestRingOrderLarge(t *testing.T) {
	// 16 ranks on the 4 Azure NUMA nodes, 4 each, listed round-robin: the
	// heuristic path (over 9 entries) must still group them by node.
	g := loadFixture(t, "azure-ndv4-8xA100-ib-topo.xml")
	cpus := g.sortedNodes(CPU)
	var devs []*Node
	for i := 0; i < 16; i++ {
		devs = append(devs, cpus[i%4])
	}
	order := g.RingOrder(devs)
	st := g.RingStats(devs, order)
	if st.NUMACrossings != 4 {
		var s []string
		for _, o := range order {
			s = append(s, devs[o].ID)
		}
		t.Errorf("16-rank ring crosses %d times, want 4: %s", st.NUMACrossings, strings.Join(s, " "))
	}
}

func TestCPUSet(t *testing.T) {
	s, err := ParseCPUMask("ffffffff,ffffffff,ffff0000,00000000,00000000")
	if err != nil {
		t.Fatal(err)
	}
	if s.String() != "80-159" || s.Count() != 80 {
		t.Errorf("mask: %s (%d)", s, s.Count())
	}
	if m := s.Mask(5); m != "ffffffff,ffffffff,ffff0000,00000000,00000000" {
		t.Errorf("Mask: %s", m)
	}
	l, err := ParseCPUList("0-2,5,7-8")
	if err != nil || l.String() != "0-2,5,7-8" {
		t.Errorf("list: %s %v", l, err)
	}
	for _, bad := range []string{"x", "3-1", "-1", "1,,2", "99999999"} {
		if _, err := ParseCPUList(bad); err == nil {
			t.Errorf("ParseCPUList(%q): no error", bad)
		}
	}
	for _, bad := range []string{"", "g", "123456789", "ff,,ff"} {
		if _, err := ParseCPUMask(bad); err == nil {
			t.Errorf("ParseCPUMask(%q): no error", bad)
		}
	}
}

func TestPathTypeNames(t *testing.T) {
	for p := PathLOC; p <= PathDIS; p++ {
		back, err := ParsePathType(p.String())
		if err != nil || back != p {
			t.Errorf("%v: parsed back as %v, %v", p, back, err)
		}
	}
	if _, err := ParsePathType("NVX"); err == nil {
		t.Error("no error for an unknown class")
	}
	if s := PathType(42).String(); s != "PathType(42)" {
		t.Errorf("out of range: %q", s)
	}
}

// ringOrderRanks is the device list of a 384-rank host (one rank per
// core) on the Azure fixture: its CPUs, each repeated.
func ringOrderRanks(t testing.TB) (*Graph, []*Node) {
	t.Helper()
	g := loadFixture(t, "azure-ndv4-8xA100-ib-topo.xml")
	devs := make([]*Node, 384)
	for i := range devs {
		devs[i] = g.Nodes[CPU][i*len(g.Nodes[CPU])/len(devs)]
	}
	return g, devs
}

// Job.RingOrder runs at Init over every rank of a host, hundreds of them
// where there is a rank per core; the heuristic still finds the fewest NUMA
// crossings. How long it takes is BenchmarkRingOrderManyRanks' business.
func TestRingOrderManyRanks(t *testing.T) {
	g, devs := ringOrderRanks(t)
	order := g.RingOrder(devs)
	if st := g.RingStats(devs, order); st.NUMACrossings != len(g.Nodes[CPU]) {
		t.Errorf("%d NUMA crossings, want %d", st.NUMACrossings, len(g.Nodes[CPU]))
	}
}

// TestRingOrderOneDevice: ranks that all share one device (CPU ranks of a
// one-NUMA host) keep their order, whether the search is exact or not.
func TestRingOrderOneDevice(t *testing.T) {
	g, devs := ringOrderRanks(t)
	for _, n := range []int{5, 200} {
		same := make([]*Node, n)
		for i := range same {
			same[i] = devs[0]
		}
		order := g.RingOrder(same)
		for i, r := range order {
			if r != i {
				t.Fatalf("%d ranks on one device: order %v, want the identity", n, order)
			}
		}
	}
}
