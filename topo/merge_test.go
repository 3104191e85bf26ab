package topo

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMergeHosts(t *testing.T) {
	ibm, err := os.ReadFile(filepath.Join("testdata", "ibm-gx3d-8xH100-nvswitch-roce-topo-dump.xml"))
	if err != nil {
		t.Fatal(err)
	}
	aws, err := os.ReadFile(filepath.Join("testdata", "aws-p5.48xlarge-8xH100-efa-topo.xml"))
	if err != nil {
		t.Fatal(err)
	}
	// Ranks 0,2 on host a, 1,3 on host b: hosts ordered by lowest rank.
	job, err := Merge([]RankTopology{{"a", ibm}, {"b", aws}, {"a", ibm}, {"b", aws}})
	if err != nil {
		t.Fatal(err)
	}
	if len(job.Hosts) != 2 || job.Hosts[0].ID != "a" || job.Hosts[1].ID != "b" {
		t.Fatalf("hosts %+v", job.Hosts)
	}
	if got := job.RankHost; got[0] != 0 || got[1] != 1 || got[2] != 0 || got[3] != 1 {
		t.Errorf("RankHost %v", got)
	}
	if r := job.Hosts[1].Ranks; len(r) != 2 || r[0] != 1 || r[1] != 3 {
		t.Errorf("host b ranks %v", r)
	}
	if len(job.Hosts[0].Graph.Nodes[GPU]) != 8 || len(job.Hosts[1].Graph.Nodes[NIC]) != 32 {
		t.Error("hosts' graphs lost devices in the merge")
	}
	// GPU to GPU across hosts: NET, at the slower end's NIC (EFA 100 Gb/s
	// = 12.5 GB/s, against IBM's 200 Gb/s).
	a, b := job.Hosts[0].Graph.Nodes[GPU][0], job.Hosts[1].Graph.Nodes[GPU][0]
	if p := job.InterHostPath(0, a, 1, b); p.Type != PathNET || !near(p.BW, 12) {
		t.Errorf("across hosts: %s %.2f, want NET 12 (the EFA NIC's Gen4 x8 link)", p.Type, p.BW)
	}
	if p := job.InterHostPath(0, a, 0, job.Hosts[0].Graph.Nodes[GPU][1]); p.Type != PathNVL {
		t.Errorf("same host: %s, want NVL", p.Type)
	}
}

func TestMergeFusesPartialViews(t *testing.T) {
	// Two ranks of one host, each knowing its own GPU and NIC.
	r0 := `<system version="1"><cpu numaid="0" affinity="0000000f"><pci busid="0000:01:00.0" class="0x060400" link_speed="16.0 GT/s PCIe" link_width="16">
<pci busid="0000:02:00.0" class="0x030200"><gpu dev="0" sm="80" rank="0"/></pci></pci></cpu></system>`
	r1 := `<system version="1"><cpu numaid="0" affinity="0000000f"><pci busid="0000:01:00.0" class="0x060400" link_speed="16.0 GT/s PCIe" link_width="16">
<pci busid="0000:03:00.0" class="0x030200"><gpu dev="1" sm="80" rank="1"/></pci>
<pci busid="0000:04:00.0" class="0x020000"><nic><net name="mlx5_0" speed="200000"/></nic></pci></pci></cpu></system>`
	job, err := Merge([]RankTopology{{"h", []byte(r0)}, {"h", []byte(r1)}})
	if err != nil {
		t.Fatal(err)
	}
	g := job.Hosts[0].Graph
	if len(g.Nodes[GPU]) != 2 || len(g.Nodes[NIC]) != 1 || len(g.Nodes[PCI]) != 1 {
		t.Fatalf("fused graph: %d GPUs, %d NICs, %d switches; want 2, 1, 1", len(g.Nodes[GPU]), len(g.Nodes[NIC]), len(g.Nodes[PCI]))
	}
	if p := g.Path(g.Find(GPU, "0000:02:00.0"), g.Find(NIC, "0000:04:00.0")); p.Type != PathPIX {
		t.Errorf("rank 0's GPU to rank 1's NIC: %s, want PIX", p.Type)
	}
}

