// External test package: algo/sim imports algo.
package algo_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/algo/sim"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// generators lists the generators of package algo; unrooted ones ignore root.
var generators = []struct {
	name   string
	rooted bool
	gen    func(n, rank, root int) *algo.Plan
}{
	{"alltoall", false, func(n, rank, _ int) *algo.Plan { return algo.PairwiseAllToAll(n, rank) }},
	{"gather", true, algo.DirectGather},
	{"scatter", true, algo.DirectScatter},
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

func simOptions() []sim.Options {
	var opts []sim.Options
	for _, k := range []int{1, 4} {
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
				for _, opts := range simOptions() {
					if err := sim.Run(plans, opts); err != nil {
						t.Errorf("%s n=%d root=%d %+v: %v", g.name, n, root, opts, err)
					}
				}
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
					if p.NRanks != n || p.Rank != rank || p.Root != root || p.NBlocks != n {
						t.Errorf("%s n=%d root=%d rank=%d: header %s", g.name, n, root, rank, strings.SplitN(p.String(), "\n", 2)[0])
					}
				}
			}
		}
	}
}

// TestStepConstructors checks that every constructor sets exactly the fields
// its primitive uses, with -1 for unused peers.
func TestStepConstructors(t *testing.T) {
	in, out := algo.InBlock(0), algo.OutBlock(1)
	for _, tt := range []struct {
		got  algo.Step
		want algo.Step
	}{
		{algo.SendStep(2, in), algo.Step{Prim: algo.Send, SendPeer: 2, RecvPeer: -1, Src: in}},
		{algo.RecvStep(3, out), algo.Step{Prim: algo.Recv, SendPeer: -1, RecvPeer: 3, Dst: out}},
		{algo.CopySendStep(2, in, out), algo.Step{Prim: algo.CopySend, SendPeer: 2, RecvPeer: -1, Src: in, Dst: out}},
		{algo.RecvCopySendStep(3, 2, out), algo.Step{Prim: algo.RecvCopySend, SendPeer: 2, RecvPeer: 3, Dst: out}},
		{algo.RecvReduceSendStep(3, 2, in), algo.Step{Prim: algo.RecvReduceSend, SendPeer: 2, RecvPeer: 3, Src: in}},
		{algo.RecvReduceCopyStep(3, in, out), algo.Step{Prim: algo.RecvReduceCopy, SendPeer: -1, RecvPeer: 3, Src: in, Dst: out}},
		{algo.RecvReduceCopySendStep(3, 2, in, out), algo.Step{Prim: algo.RecvReduceCopySend, SendPeer: 2, RecvPeer: 3, Src: in, Dst: out}},
		{algo.CopyStep(in, out), algo.Step{Prim: algo.Copy, SendPeer: -1, RecvPeer: -1, Src: in, Dst: out}},
		{algo.SendRecvStep(2, in, 3, out), algo.Step{Prim: algo.SendRecv, SendPeer: 2, RecvPeer: 3, Src: in, Dst: out}},
		{algo.CopyStep(in, out).AsFinal(), algo.Step{Prim: algo.Copy, SendPeer: -1, RecvPeer: -1, Src: in, Dst: out, Final: true}},
	} {
		if tt.got != tt.want {
			t.Errorf("got %+v, want %+v", tt.got, tt.want)
		}
	}
}
