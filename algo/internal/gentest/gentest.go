// Package gentest is the test harness shared by the packages of plan
// generators (algo, algo/ring, algo/tree): golden files of printed plans,
// and sweeps of every generator through the simulator.
package gentest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/algo/sim"
)

// Generator is one plan generator under test. Unrooted generators ignore
// root; MinSlots is the least connection capacity it needs (0 means 1).
type Generator struct {
	Name     string
	Rooted   bool
	MinSlots int
	Gen      func(n, rank, root int) *algo.Plan
}

// SimSizes are the rank counts every generator is simulated at.
var SimSizes = []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 32, 64}

// Roots returns the roots to test on n ranks: all distinct values of 0, n/2
// and, unless golden, n-1.
func Roots(n int, rooted, golden bool) []int {
	if !rooted {
		return []int{0}
	}
	rs := []int{0}
	for _, r := range []int{n / 2, n - 1} {
		if r != rs[len(rs)-1] && !(golden && r == n-1 && n > 2) {
			rs = append(rs, r)
		}
	}
	return rs
}

// SimOptions are the simulator settings of a sweep: connection capacities
// minSlots and 4, one and three chunks, round-robin and seeded random order.
func SimOptions(minSlots int) []sim.Options {
	if minSlots < 1 {
		minSlots = 1
	}
	var opts []sim.Options
	for _, k := range []int{minSlots, 4} {
		for _, c := range []int{1, 3} {
			opts = append(opts,
				sim.Options{QueueCap: k, Chunks: c, Order: sim.RoundRobin},
				sim.Options{QueueCap: k, Chunks: c, Order: sim.Random, Seed: uint64(100*k + c)})
		}
	}
	return opts
}

// Golden checks every generator's plans for n = 1..17 (and its roots)
// against testdata/<name>.golden, or rewrites the files when update is set.
func Golden(t *testing.T, gens []Generator, update bool) {
	for _, g := range gens {
		t.Run(g.Name, func(t *testing.T) {
			var b strings.Builder
			for n := 1; n <= 17; n++ {
				for _, root := range Roots(n, g.Rooted, true) {
					for rank := range n {
						b.WriteString(g.Gen(n, rank, root).String())
					}
					b.WriteString("\n")
				}
			}
			CheckGolden(t, g.Name, b.String(), update)
		})
	}
}

// Simulate runs every generator through the simulator at every size, root
// and option of the sweep.
func Simulate(t *testing.T, gens []Generator) {
	for _, g := range gens {
		for _, n := range SimSizes {
			for _, root := range Roots(n, g.Rooted, false) {
				plans := sim.Plans(n, func(rank int) *algo.Plan { return g.Gen(n, rank, root) })
				for _, opts := range SimOptions(g.MinSlots) {
					if err := sim.Run(plans, opts); err != nil {
						t.Errorf("%s n=%d root=%d %+v: %v", g.Name, n, root, opts, err)
					}
				}
			}
		}
	}
}

// CheckGolden compares got with testdata/<name>.golden, pointing at the
// first differing line, or rewrites the file when update is set.
func CheckGolden(t *testing.T, name, got string, update bool) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got == string(want) {
		return
	}
	gotLines, wantLines := strings.Split(got, "\n"), strings.Split(string(want), "\n")
	for i := 0; ; i++ {
		if i >= len(gotLines) || i >= len(wantLines) || gotLines[i] != wantLines[i] {
			line := func(ls []string) string {
				if i < len(ls) {
					return ls[i]
				}
				return "(end)"
			}
			t.Fatalf("%s:%d: got %q, want %q (rerun with -update if the change is intended, and review the diff)",
				path, i+1, line(gotLines), line(wantLines))
		}
	}
}
