package comm_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gccl/gccl/comm"
)

// TestTunerChoosesExchange pins where the one-exchange all-reduce and the
// direct all-gather run: up to 8 ranks, while each rank's n-1 copies of its
// input stay within 64 KiB.
func TestTunerChoosesExchange(t *testing.T) {
	for _, n := range []int{2, 3, 4, 8, 9} {
		cs := world(t, n, nil)
		bound := (64 << 10) / max(n-1, 1)
		above := "Tree"
		if n == 2 {
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
		if got := comm.Algo(cs[0], "Broadcast", 8); n > 2 && got != "Tree" {
			t.Errorf("%d ranks: an 8-byte broadcast runs %s, want Tree (the exchange is an all-reduce)", n, got)
		}
	}
	forced := world(t, 4, &comm.Config{Algo: "ring"})
	if got := comm.Algo(forced[0], "AllReduce", 8); got != "Ring" {
		t.Errorf("GCCL_ALGO=ring: %s", got)
	}
}

// todaysRule is the tuner's rule before it asked the cost model
// (comm/tune.go until the model in algo/tune took over), for an op without
// pre-scaling: the reference the model's choices are checked against.
// hier says the job spans several hosts of the same number (more than one)
// of ranks; pref is GCCL_ALGO.
func todaysRule(coll string, n int, hier bool, bytes int, pref string) string {
	const (
		hierMinBytes     = 0
		treeMaxBytes     = 256 << 10
		exchangeMaxBytes = 64 << 10
		exchangeMaxRanks = 8
	)
	if (coll == "AllReduce" || coll == "AllGather") && pref == "" && !hier &&
		n <= exchangeMaxRanks && bytes*(n-1) <= exchangeMaxBytes {
		return "Direct"
	}
	if coll == "AllReduce" || coll == "AllGather" {
		switch {
		case pref == "hier" && hier:
			return "Hier"
		case pref == "" && hier && bytes >= hierMinBytes:
			return "Hier"
		}
	}
	switch coll {
	case "AllToAll":
		return "Pairwise"
	case "Gather", "Scatter":
		return "Direct"
	case "AllReduce", "Broadcast", "Reduce":
		switch pref {
		case "hier", "ring":
			return "Ring"
		case "tree":
			return "Tree"
		}
		if n > 2 && bytes <= treeMaxBytes {
			return "Tree"
		}
	}
	return "Ring"
}

// tunerLayout is one placement of ranks on hosts for the tuner's tables.
type tunerLayout struct {
	name  string
	hosts []string
	hier  bool // several hosts, all with the same number (> 1) of ranks
}

// tunerLayouts: one host of n ranks, one rank per host, equal hosts of
// several ranks (the hierarchical schedules) and uneven hosts.
func tunerLayouts() []tunerLayout {
	var lays []tunerLayout
	for _, n := range []int{1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 32, 64} {
		lays = append(lays, tunerLayout{fmt.Sprintf("1x%d", n), hostsOf(n, n, false), false})
	}
	for _, n := range []int{2, 3, 4, 8} {
		lays = append(lays, tunerLayout{fmt.Sprintf("%dx1", n), hostsOf(n, 1, false), false})
	}
	for _, hp := range [][2]int{{2, 2}, {2, 3}, {3, 2}, {2, 4}, {4, 2}, {4, 4}, {2, 8}, {8, 2}, {8, 8}} {
		lays = append(lays, tunerLayout{fmt.Sprintf("%dx%d", hp[0], hp[1]), hostsOf(hp[0]*hp[1], hp[1], false), true})
	}
	for _, hosts := range []string{"aab", "aaab", "aaabb", "aabbc"} {
		lays = append(lays, tunerLayout{"uneven " + hosts, strings.Split(hosts, ""), false})
	}
	return lays
}

// tunerSizes are the sizes the tables are checked at for n ranks: round
// sizes, and both sides of each bound of the rule.
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

// TestTunerTable checks the tuner's choice for every collective on a grid
// of layouts, sizes and GCCL_ALGO settings against todaysRule.
func TestTunerTable(t *testing.T) {
	worlds := map[string][]*comm.Comm{}
	for _, lay := range tunerLayouts() {
		n := len(lay.hosts)
		for _, pref := range []string{"", "ring", "tree", "hier"} {
			key := fmt.Sprintf("%d/%s", n, pref)
			cs := worlds[key]
			if cs == nil {
				cs = world(t, n, &comm.Config{Algo: pref})
				worlds[key] = cs
			}
			comm.SetHosts(cs[:1], lay.hosts)
			for _, coll := range tunerColls {
				for _, bytes := range tunerSizes(n) {
					want := todaysRule(coll, n, lay.hier, bytes, pref)
					if got := comm.Algo(cs[0], coll, bytes); got != want {
						t.Errorf("%s, %s of %d B, GCCL_ALGO=%q: %s, today's rule %s", lay.name, coll, bytes, pref, got, want)
					}
				}
			}
		}
	}
}
