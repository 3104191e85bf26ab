package p2p

import (
	"fmt"
	"sort"
)

// MemType is where a descriptor's bytes live.
type MemType uint8

const (
	// DRAM is host memory: Desc.Addr is a virtual address in the owner's
	// process.
	DRAM MemType = 1
	// VRAM is GPU memory; no GPU backend exists yet (ErrNotSupported).
	VRAM MemType = 2
	// FILE is a byte range of a file: Desc.Addr is the offset in the file and
	// Desc.DevID the region's ID (Region.ID).
	FILE MemType = 3
)

func (t MemType) String() string {
	switch t {
	case DRAM:
		return "DRAM"
	case VRAM:
		return "VRAM"
	case FILE:
		return "FILE"
	}
	return fmt.Sprintf("MemType(%d)", uint8(t))
}

// Desc is one contiguous piece of a transfer, as in NIXL: an address (DRAM)
// or file offset (FILE), a length, and a device ID (FILE: the region's ID;
// DRAM: ignored).
type Desc struct {
	Addr  uint64
	Len   uint64
	DevID uint32
}

// DescList is a list of descriptors of one memory type.
type DescList struct {
	Type  MemType
	Descs []Desc
}

// regionInfo is what peers know of a region: its place and, for shared
// memory, the segment to map. It is the unit of metadata.
type regionInfo struct {
	ID    uint32
	Type  MemType
	Flags uint8 // regionSHM, regionDirect
	Base  uint64
	Len   uint64
	SHM   string // segment name when Flags&regionSHM
}

const (
	regionSHM    = 1 << 0 // DRAM in a shared segment peers on the host can map
	regionDirect = 1 << 1 // FILE opened with O_DIRECT
)

func (r regionInfo) end() uint64 { return r.Base + r.Len }

// regionTable finds the region that holds a descriptor. Regions of one type
// may overlap (a user may register overlapping ranges); lookups return one
// that holds the whole descriptor. It is pure logic: no I/O, no locking.
type regionTable struct {
	dram []regionInfo // sorted by Base, then by Len descending
	file map[uint32]regionInfo
}

func (t *regionTable) add(r regionInfo) {
	if r.Type == FILE {
		if t.file == nil {
			t.file = map[uint32]regionInfo{}
		}
		t.file[r.ID] = r
		return
	}
	i := sort.Search(len(t.dram), func(i int) bool {
		d := t.dram[i]
		return d.Base > r.Base || d.Base == r.Base && d.Len <= r.Len
	})
	t.dram = append(t.dram, regionInfo{})
	copy(t.dram[i+1:], t.dram[i:])
	t.dram[i] = r
}

func (t *regionTable) remove(id uint32) {
	delete(t.file, id)
	for i, d := range t.dram {
		if d.ID == id {
			t.dram = append(t.dram[:i], t.dram[i+1:]...)
			return
		}
	}
}

func (t *regionTable) byID(id uint32) (regionInfo, bool) {
	if r, ok := t.file[id]; ok {
		return r, true
	}
	for _, d := range t.dram {
		if d.ID == id {
			return d, true
		}
	}
	return regionInfo{}, false
}

// find returns the region that holds [addr, addr+n) of type typ (for FILE,
// the region devID, offsets relative to the file).
func (t *regionTable) find(typ MemType, addr, n uint64, devID uint32) (regionInfo, error) {
	end := addr + n
	if end < addr {
		return regionInfo{}, fmt.Errorf("%w: [%#x, +%d) wraps around", ErrOutOfBounds, addr, n)
	}
	switch typ {
	case FILE:
		r, ok := t.file[devID]
		if ok && addr >= r.Base && end <= r.end() {
			return r, nil
		}
	case DRAM:
		// Regions starting at or below addr, the nearest first.
		i := sort.Search(len(t.dram), func(i int) bool { return t.dram[i].Base > addr })
		for j := i - 1; j >= 0; j-- {
			if r := t.dram[j]; end <= r.end() {
				return r, nil
			}
		}
	default:
		return regionInfo{}, fmt.Errorf("p2p: memory type %v: %w", typ, ErrNotSupported)
	}
	return regionInfo{}, fmt.Errorf("%w: %v [%#x, +%d) dev %d", ErrOutOfBounds, typ, addr, n, devID)
}

func (t *regionTable) all() []regionInfo {
	out := append([]regionInfo(nil), t.dram...)
	for _, r := range t.file {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
