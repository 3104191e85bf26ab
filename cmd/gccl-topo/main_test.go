package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gccl/gccl/topo"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var fixtures = []string{
	"ibm-gx3d-8xH100-nvswitch-roce-topo-dump.xml",
	"aws-p5.48xlarge-8xH100-efa-topo.xml",
	"azure-ndv4-8xA100-ib-topo.xml",
}

func runTopo(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb, func(string) string { return "" })
	return out.String(), errb.String(), code
}

// TestGolden pins the report for each published topology, with a rank
// layout of two nodes. go test ./cmd/gccl-topo -update rewrites them.
func TestGolden(t *testing.T) {
	for _, f := range fixtures {
		// Run from testdata so the report names the file, not a path.
		file := filepath.Join("..", "..", "topo", "testdata", f)
		out, errs, code := runTopo(t, "--topo-file", file, "--ranks", "16", "--nodes", "2")
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", f, code, errs)
		}
		out = strings.Replace(out, file, f, 1)
		golden := filepath.Join("testdata", strings.TrimSuffix(f, ".xml")+".golden")
		if *update {
			if err := os.MkdirAll("testdata", 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(golden)
		if err != nil {
			t.Fatalf("%v (run with -update)", err)
		}
		if out != string(want) {
			t.Errorf("%s differs from the report; rerun with -update after checking:\n%s", golden, out)
		}
	}
}

func TestMatrixFacts(t *testing.T) {
	out, _, code := runTopo(t, "--topo-file", filepath.Join("..", "..", "topo", "testdata", fixtures[1]))
	if code != 0 {
		t.Fatal(code)
	}
	// AWS p5: each GPU row has 4 PIX NICs.
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "GPU") && !strings.Contains(line, ":") {
			if n := strings.Count(line, "PIX"); n != 4 {
				t.Errorf("row %q: %d PIX, want 4", line, n)
			}
		}
	}
}

// TestThisMachine runs on the real host and checks the NUMA section
// against /sys.
func TestThisMachine(t *testing.T) {
	nodes, _ := filepath.Glob("/sys/devices/system/node/node[0-9]*")
	if len(nodes) == 0 {
		t.Skip("no NUMA information in /sys here")
	}
	dump := filepath.Join(t.TempDir(), "dump.xml")
	out, errs, code := runTopo(t, "--ranks", "2", "--dump", dump)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, n := range nodes {
		cpus, err := os.ReadFile(filepath.Join(n, "cpulist"))
		if err != nil {
			t.Fatal(err)
		}
		id := strings.TrimPrefix(filepath.Base(n), "node")
		found := false
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == id && f[1] == strings.TrimSpace(string(cpus)) {
				found = true
			}
		}
		if !found {
			t.Errorf("NUMA node %s with CPUs %s not in the report:\n%s", id, strings.TrimSpace(string(cpus)), out)
		}
	}
	if !strings.Contains(out, "Layout: 1 node(s) x 2 rank(s)") || !strings.Contains(out, "ring (ranks): 0 1 -> 0") {
		t.Errorf("no layout section:\n%s", out)
	}
	g, err := topo.ReadFile(dump)
	if err != nil {
		t.Fatalf("the dump does not read back: %v", err)
	}
	if len(g.Nodes[topo.CPU]) != len(nodes) {
		t.Errorf("dump has %d NUMA nodes, /sys %d", len(g.Nodes[topo.CPU]), len(nodes))
	}
}

func TestBadArguments(t *testing.T) {
	for _, args := range [][]string{
		{"--topo-file", "/nonexistent.xml"},
		{"--ranks", "3", "--nodes", "2"},
		{"--nodes", "2"},
		{"--nodes", "0", "--ranks", "2"},
		{"--ranks", "-4"},
		{"--topo-file", filepath.Join("..", "..", "topo", "testdata", fixtures[0]), "--ranks", "9"},
		{"extra"},
		{"--no-such-flag"},
	} {
		_, errs, code := runTopo(t, args...)
		if code == 0 || errs == "" {
			t.Errorf("%v: exit %d, stderr %q; want an error", args, code, errs)
		}
	}
}

// TestOneRankPerNode: with one rank per node there is no intra-node hop, and
// the layout section says so instead of reading a hop class that does not
// exist (it used to index RingStats' empty Types and panic).
func TestOneRankPerNode(t *testing.T) {
	file := filepath.Join("..", "..", "topo", "testdata", fixtures[2])
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--ranks", "1"}, []string{"Layout: 1 node(s) x 1 rank(s)", "intra-node ring: 0 (one rank per node, no intra-node hop)", "ring (ranks): 0 -> 0"}},
		{[]string{"--ranks", "2", "--nodes", "2"}, []string{"Layout: 2 node(s) x 1 rank(s)", "intra-node ring: 0 (one rank per node, no intra-node hop)", "ring (ranks): 0 1 -> 0", "node 1: 0 <- []; rank 1"}},
	} {
		out, errs, code := runTopo(t, append([]string{"--topo-file", file}, c.args...)...)
		if code != 0 {
			t.Errorf("%v: exit %d: %s", c.args, code, errs)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%v: report lacks %q:\n%s", c.args, w, out)
			}
		}
		if strings.Contains(out, "bottleneck") {
			t.Errorf("%v: report gives an intra-node bottleneck for one rank per node:\n%s", c.args, out)
		}
	}
}

