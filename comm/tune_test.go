package comm_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/algo/tune"
	"github.com/gccl/gccl/comm"
)

// TestTunerChoosesExchange pins where the one-exchange all-reduce and the
// direct all-gather run: up to 8 ranks, while each rank's n-1 copies of its
// input stay within 64 KiB.
func TestTunerChoosesExchange(t *testing.T) {
	for _, n := range []int{2, 3, 4, 8, 9} {
		cs := world(t, n, nil)
		bound := (64 << 10) / max(n-1, 1)
		// Above the bound: the ring on 2 ranks, and on 3 and 4 (measured
		// faster than the tree there, docs/PERFORMANCE.md "Calibrating the
		// tuner"); the tree on 8.
		above := "Tree"
		if n <= 4 {
			above = "Ring"
		}
		for _, tc := range []struct {
			bytes int
			want  string
		}{
			{8, "Direct"},
			{bound, "Direct"},
			{bound + 8, above},
		} {
			want := tc.want
			if n > 8 {
				want = "Tree"
			}
			if got := comm.Algo(cs[0], "AllReduce", tc.bytes); got != want {
				t.Errorf("%d ranks, %d bytes: %s, want %s", n, tc.bytes, got, want)
			}
		}
		// All-gather's size is one rank's block.
		for _, tc := range []struct {
			bytes int
			want  string
		}{{8, "Direct"}, {bound, "Direct"}, {bound + 8, "Ring"}} {
			want := tc.want
			if n > 8 {
				want = "Ring"
			}
			if got := comm.Algo(cs[0], "AllGather", tc.bytes); got != want {
				t.Errorf("%d ranks, all-gather of %d-byte blocks: %s, want %s", n, tc.bytes, got, want)
			}
		}
		// The exchange is an all-reduce: a broadcast runs the chain (on
		// this machine class 2-3x faster than the tree at 3, 4 and 8
		// ranks, measured).
		if got := comm.Algo(cs[0], "Broadcast", 8); n > 2 && got != "Ring" {
			t.Errorf("%d ranks: an 8-byte broadcast runs %s, want Ring (the exchange is an all-reduce)", n, got)
		}
	}
	forced := world(t, 4, &comm.Config{Algo: "ring"})
	if got := comm.Algo(forced[0], "AllReduce", 8); got != "Ring" {
		t.Errorf("GCCL_ALGO=ring: %s", got)
	}
}

// tunerLayout is one placement of ranks on hosts for the tuner's tables.
type tunerLayout struct {
	name    string
	hosts   []string
	perHost []int
}

// tunerLayouts: one host of n ranks, one rank per host, equal hosts of
// several ranks (the hierarchical schedules) and uneven hosts.
func tunerLayouts() []tunerLayout {
	var lays []tunerLayout
	for _, n := range []int{1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 32, 64} {
		lays = append(lays, tunerLayout{fmt.Sprintf("1x%d", n), hostsOf(n, n, false), []int{n}})
	}
	for _, n := range []int{2, 3, 4, 8} {
		lays = append(lays, tunerLayout{fmt.Sprintf("%dx1", n), hostsOf(n, 1, false), slices.Repeat([]int{1}, n)})
	}
	for _, hp := range [][2]int{{2, 2}, {2, 3}, {3, 2}, {2, 4}, {4, 2}, {4, 4}, {2, 8}, {8, 2}, {8, 8}} {
		lays = append(lays, tunerLayout{fmt.Sprintf("%dx%d", hp[0], hp[1]), hostsOf(hp[0]*hp[1], hp[1], false), slices.Repeat([]int{hp[1]}, hp[0])})
	}
	for _, l := range []struct {
		hosts   string
		perHost []int
	}{{"aab", []int{2, 1}}, {"aaab", []int{3, 1}}, {"aaabb", []int{3, 2}}, {"aabbc", []int{2, 2, 1}}} {
		lays = append(lays, tunerLayout{"uneven " + l.hosts, strings.Split(l.hosts, ""), l.perHost})
	}
	return lays
}

// tunerSizes are the sizes the tables are checked at for n ranks: round
// sizes, and both sides of the bounds of the rule before the cost model.
func tunerSizes(n int) []int {
	sizes := []int{0, 8, 1 << 10, 4 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 256<<10 + 8, 512 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20}
	if n > 1 {
		b := (64 << 10) / (n - 1)
		sizes = append(sizes, b, b+8)
	}
	slices.Sort(sizes)
	return slices.Compact(sizes)
}

var tunerColls = []string{"AllReduce", "AllGather", "Broadcast", "Reduce", "ReduceScatter", "AllToAll", "Gather", "Scatter"}

// TestTunerTable: a communicator runs the cost model's choice (algo/tune's
// Tuner for this machine class, whose tables algo/tune pins beside the
// rule it replaced and the measurements) for every collective on a grid of
// layouts, sizes and GCCL_ALGO settings; the hierarchical schedules only
// where setHosts found hosts of equal size.
func TestTunerTable(t *testing.T) {
	worlds := map[string][]*comm.Comm{}
	for _, lay := range tunerLayouts() {
		n := len(lay.hosts)
		sys, err := tune.Host(lay.perHost...)
		if err != nil {
			t.Fatal(err)
		}
		for _, pref := range []string{"", "ring", "tree", "hier"} {
			key := fmt.Sprintf("%d/%s", n, pref)
			cs := worlds[key]
			if cs == nil {
				cs = world(t, n, &comm.Config{Algo: pref})
				worlds[key] = cs
			}
			comm.SetHosts(cs[:1], lay.hosts)
			force, _ := algo.ParseAlgorithm(pref)
			tuner, err := tune.NewTuner(sys, force)
			if err != nil {
				t.Fatal(err)
			}
			for _, coll := range tunerColls {
				k := algoColl(coll)
				for _, bytes := range tunerSizes(n) {
					want := tuner.Choose(k, bytes, false).String()
					got := comm.Algo(cs[0], coll, bytes)
					if got != want {
						t.Errorf("%s, %s of %d B, GCCL_ALGO=%q: %s, the tuner's %s", lay.name, coll, bytes, pref, got, want)
					}
					hier := len(lay.perHost) > 1 && lay.perHost[0] > 1 && slices.Min(lay.perHost) == slices.Max(lay.perHost)
					if got == "Hier" && !hier {
						t.Errorf("%s, %s of %d B, GCCL_ALGO=%q: hierarchical without equal hosts", lay.name, coll, bytes, pref)
					}
				}
			}
		}
	}
}

func algoColl(name string) algo.Collective {
	for k := algo.AllReduce; k <= algo.Scatter; k++ {
		if k.String() == name {
			return k
		}
	}
	panic(name)
}
