package topo

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The three published topology files, copied from ../shared/fixtures/topo.
var fixtureNames = []string{
	"ibm-gx3d-8xH100-nvswitch-roce-topo-dump.xml",
	"aws-p5.48xlarge-8xH100-efa-topo.xml",
	"azure-ndv4-8xA100-ib-topo.xml",
}

func loadFixture(t testing.TB, name string) *Graph {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := ParseXML(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	g, err := Build(doc)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return g
}

// sharedFixtureDir finds ../shared/fixtures/topo above the module root.
func sharedFixtureDir() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return filepath.Join(filepath.Dir(d), "shared", "fixtures", "topo")
		}
		if filepath.Dir(d) == d {
			return ""
		}
	}
}

func TestFixtureCopiesMatchOriginals(t *testing.T) {
	dir := sharedFixtureDir()
	if dir == "" {
		t.Skip("module root not found")
	}
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("shared fixtures not present (%v); testdata copies are used", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".xml") {
			continue
		}
		n++
		orig, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		cp, err := os.ReadFile(filepath.Join("testdata", e.Name()))
		if err != nil {
			t.Errorf("%s has no copy in testdata: %v", e.Name(), err)
			continue
		}
		if !bytes.Equal(orig, cp) {
			t.Errorf("testdata/%s differs from %s", e.Name(), dir)
		}
	}
	if n != len(fixtureNames) {
		t.Errorf("shared fixtures hold %d XML files, the tests know %d: add the new ones to fixtureNames", n, len(fixtureNames))
	}
}

