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
	// VRAM is GPU memory: Desc.Addr is a device address in the owner's
	// process and Desc.DevID the owner's device ordinal (Agent.RegisterVRAM).
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

// Desc is one contiguous piece of a transfer, as in NIXL: an address (DRAM,
// VRAM) or file offset (FILE), a length, and a device ID (VRAM: the CUDA
// device ordinal in the owner's process; FILE: the region's ID; DRAM:
// ignored).
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
// memory, the segment to map; for VRAM, the device and the CUDA IPC handle
// a peer on the host opens. It is the unit of metadata.
type regionInfo struct {
	ID    uint32
	Type  MemType
	Flags uint8 // regionSHM, regionDirect, regionIPC
	Base  uint64
	Len   uint64
	SHM   string // segment name when Flags&regionSHM
	// VRAM only.
	Dev    uint32             // device ordinal in the owner's process
	Bus    string             // the device's PCI bus id ("0000:3b:00.0")
	IPC    [ipcHandleLen]byte // handle of the allocation holding Base, when Flags&regionIPC
	IPCOff uint64             // Base's offset in that allocation
}

const (
	regionSHM    = 1 << 0 // DRAM in a shared segment peers on the host can map
	regionDirect = 1 << 1 // FILE opened with O_DIRECT
	regionIPC    = 1 << 2 // VRAM with a CUDA IPC handle peers on the host can open
)

func (r regionInfo) end() uint64 { return r.Base + r.Len }

// regionTable finds the region that holds a descriptor. Regions of one type
// may overlap (a user may register overlapping ranges); lookups return one
// that holds the whole descriptor. It is pure logic: no I/O, no locking.
type regionTable struct {
	dram []regionInfo // sorted by Base, then by Len descending
	vram []regionInfo // the same, all devices together (unified addressing)
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
	l := &t.dram
	if r.Type == VRAM {
		l = &t.vram
	}
	i := sort.Search(len(*l), func(i int) bool {
		d := (*l)[i]
		return d.Base > r.Base || d.Base == r.Base && d.Len <= r.Len
	})
	*l = append(*l, regionInfo{})
	copy((*l)[i+1:], (*l)[i:])
	(*l)[i] = r
}

func (t *regionTable) remove(id uint32) {
	delete(t.file, id)
	for _, l := range []*[]regionInfo{&t.dram, &t.vram} {
		for i, d := range *l {
			if d.ID == id {
				*l = append((*l)[:i], (*l)[i+1:]...)
				return
			}
		}
	}
}

func (t *regionTable) byID(id uint32) (regionInfo, bool) {
	if r, ok := t.file[id]; ok {
		return r, true
	}
	for _, l := range [][]regionInfo{t.dram, t.vram} {
		for _, d := range l {
			if d.ID == id {
				return d, true
			}
		}
	}
	return regionInfo{}, false
}

// find returns the region that holds [addr, addr+n) of type typ (for FILE,
// the region devID, offsets relative to the file; for VRAM, a region of
// device devID).
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
	case DRAM, VRAM:
		l := t.dram
		if typ == VRAM {
			l = t.vram
		}
		// Regions starting at or below addr, the nearest first.
		i := sort.Search(len(l), func(i int) bool { return l[i].Base > addr })
		for j := i - 1; j >= 0; j-- {
			if r := l[j]; end <= r.end() && (typ == DRAM || r.Dev == devID) {
				return r, nil
			}
		}
	default:
		return regionInfo{}, fmt.Errorf("p2p: memory type %v: %w", typ, ErrNotSupported)
	}
	return regionInfo{}, fmt.Errorf("%w: %v [%#x, +%d) dev %d", ErrOutOfBounds, typ, addr, n, devID)
}

func (t *regionTable) all() []regionInfo {
	out := append(append([]regionInfo(nil), t.dram...), t.vram...)
	for _, r := range t.file {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
