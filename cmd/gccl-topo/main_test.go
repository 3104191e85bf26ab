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
