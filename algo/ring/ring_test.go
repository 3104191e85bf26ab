package ring_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/algo/ring"
	"github.com/gccl/gccl/algo/sim"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// generators lists every plan generator of the package; unrooted ones ignore
// root; minSlots is the least connection capacity they need.
var generators = []struct {
	name     string
	rooted   bool
	minSlots int
	gen      func(n, rank, root int) *algo.Plan
}{
	{"allreduce", false, ring.MinSlots, func(n, rank, _ int) *algo.Plan { return ring.AllReduce(n, rank) }},
	{"reducescatter", false, ring.MinSlots, func(n, rank, _ int) *algo.Plan { return ring.ReduceScatter(n, rank) }},
	{"allgather", false, ring.MinSlots, func(n, rank, _ int) *algo.Plan { return ring.AllGather(n, rank) }},
	{"broadcast", true, 1, ring.Broadcast},
	{"reduce", true, 1, ring.Reduce},
}

// roots returns the roots to test on n ranks: all distinct values of 0, n/2
// and, unless golden, n-1.
func roots(n int, rooted, golden bool) []int {
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

func TestGolden(t *testing.T) {
	for _, g := range generators {
		t.Run(g.name, func(t *testing.T) {
			var b strings.Builder
			for n := 1; n <= 17; n++ {
				for _, root := range roots(n, g.rooted, true) {
					for rank := range n {
						b.WriteString(g.gen(n, rank, root).String())
					}
					b.WriteString("\n")
				}
			}
			checkGolden(t, g.name, b.String())
		})
	}
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
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

var simSizes = []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 32, 64}

func simOptions(minSlots int) []sim.Options {
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

func TestSimulate(t *testing.T) {
	for _, g := range generators {
		for _, n := range simSizes {
			for _, root := range roots(n, g.rooted, false) {
				plans := sim.Plans(n, func(rank int) *algo.Plan { return g.gen(n, rank, root) })
				for _, opts := range simOptions(g.minSlots) {
					if err := sim.Run(plans, opts); err != nil {
						t.Errorf("%s n=%d root=%d %+v: %v", g.name, n, root, opts, err)
					}
				}
			}
		}
	}
}

// TestOneSlotDeadlocks shows why ring schedules need MinSlots: with one slot
// per connection every rank's first message fills its connection, and each
// fused receive-and-send step then waits for its successor to do the same.
func TestOneSlotDeadlocks(t *testing.T) {
	for _, g := range generators[:3] {
		for _, n := range []int{3, 4, 17} {
			plans := sim.Plans(n, func(rank int) *algo.Plan { return g.gen(n, rank, 0) })
			err := sim.Run(plans, sim.Options{QueueCap: 1, Chunks: 1})
			if err == nil || !strings.Contains(err.Error(), "deadlock") {
				t.Errorf("%s n=%d with one slot: got %v, want a deadlock", g.name, n, err)
			}
		}
	}
}

func TestValidate(t *testing.T) {
	for _, g := range generators {
		for _, n := range simSizes {
			for _, root := range roots(n, g.rooted, false) {
				for rank := range n {
					p := g.gen(n, rank, root)
					if err := p.Validate(); err != nil {
						t.Errorf("%s n=%d root=%d rank=%d: %v", g.name, n, root, rank, err)
					}
					if p.Algo != algo.Ring || p.NRanks != n || p.Rank != rank {
						t.Errorf("%s n=%d root=%d rank=%d: header %s", g.name, n, root, rank, strings.SplitN(p.String(), "\n", 2)[0])
					}
				}
			}
		}
	}
}

// TestAllReduceTransfers checks the ring's cost: every rank sends and receives
// 2(n-1) messages.
func TestAllReduceTransfers(t *testing.T) {
	for n := 2; n <= 17; n++ {
		for rank := range n {
			sends, recvs := 0, 0
			for _, st := range ring.AllReduce(n, rank).Phases[0] {
				if st.Prim.Sends() {
					sends++
				}
				if st.Prim.Recvs() {
					recvs++
				}
			}
			if sends != 2*(n-1) || recvs != 2*(n-1) {
				t.Errorf("n=%d rank=%d: %d sends, %d receives, want %d", n, rank, sends, recvs, 2*(n-1))
			}
		}
	}
}

func Example() {
	for rank := range 3 {
		fmt.Print(ring.AllReduce(3, rank))
	}
	// Output:
	// AllReduce Ring n=3 rank=0 root=0 blocks=3
	//   phase 0
	//     send to=1 src=in[2]
	//     recvReduceSend from=2 to=1 src=in[1]
	//     recvReduceCopySend from=2 to=1 src=in[0] dst=out[0] final
	//     recvCopySend from=2 to=1 dst=out[2]
	//     recv from=2 dst=out[1]
	// AllReduce Ring n=3 rank=1 root=0 blocks=3
	//   phase 0
	//     send to=2 src=in[0]
	//     recvReduceSend from=0 to=2 src=in[2]
	//     recvReduceCopySend from=0 to=2 src=in[1] dst=out[1] final
	//     recvCopySend from=0 to=2 dst=out[0]
	//     recv from=0 dst=out[2]
	// AllReduce Ring n=3 rank=2 root=0 blocks=3
	//   phase 0
	//     send to=0 src=in[1]
	//     recvReduceSend from=1 to=0 src=in[0]
	//     recvReduceCopySend from=1 to=0 src=in[2] dst=out[2] final
	//     recvCopySend from=1 to=0 dst=out[1]
	//     recv from=1 dst=out[0]
}
