package comm_test

import (
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
