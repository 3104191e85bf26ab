package comm_test

import (
	"testing"

	"github.com/gccl/gccl/comm"
)

// TestMemStatsMatchWhatWasMade: once every pair has talked, each rank
// holds the rings from its n-1 peers (SlotCount slots of SlotSize, plus a
// length and a tag per slot); symmetric memory counts the rank's own
// buffer and its peers' mapped; Free and Close give it back.
func TestMemStatsMatchWhatWasMade(t *testing.T) {
	const n, slotSize, slotCount, count = 4, 4096, 4, 3000
	cs := world(t, n, &comm.Config{SlotSize: slotSize, SlotCount: slotCount})
	for _, c := range cs {
		if m := c.MemStats(); m.RingHeap != 0 || m.Symmetric != 0 || m.Staging != 2*slotSize {
			t.Fatalf("rank %d before any operation: %+v", c.Rank(), m)
		}
	}
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error { // every pair talks
		return comm.AllToAll(bg, c, make([]float32, n*count), make([]float32, n*count))
	}))
	sym := allocAll(t, cs, comm.Float32, count)
	const ring = slotSize*slotCount + slotCount*(8+8) // data, lengths, tags
	for _, c := range cs {
		m := c.MemStats()
		want := comm.MemStats{RingHeap: (n - 1) * ring, Symmetric: 4 * count, SymmetricMapped: (n - 1) * 4 * count, Staging: 2 * slotSize}
		if m != want {
			t.Errorf("rank %d: %+v, want %+v", c.Rank(), m, want)
		}
		if m.Total() != want.RingHeap+want.Symmetric+want.Staging {
			t.Errorf("rank %d: Total %d", c.Rank(), m.Total())
		}
	}
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error { return sym[c.Rank()].Free() }))
	for _, c := range cs {
		if m := c.MemStats(); m.Symmetric != 0 || m.SymmetricMapped != 0 {
			t.Errorf("rank %d after Free: %+v", c.Rank(), m)
		}
		c.Close()
		if m := c.MemStats(); m != (comm.MemStats{}) {
			t.Errorf("rank %d after Close: %+v", c.Rank(), m)
		}
	}
}
