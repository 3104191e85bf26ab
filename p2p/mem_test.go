package p2p

import (
	"errors"
	"testing"
)

func TestRegionTableFind(t *testing.T) {
	var tb regionTable
	tb.add(regionInfo{ID: 1, Type: DRAM, Base: 1000, Len: 100})
	tb.add(regionInfo{ID: 2, Type: DRAM, Base: 1050, Len: 200}) // overlaps 1
	tb.add(regionInfo{ID: 3, Type: DRAM, Base: 5000, Len: 10})
	tb.add(regionInfo{ID: 4, Type: FILE, Base: 4096, Len: 8192})
	tb.add(regionInfo{ID: 5, Type: VRAM, Base: 1000, Len: 100, Dev: 1}) // same addresses as DRAM region 1
	tb.add(regionInfo{ID: 6, Type: VRAM, Base: 2000, Len: 100, Dev: 0})
	cases := []struct {
		typ       MemType
		addr, n   uint64
		dev       uint32
		want      uint32
		wantError bool
	}{
		{DRAM, 1000, 100, 0, 1, false},
		{DRAM, 1000, 101, 0, 0, true}, // crosses out of region 1 and starts before 2
		{DRAM, 1060, 150, 0, 2, false},
		{DRAM, 1060, 10, 0, 2, false}, // both hold it: the nearest start wins
		{DRAM, 1010, 10, 0, 1, false},
		{DRAM, 999, 1, 0, 0, true},
		{DRAM, 1249, 1, 0, 2, false},
		{DRAM, 1250, 1, 0, 0, true},
		{DRAM, 5000, 10, 0, 3, false},
		{DRAM, 5005, 10, 0, 0, true},
		{DRAM, ^uint64(0) - 1, 4, 0, 0, true}, // wraps
		{FILE, 4096, 8192, 4, 4, false},
		{FILE, 4095, 10, 4, 0, true},
		{FILE, 4096, 10, 5, 0, true}, // no such file region
		{VRAM, 0, 1, 0, 0, true},
		{VRAM, 1000, 100, 1, 5, false},
		{VRAM, 1000, 100, 0, 0, true}, // another device
		{VRAM, 1050, 51, 1, 0, true},
		{VRAM, 2000, 10, 0, 6, false},
		{VRAM, 2000, 10, 1, 0, true},
	}
	for _, c := range cases {
		r, err := tb.find(c.typ, c.addr, c.n, c.dev)
		if c.wantError != (err != nil) || err == nil && r.ID != c.want {
			t.Errorf("find(%v, %d, %d, dev %d) = region %d, %v; want %d (error %v)", c.typ, c.addr, c.n, c.dev, r.ID, err, c.want, c.wantError)
		}
	}
	tb.remove(2)
	if _, err := tb.find(DRAM, 1060, 150, 0); !errors.Is(err, ErrOutOfBounds) {
		t.Errorf("after removal: %v", err)
	}
	if got := len(tb.all()); got != 5 {
		t.Errorf("%d regions left, want 5", got)
	}
	tb.remove(5)
	if _, err := tb.find(VRAM, 1000, 100, 1); !errors.Is(err, ErrOutOfBounds) {
		t.Errorf("after removal of VRAM: %v", err)
	}
	if r, ok := tb.byID(6); !ok || r.Dev != 0 {
		t.Errorf("byID(6) = %+v, %v", r, ok)
	}
}
