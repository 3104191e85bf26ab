package hier_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/algo/hier"
	"github.com/gccl/gccl/algo/internal/gentest"
	"github.com/gccl/gccl/algo/ring"
	"github.com/gccl/gccl/algo/sim"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// contiguous is H hosts of L ranks numbered host by host; strided numbers
// them round-robin over the hosts (rank r on host r%H), as some launchers do.
func contiguous(H, L int) []string {
	hosts := make([]string, 0, H*L)
	for h := range H {
		for range L {
			hosts = append(hosts, fmt.Sprintf("host%d", h))
		}
	}
	return hosts
}

func strided(H, L int) []string {
	hosts := make([]string, H*L)
	for r := range hosts {
		hosts[r] = fmt.Sprintf("host%d", r%H)
	}
	return hosts
}

func plans(t *testing.T, hosts []string) []*algo.Plan {
	return plansOf(t, hosts, hier.AllReduce)
}

func plansOf(t *testing.T, hosts []string, gen func(hier.Layout, int) *algo.Plan) []*algo.Plan {
	t.Helper()
	lay, err := hier.LayoutOf(hosts)
	if err != nil {
		t.Fatal(err)
	}
	return sim.Plans(len(hosts), func(rank int) *algo.Plan { return gen(lay, rank) })
}

var generators = map[string]func(hier.Layout, int) *algo.Plan{"allreduce": hier.AllReduce, "allgather": hier.AllGather}

// TestSimulate proves every layout correct and deadlock-free in the
// simulator, with the ring's minimum slots and more, several chunks, and
// both scheduling orders.
func TestSimulate(t *testing.T) {
	for _, H := range []int{1, 2, 3, 4} {
		for _, L := range []int{1, 2, 3, 4, 8} {
			for name, hosts := range map[string][]string{"contiguous": contiguous(H, L), "strided": strided(H, L)} {
				for _, opt := range gentest.SimOptions(ring.MinSlots) {
					for gname, gen := range generators {
						name := gname + " " + name
						ps := plansOf(t, hosts, gen)
						for _, p := range ps {
							if err := p.Validate(); err != nil {
								t.Fatalf("H=%d L=%d %s rank %d: %v", H, L, name, p.Rank, err)
							}
						}
						if err := sim.Run(ps, opt); err != nil {
							t.Fatalf("H=%d L=%d %s %+v: %v", H, L, name, opt, err)
						}
					}
				}
			}
		}
	}
}

// TestCrossHostTraffic adds up the bytes that cross hosts, in vectors,
// over all ranks' plans: the point of the schedule. Every message of an
// all-reduce plan carries one block, 1/NBlocks of the vector.
func TestCrossHostTraffic(t *testing.T) {
	for _, tc := range []struct{ H, L int }{{2, 2}, {2, 4}, {3, 2}, {4, 4}} {
		hosts := contiguous(tc.H, tc.L)
		n := tc.H * tc.L
		var hierBytes, ringBytes float64 // in units of the vector's size
		for _, p := range plans(t, hosts) {
			for _, s := range p.Phases[0] {
				if s.Prim.Sends() && hosts[s.SendPeer] != hosts[p.Rank] {
					hierBytes += 1 / float64(p.NBlocks)
				}
			}
		}
		for r := range n {
			for _, s := range ring.AllReduce(n, r).Phases[0] {
				if s.Prim.Sends() && hosts[s.SendPeer] != hosts[r] {
					ringBytes += 1 / float64(n)
				}
			}
		}
		// Between all hosts together: the ring crosses H links, each
		// carrying 2(n-1)/n vectors; the hierarchical plan 2(H-1)/H per
		// host, H hosts.
		wantHier := 2 * float64(tc.H-1)
		wantRing := float64(tc.H) * 2 * float64(n-1) / float64(n)
		if !near(hierBytes, wantHier) || !near(ringBytes, wantRing) {
			t.Errorf("H=%d L=%d: cross-host traffic hier %.3f (want %.3f), ring %.3f (want %.3f) vectors",
				tc.H, tc.L, hierBytes, wantHier, ringBytes, wantRing)
		}
		if hierBytes >= ringBytes {
			t.Errorf("H=%d L=%d: the hierarchical plan moves %.3f vectors across hosts, the ring %.3f", tc.H, tc.L, hierBytes, ringBytes)
		}
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

func TestLayoutOf(t *testing.T) {
	lay, err := hier.LayoutOf([]string{"b", "a", "b", "a"})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(lay.Hosts); got != "[[0 2] [1 3]]" {
		t.Errorf("hosts %s, want [[0 2] [1 3]]", got)
	}
	if _, err := hier.LayoutOf([]string{"a", "a", "b"}); err == nil {
		t.Error("uneven hosts accepted")
	}
	if _, err := hier.LayoutOf(nil); err == nil {
		t.Error("empty layout accepted")
	}
}

// TestGolden keeps the printed plans of two small layouts.
func TestGolden(t *testing.T) {
	var b strings.Builder
	for _, gname := range []string{"allreduce", "allgather"} {
		for _, hosts := range [][]string{contiguous(2, 2), strided(2, 3)} {
			fmt.Fprintf(&b, "# %s, hosts %v\n", gname, hosts)
			for _, p := range plansOf(t, hosts, generators[gname]) {
				b.WriteString(p.String())
			}
			b.WriteString("\n")
		}
	}
	path := filepath.Join("testdata", "plans.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if b.String() != string(want) {
		t.Errorf("plans differ from %s (go test -update rewrites it after review):\n%s", path, b.String())
	}
}
