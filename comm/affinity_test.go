package comm

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/gccl/gccl/topo"
)

func seq(lo, hi int) []int {
	var s []int
	for c := lo; c <= hi; c++ {
		s = append(s, c)
	}
	return s
}

// On the IBM 8xH100 dump (two NUMA nodes), eight local ranks are spread in
// blocks over the two nodes; the inherited mask narrows the choice, and a
// mask that leaves one CPU, or none of the node's, is reported.
func TestProgressCPUs(t *testing.T) {
	g, err := topo.ReadFile("../topo/testdata/ibm-gx3d-8xH100-nvswitch-roce-topo-dump.xml")
	if err != nil {
		t.Fatal(err)
	}
	numas := g.Nodes[topo.CPU]
	if len(numas) != 2 {
		t.Fatalf("%d NUMA nodes in the fixture", len(numas))
	}
	node0, node1 := g.Affinity(numas[0]).CPUs(), g.Affinity(numas[1]).CPUs()
	all := append(append([]int(nil), node0...), node1...)
	for r := range 8 {
		cpus, warn := progressCPUs(g, r, 8, all)
		want := node0
		if r >= 4 {
			want = node1
		}
		if fmt.Sprint(cpus) != fmt.Sprint(want) || warn != "" {
			t.Errorf("local rank %d: CPUs %v (warning %q), want %v", r, cpus, warn, want)
		}
	}
	// Bound by the launcher to node 1's first two CPUs: rank 0 cannot
	// have node 0, and says so.
	two := node1[:2]
	if cpus, warn := progressCPUs(g, 0, 8, two); fmt.Sprint(cpus) != fmt.Sprint(two) || !strings.Contains(warn, "outside the inherited mask") {
		t.Errorf("rank 0 bound to %v: %v, %q", two, cpus, warn)
	}
	if cpus, warn := progressCPUs(g, 7, 8, two); fmt.Sprint(cpus) != fmt.Sprint(two) || warn != "" {
		t.Errorf("rank 7 bound to %v: %v, %q", two, cpus, warn)
	}
	if _, warn := progressCPUs(g, 7, 8, node1[:1]); !strings.Contains(warn, "one core") {
		t.Errorf("one CPU left: warning %q", warn)
	}
	// No graph: the inherited mask as it is.
	if cpus, warn := progressCPUs(nil, 0, 1, seq(0, 3)); fmt.Sprint(cpus) != "[0 1 2 3]" || warn != "" {
		t.Errorf("no graph: %v, %q", cpus, warn)
	}
}

// Two hosts whose ranks alternate (rank r on host r%2): the ring order from
// the merged topology keeps each host's ranks together, so the ring crosses
// the network twice instead of at every hop.
func TestOrderRingGroupsHosts(t *testing.T) {
	xml, err := os.ReadFile("../topo/testdata/ibm-gx3d-8xH100-nvswitch-roce-topo-dump.xml")
	if err != nil {
		t.Fatal(err)
	}
	rts := make([]topo.RankTopology, 8)
	for r := range rts {
		rts[r] = topo.RankTopology{HostID: fmt.Sprintf("host%d", r%2), XML: emptyTopology}
		if r < 2 {
			rts[r].XML = xml
		}
	}
	job, err := topo.Merge(rts)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := InitLocal(8, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	c := cs[0]
	c.orderRing(job)
	if c.ringOrder == nil {
		t.Fatal("no ring order: rank order kept")
	}
	crossings := 0
	for i, r := range c.ringOrder {
		if next := c.ringOrder[(i+1)%8]; r%2 != next%2 {
			crossings++
		}
	}
	if crossings != 2 {
		t.Errorf("ring %v crosses hosts %d times, want 2", c.ringOrder, crossings)
	}
	for r, pos := range c.ringPos {
		if c.ringOrder[pos] != r {
			t.Fatalf("ringPos %v does not invert ringOrder %v", c.ringPos, c.ringOrder)
		}
	}
}