func TestMergeErrors(t *testing.T) {
	good := []byte(`<system><cpu numaid="0" affinity="f"/></system>`)
	cases := map[string][]RankTopology{
		"no ranks":  nil,
		"no host":   {{"", good}},
		"bad xml":   {{"h", []byte("<system>")}},
		"bad graph": {{"h", []byte(`<system><cpu/></system>`)}},
		"disagree":  {{"h", good}, {"h", []byte(`<system><cpu numaid="0" affinity="3"/></system>`)}},
	}
	for name, ranks := range cases {
		_, err := Merge(ranks)
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		if name == "disagree" && !strings.Contains(err.Error(), "affinity") {
			t.Errorf("disagreement error %q does not name the attribute", err)
		}
	}
}

func TestJobRingOrder(t *testing.T) {
	azure, err := os.ReadFile(filepath.Join("testdata", "azure-ndv4-8xA100-ib-topo.xml"))
	if err != nil {
		t.Fatal(err)
	}
	// 16 ranks alternating between two hosts; each host's local rank l
	// runs on GPU l in file order.
	var ranks []RankTopology
	for r := 0; r < 16; r++ {
		ranks = append(ranks, RankTopology{HostID: []string{"a", "b"}[r%2], XML: azure})
	}
	job, err := Merge(ranks)
	if err != nil {
		t.Fatal(err)
	}
	dev := make([]*Node, 16)
	for h, host := range job.Hosts {
		for l, r := range host.Ranks {
			dev[r] = job.Hosts[h].Graph.Nodes[GPU][l]
		}
	}
	ring, err := job.RingOrder(dev)
	if err != nil {
		t.Fatal(err)
	}
	if len(ring) != 16 {
		t.Fatalf("ring %v", ring)
	}
	hostCrossings, numaCrossings := 0, 0
	for i, r := range ring {
		next := ring[(i+1)%len(ring)]
		if job.RankHost[r] != job.RankHost[next] {
			hostCrossings++
			continue
		}
		g := job.Hosts[job.RankHost[r]].Graph
		if g.LocalCPU(dev[r]) != g.LocalCPU(dev[next]) {
			numaCrossings++
		}
	}
	// Two hosts: the ring leaves each once. Inside each host, 4 sockets in
	// a line: 3 crossings (the 4th is the hop to the other host).
	if hostCrossings != 2 || numaCrossings != 6 {
		t.Errorf("ring %v: %d host and %d NUMA crossings, want 2 and 6", ring, hostCrossings, numaCrossings)
	}
	other := loadFixture(t, "azure-ndv4-8xA100-ib-topo.xml")
	dev[3] = other.Nodes[GPU][0]
	if _, err := job.RingOrder(dev); err == nil {
		t.Error("no error for a device of another graph")
	}
	if _, err := job.RingOrder(dev[:3]); err == nil {
		t.Error("no error for too few devices")
	}
}

// TestJobRingCutPrefersNUMACrossing: on an NVSwitch host every hop is NVL at
// one bandwidth, so only the NUMA crossing tells the hops apart; the host's
// ring must be opened at a crossing, leaving one crossing inside the host.
// The cut used to stay at the closing hop whatever it crossed.
func TestJobRingCutPrefersNUMACrossing(t *testing.T) {
	ibm, err := os.ReadFile(filepath.Join("testdata", "ibm-gx3d-8xH100-nvswitch-roce-topo-dump.xml"))
	if err != nil {
		t.Fatal(err)
	}
	var ranks []RankTopology
	for r := 0; r < 8; r++ {
		ranks = append(ranks, RankTopology{HostID: []string{"a", "b"}[r/4], XML: ibm})
	}
	job, err := Merge(ranks)
	if err != nil {
		t.Fatal(err)
	}
	// Local ranks 0..3 of each host on GPUs 0 (NUMA 0), 4, 5 (NUMA 1), 1
	// (NUMA 0): the host's ring crosses NUMA nodes twice, and its closing
	// hop (GPU 1 to GPU 0) does not cross.
	var dev []*Node
	for _, h := range job.Hosts {
		gpus := h.Graph.Nodes[GPU]
		dev = append(dev, gpus[0], gpus[4], gpus[5], gpus[1])
	}
	ring, err := job.RingOrder(dev)
	if err != nil {
		t.Fatal(err)
	}
	if len(ring) != 8 {
		t.Fatalf("ring %v, want 8 ranks", ring)
	}
	for h, host := range job.Hosts {
		g, crossings := host.Graph, 0
		for i := 4 * h; i+1 < 4*h+4; i++ {
			if job.RankHost[ring[i]] != h || job.RankHost[ring[i+1]] != h {
				t.Fatalf("ring %v: host %d's ranks are not consecutive", ring, h)
			}
			if g.LocalCPU(dev[ring[i]]) != g.LocalCPU(dev[ring[i+1]]) {
				crossings++
			}
		}
		if crossings != 1 {
			t.Errorf("ring %v: host %d's ranks cross NUMA nodes %d times, want 1 (cut at a crossing)", ring, h, crossings)
		}
	}
}

