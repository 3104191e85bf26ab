package shm

import "testing"

// TestMemStatsMatchTheMailboxes: each endpoint's MemStats is what its
// mailbox holds by the geometry: a header after Connect; after a message of
// two pages to one peer, that ring's counters and slot lines and the two
// pages of slot 0. A closed endpoint counts nothing.
func TestMemStatsMatchTheMailboxes(t *testing.T) {
	const n, slotSize, slotCount = 3, 64 << 10, 4
	eps := world(t, n, Config{SlotSize: slotSize, SlotCount: slotCount})
	g, err := newGeometry(slotSize, slotCount, n)
	if err != nil {
		t.Fatal(err)
	}
	check := func(when string, want ...int64) {
		t.Helper()
		for r, ep := range eps {
			if got := ep.MemStats(); got.Shared != want[r] || got.Total() != want[r] {
				t.Errorf("%s: rank %d's MemStats %+v, want %d bytes shared", when, r, got, want[r])
			}
		}
	}
	hdr := int64(g.headerSize)
	check("after Connect", hdr, hdr, hdr)
	if err := send(eps[0], 1, make([]byte, 2*pageSize), 1); err != nil {
		t.Fatal(err)
	}
	check("after a message", hdr+int64(g.smallOff)+2*pageSize, hdr, hdr) // counters and lines, two pages of the slot
	if err := eps[0].Close(); err != nil {
		t.Fatal(err)
	}
	if got := eps[0].MemStats().Shared; got != 0 {
		t.Fatalf("a closed endpoint still counts %d bytes", got)
	}
}