// oddDocs are small documents with shapes the published files lack: a NIC
// nested under a GPU's function, NVLinks to a NIC or to the GPU itself, NUMA
// nodes without devices, NICs without ports or PCI functions, an NVSwitch
// that is also a PCI bridge, GPUs without NICs on two sockets, C2C links.
var oddDocs = map[string]string{
	"devUnderGPU":  `<system><cpu numaid="0" affinity="f"><pci busid="01:00.0" class="0x030200"><gpu dev="0" sm="80"/><pci busid="02:00.0" class="0x020000"><nic><net name="m0" speed="100000"/></nic></pci></pci><pci busid="03:00.0" class="0x030200"><gpu dev="1" sm="80"/></pci></cpu></system>`,
	"nvlToNIC":     `<system><cpu numaid="0" affinity="f"><pci busid="01:00.0" class="0x030200"><gpu dev="0" sm="80"><nvlink target="02:00.0" count="2" tclass="0x068000"/></gpu></pci><pci busid="02:00.0" class="0x020000"><nic><net name="m0" speed="100000"/></nic></pci><pci busid="03:00.0" class="0x030200"><gpu dev="1" sm="80"><nvlink target="02:00.0" count="2" tclass="0x068000"/></gpu></pci></cpu></system>`,
	"selfNVL":      `<system><cpu numaid="0" affinity="f"><pci busid="01:00.0" class="0x030200"><gpu dev="0" sm="80"><nvlink target="01:00.0" count="2"/></gpu></pci><pci busid="03:00.0" class="0x030200"><gpu dev="1" sm="80"/></pci></cpu></system>`,
	"emptyCPUs":    `<system><cpu numaid="0"/><cpu numaid="3"/></system>`,
	"nicNoNet":     `<system><cpu numaid="0"><nic/><nic/><pci busid="03:00.0" class="0x030200"><gpu dev="0"/></pci><pci busid="04:00.0" class="0x030200"><gpu dev="1"/></pci></cpu></system>`,
	"nvsChild":     `<system><cpu numaid="0"><pci busid="05:00.0" class="0x068000"><pci busid="06:00.0" class="0x030200"><gpu dev="0" sm="90"><nvlink target="05:00.0" count="4"/></gpu></pci></pci><pci busid="07:00.0" class="0x030200"><gpu dev="1" sm="90"><nvlink target="05:00.0" count="4"/><nvlink target="0a:00.0" count="4" tclass="0x068000"/></gpu></pci></cpu></system>`,
	"gpuNoNIC2cpu": `<system><cpu numaid="0" arch="x86_64" vendor="GenuineIntel"><pci busid="03:00.0" class="0x030200"><gpu dev="0"/></pci></cpu><cpu numaid="1"><pci busid="04:00.0" class="0x030200"><gpu dev="1"/></pci></cpu></system>`,
	"c2cOnly":      `<system><cpu numaid="0" arch="arm64"><pci busid="03:00.0" class="0x030200" link_width="0" link_speed=""><gpu dev="0" sm="90"><c2c bw="40" count="10"/></gpu></pci><pci busid="04:00.0" class="0x030200"><gpu dev="1" sm="90"><c2c bw="0" count="0"/></gpu></pci></cpu></system>`,
}

// TestOddDocuments: every odd document gives a full report, with the layout
// section for one node, two nodes and one rank per node.
func TestOddDocuments(t *testing.T) {
	dir := t.TempDir()
	for name, doc := range oddDocs {
		f := filepath.Join(dir, name+".xml")
		if err := os.WriteFile(f, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{}, {"--ranks", "2"}, {"--ranks", "4", "--nodes", "2"}, {"--ranks", "3", "--nodes", "3"}} {
			out, errs, code := runTopo(t, append([]string{"--topo-file", f}, args...)...)
			if code != 0 {
				t.Errorf("%s %v: exit %d: %s", name, args, code, errs)
				continue
			}
			if !strings.Contains(out, "NUMA nodes:") || !strings.Contains(out, "NICs:") {
				t.Errorf("%s %v: report lacks a section:\n%s", name, args, out)
			}
			if len(args) > 0 && !strings.Contains(out, "ring (ranks): 0 ") {
				t.Errorf("%s %v: report lacks the ring:\n%s", name, args, out)
			}
		}
	}
}