// Two ranks that describe the same things in different but equal spellings
// agree: a CPU mask printed with more leading zero words (a rank that saw
// more NUMA nodes prints wider masks), a bus id without its domain or in
// upper case, an NVLink target in NVML's 8-digit form. Siblings that share
// a key (two <nic> straight under a <cpu>) are matched in order, so that
// two identical documents fuse to the same document.
func TestMergeEqualSpellings(t *testing.T) {
	r0 := `<system version="1">
<cpu numaid="0" affinity="00000000,00000000,ffffffff,ffffffff"><pci busid="0000:0a:00.0" class="0x030200"><gpu dev="0" sm="80"><nvlink target="0000:0b:00.0" count="2"/></gpu></pci></cpu>
<cpu numaid="1" affinity="ffffffff,ffffffff,00000000,00000000"/></system>`
	r1 := `<system version="1">
<cpu numaid="0" affinity="ffffffff,ffffffff"><pci busid="0A:00.0" class="0x030200"><gpu dev="0" sm="80"><nvlink target="00000000:0B:00.0" count="2"/></gpu></pci>
<pci busid="0000:0b:00.0" class="0x030200"><gpu dev="1" sm="80"><nvlink target="0000:0a:00.0" count="2"/></gpu></pci></cpu></system>`
	job, err := Merge([]RankTopology{{"h", []byte(r0)}, {"h", []byte(r1)}})
	if err != nil {
		t.Fatal(err)
	}
	g := job.Hosts[0].Graph
	a, b := g.Find(GPU, "0000:0a:00.0"), g.Find(GPU, "0000:0b:00.0")
	if a == nil || b == nil || len(g.Nodes[GPU]) != 2 {
		t.Fatalf("GPUs %v", ids(g.Nodes[GPU]))
	}
	if n := g.NVLinks(a); n != 2 {
		t.Errorf("GPU0 has %d NVLinks after the merge, want 2", n)
	}
	if p := g.Path(a, b); p.Type != PathNVL {
		t.Errorf("GPU0 -> GPU1: %s, want NVL", p.Type)
	}

	twoNICs := []byte(`<system version="1"><cpu numaid="0" affinity="f"><nic><net name="eth0" speed="10000"/></nic><nic><net name="eth1" speed="10000"/></nic></cpu></system>`)
	job, err = Merge([]RankTopology{{"h", twoNICs}, {"h", twoNICs}})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(MarshalXML(job.Hosts[0].Graph.Doc)); got != string(MarshalXML(mustParse(t, twoNICs))) {
		t.Errorf("two identical documents fused to\n%s", got)
	}
}

func mustParse(t *testing.T, b []byte) *Element {
	t.Helper()
	doc, err := ParseXML(strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// A rank that detected the whole host writes rank="-1" (unknown) on every
// GPU; a rank that describes only its own GPU writes its rank there. The
// views agree, and the merged GPU carries the known rank.
func TestMergeUnknownGPURank(t *testing.T) {
	whole := `<system version="1"><cpu numaid="0" affinity="f">
<pci busid="0000:01:00.0" class="0x030200"><gpu dev="0" sm="80" rank="-1"/></pci>
<pci busid="0000:02:00.0" class="0x030200"><gpu dev="1" sm="80" rank="-1"/></pci></cpu></system>`
	own := `<system version="1"><cpu numaid="0" affinity="f">
<pci busid="0000:02:00.0" class="0x030200"><gpu dev="1" sm="80" rank="1"/></pci></cpu></system>`
	for _, order := range [][]string{{whole, own}, {own, whole}} {
		job, err := Merge([]RankTopology{{"h", []byte(order[0])}, {"h", []byte(order[1])}})
		if err != nil {
			t.Fatal(err)
		}
		g := job.Hosts[0].Graph
		if gpu := g.Find(GPU, "0000:02:00.0"); gpu == nil || gpu.GPU.Rank != 1 {
			t.Errorf("GPU 1: %+v, want rank 1", gpu)
		}
	}
}