func TestFixtureRoundTrip(t *testing.T) {
	for _, name := range fixtureNames {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		doc, err := ParseXML(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out := MarshalXML(doc)
		// NCCL's layout is what the files use: the text comes back byte for
		// byte, apart from a final newline some files lack.
		if got, want := strings.TrimSpace(string(out)), strings.TrimSpace(string(data)); got != want {
			t.Errorf("%s: written document differs from the file", name)
		}
		again, err := ParseXML(bytes.NewReader(out))
		if err != nil {
			t.Fatalf("%s: re-reading the written document: %v", name, err)
		}
		if !bytes.Equal(MarshalXML(again), out) {
			t.Errorf("%s: second round trip changed the document", name)
		}
		g1, err := Build(doc)
		if err != nil {
			t.Fatal(err)
		}
		g2, err := Build(again)
		if err != nil {
			t.Fatal(err)
		}
		if s1, s2 := summarize(g1), summarize(g2); s1 != s2 {
			t.Errorf("%s: graphs differ after a round trip:\n%s\n%s", name, s1, s2)
		}
	}
}

// summarize renders every node, link and path of g, to compare graphs.
func summarize(g *Graph) string {
	var b strings.Builder
	for t := range g.Nodes {
		for _, n := range g.sortedNodes(NodeType(t)) {
			fmt.Fprintf(&b, "%s %s %+v %+v %+v %v\n", n.Type, n.ID, n.Dev, n.GPU, n.Net, n.CPU.Affinity)
			for _, l := range n.Links {
				fmt.Fprintf(&b, "  %s->%s %s %.2f %d\n", l.From.ID, l.To.ID, l.Type, l.BW, l.Count)
			}
			for u := range g.Nodes {
				for _, m := range g.sortedNodes(NodeType(u)) {
					p := g.Path(n, m)
					fmt.Fprintf(&b, "  path %s %s %.2f\n", m.ID, p.Type, p.BW)
				}
			}
		}
	}
	return b.String()
}

func TestIBM8xH100Facts(t *testing.T) {
	g := loadFixture(t, "ibm-gx3d-8xH100-nvswitch-roce-topo-dump.xml")
	if n := len(g.Nodes[GPU]); n != 8 {
		t.Fatalf("%d GPUs, want 8", n)
	}
	if n := len(g.Nodes[NVS]); n != 4 {
		t.Errorf("%d NVSwitches, want 4", n)
	}
	if n := len(g.Nodes[CPU]); n != 2 {
		t.Errorf("%d NUMA nodes, want 2", n)
	}
	if n := len(g.Nodes[NIC]); n != 8 {
		t.Errorf("%d NICs, want 8", n)
	}
	for _, gpu := range g.Nodes[GPU] {
		if gpu.GPU.SM != 90 {
			t.Errorf("GPU %s: sm %d, want 90", gpu.ID, gpu.GPU.SM)
		}
		if n := g.NVLinks(gpu); n != 18 {
			t.Errorf("GPU %s: %d NVLinks, want 18", gpu.ID, n)
		}
		for _, peer := range g.Nodes[GPU] {
			if peer == gpu {
				continue
			}
			p := g.Path(gpu, peer)
			if p.Type != PathNVL && p.Type != PathNVB {
				t.Errorf("GPU %s -> %s: %s, want NVL or NVB", gpu.ID, peer.ID, p.Type)
			}
			// All 18 lanes reach the fabric: 18 × 20.6 GB/s.
			if want := 18 * BWNVLinkSM90; !near(p.BW, want) {
				t.Errorf("GPU %s -> %s: %.1f GB/s, want %.1f", gpu.ID, peer.ID, p.BW, want)
			}
		}
		nics := g.NearestNICs(gpu)
		if len(nics) != 1 {
			t.Fatalf("GPU %s: %d nearest NICs, want 1", gpu.ID, len(nics))
		}
		if nics[0].Parent != gpu.Parent || gpu.Parent.Type != PCI {
			t.Errorf("GPU %s: nearest NIC %s is not under its switch %s", gpu.ID, nics[0].ID, gpu.Parent.ID)
		}
		if p := g.Path(gpu, nics[0]); p.Type != PathPIX {
			t.Errorf("GPU %s -> NIC %s: %s, want PIX", gpu.ID, nics[0].ID, p.Type)
		}
		// NICs under another switch of the same socket are PHB, other
		// socket SYS, unless PXN through an NVLink peer is closer.
		for _, nic := range g.Nodes[NIC] {
			if nic == nics[0] {
				continue
			}
			if p := g.Path(gpu, nic); p.Type != PathPXN || p.Via == nil || p.Via.Parent != nic.Parent {
				t.Errorf("GPU %s -> NIC %s: %s via %v, want PXN through the GPU beside the NIC", gpu.ID, nic.ID, p.Type, p.Via)
			}
		}
	}
	// Half of the GPUs on each socket.
	for _, cpu := range g.Nodes[CPU] {
		n := 0
		for _, gpu := range g.Nodes[GPU] {
			if g.LocalCPU(gpu) == cpu {
				n++
			}
		}
		if n != 4 {
			t.Errorf("NUMA %d holds %d GPUs, want 4", cpu.CPU.NUMA, n)
		}
		if c := cpu.CPU.Affinity.Count(); c != 80 {
			t.Errorf("NUMA %d: %d CPUs, want 80", cpu.CPU.NUMA, c)
		}
	}
	if got := g.Find(CPU, "numa1").CPU.Affinity.String(); got != "80-159" {
		t.Errorf("NUMA 1 CPUs %s, want 80-159", got)
	}
	net := g.Find(NET, "mlx5_0")
	if net == nil || net.Net.SpeedMbps != 200000 || !near(g.Path(net.Parent, net).BW, 25) {
		t.Errorf("mlx5_0: %+v, want a 200 Gb/s (25 GB/s) port", net)
	}
	// The two sockets are Sapphire Rapids: 22 GB/s between them.
	if p := g.Path(g.Find(CPU, "numa0"), g.Find(CPU, "numa1")); p.Type != PathSYS || !near(p.BW, BWSapphireUPI) {
		t.Errorf("numa0 -> numa1: %s %.1f, want SYS %.1f", p.Type, p.BW, BWSapphireUPI)
	}
}

func TestAWSP5Facts(t *testing.T) {
	g := loadFixture(t, "aws-p5.48xlarge-8xH100-efa-topo.xml")
	if len(g.Nodes[GPU]) != 8 || len(g.Nodes[NIC]) != 32 || len(g.Nodes[CPU]) != 1 {
		t.Fatalf("%d GPUs, %d NICs, %d NUMA nodes; want 8, 32, 1", len(g.Nodes[GPU]), len(g.Nodes[NIC]), len(g.Nodes[CPU]))
	}
	for _, gpu := range g.Nodes[GPU] {
		pix := g.NICsAt(gpu, PathPIX)
		if len(pix) != 4 {
			t.Errorf("GPU %s: %d NICs at PIX, want 4", gpu.ID, len(pix))
		}
		for _, nic := range pix {
			if nic.Parent != gpu.Parent {
				t.Errorf("GPU %s: PIX NIC %s under another switch", gpu.ID, nic.ID)
			}
			if p := g.Path(gpu, nic); !near(p.BW, PCIBW(16, 8)) {
				t.Errorf("GPU %s -> %s: %.1f GB/s, want the NIC's Gen4 x8 %.1f", gpu.ID, nic.ID, p.BW, PCIBW(16, 8))
			}
		}
		if n := len(g.NearestNICs(gpu)); n != 4 {
			t.Errorf("GPU %s: %d nearest NICs, want 4", gpu.ID, n)
		}
		// No NVLink in this file: GPUs meet at the CPU.
		for _, peer := range g.Nodes[GPU] {
			if peer != gpu && g.Path(gpu, peer).Type != PathPHB {
				t.Errorf("GPU %s -> %s: %s, want PHB", gpu.ID, peer.ID, g.Path(gpu, peer).Type)
			}
		}
	}
	if net := g.Find(NET, "rdmap79s0"); net == nil || net.Net.SpeedMbps != 100000 || net.Net.MaxConn != 1024 || !net.Net.GDR {
		t.Errorf("rdmap79s0: %+v", net)
	}
}

func TestAzureNDv4Facts(t *testing.T) {
	g := loadFixture(t, "azure-ndv4-8xA100-ib-topo.xml")
	if len(g.Nodes[GPU]) != 8 || len(g.Nodes[NIC]) != 8 || len(g.Nodes[CPU]) != 4 || len(g.Nodes[PCI]) != 4 {
		t.Fatalf("%d GPUs, %d NICs, %d NUMA nodes, %d bridges; want 8, 8, 4, 4", len(g.Nodes[GPU]), len(g.Nodes[NIC]), len(g.Nodes[CPU]), len(g.Nodes[PCI]))
	}
	for _, br := range g.Nodes[PCI] {
		var gpus, nics int
		for _, l := range br.Links {
			if l.To.Parent == br {
				switch l.To.Type {
				case GPU:
					gpus++
				case NIC:
					nics++
				}
			}
		}
		if gpus != 2 || nics != 2 {
			t.Errorf("bridge %s: %d GPUs and %d NICs, want 2 and 2", br.ID, gpus, nics)
		}
	}
	for _, gpu := range g.Nodes[GPU] {
		if gpu.GPU.Dev != -1 || gpu.GPU.SM != 0 {
			t.Errorf("GPU %s: a PCI-only skeleton cannot know dev/sm, got %+v", gpu.ID, gpu.GPU)
		}
		if n := len(g.NICsAt(gpu, PathPIX)); n != 2 {
			t.Errorf("GPU %s: %d NICs at PIX, want 2", gpu.ID, n)
		}
		// "16 GT/s" (the old spelling) x16: 24 GB/s.
		if l := gpu.Links[0]; l.Type != LinkPCI || !near(l.BW, 24) {
			t.Errorf("GPU %s: uplink %s %.1f GB/s, want PCI 24", gpu.ID, l.Type, l.BW)
		}
		for _, peer := range g.Nodes[GPU] {
			want := PathSYS
			switch {
			case peer == gpu:
				want = PathLOC
			case peer.Parent == gpu.Parent:
				want = PathPIX
			}
			if got := g.Path(gpu, peer).Type; got != want {
				t.Errorf("GPU %s -> %s: %s, want %s", gpu.ID, peer.ID, got, want)
			}
		}
	}
	if p := g.Path(g.Find(CPU, "numa0"), g.Find(CPU, "numa3")); !near(p.BW, BWAMD) {
		t.Errorf("AMD sockets: %.1f GB/s, want %.1f", p.BW, BWAMD)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(b)) }
