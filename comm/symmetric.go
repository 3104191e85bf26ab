package comm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"
)

// Symmetric memory: buffers from Alloc exist once per rank, at the same
// allocation number everywhere, and every rank can address every peer's copy
// (in-process ranks share the heap; processes on one host map each other's
// shared-memory regions). Large all-reduces whose buffers lie in such memory
// read and write peers' buffers directly instead of streaming chunks through
// slot rings (see symexec.go).

// SymBuffer is a buffer from Comm.Alloc. It is a Buffer like any other, and
// collectives given buffers inside it (whole or sliced, through the Buffer
// methods or the generic functions) may take the zero-copy paths.
type SymBuffer struct {
	c   *Comm
	reg *symRegion
	dt  DataType
	n   int
}

// DataType is the element type.
func (b *SymBuffer) DataType() DataType { return b.dt }

// Len is the number of elements.
func (b *SymBuffer) Len() int { return b.n }

// HostBytes is the buffer's memory, or nil after Free.
func (b *SymBuffer) HostBytes() []byte {
	if b.reg == nil || b.reg.freed {
		return nil
	}
	return b.reg.mine[:b.n*b.dt.Size()]
}

// Mapped reports whether this rank can address every peer's copy of the
// buffer, so that collectives on it may read and write peers' memory
// directly. It is false when some peer is on another host or reached over
// the network (GCCL_SHM_DISABLE=1); the buffer then works like any other.
func (b *SymBuffer) Mapped() bool { return b.reg != nil && !b.reg.freed && b.reg.all }

// SymSlice returns b's memory as a []T, or an error when T is not b's type
// or b was freed. The slice is valid until Free or the Comm's Close (the
// memory is unmapped then: touching it afterwards faults); passing it (or
// part of it) to a collective counts as passing b.
func SymSlice[T Scalar](b *SymBuffer) ([]T, error) {
	if TypeOf[T]() != b.dt {
		return nil, invalid("SymSlice of a %v buffer as %v", b.dt, TypeOf[T]())
	}
	mem := b.HostBytes()
	if mem == nil {
		return nil, invalid("SymSlice of a freed buffer")
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(mem))), b.n), nil
}

// Free releases the buffer on this rank. It is local, not collective: a
// peer's mapping of this rank's memory stays valid until that peer frees its
// buffer of the same Alloc, so no rank faults. The memory must not be used
// after Free, and no operation using it may be in flight.
func (b *SymBuffer) Free() error {
	if b.reg == nil {
		return nil
	}
	b.c.async.drain()
	return b.c.freeRegion(b.reg)
}

// symRegion is one Alloc on one rank: its own memory and its views of every
// peer's memory of the same Alloc.
type symRegion struct {
	id    uint32 // the Alloc's number on this Comm, the same on every rank
	size  int    // bytes, the same on every rank
	mine  []byte
	peers [][]byte // by rank; nil where the peer's memory is not mapped
	maps  []symMem // to unmap at Free (own memory included)
	all   bool     // every peer's memory is mapped
	freed bool
}

// symTable is the Comm's set of live regions. It is replaced, never changed,
// so the executor looks up buffers without a lock.
type symTable []*symRegion

// findSym returns the region holding all of b, and b's offset in it.
func (c *Comm) findSym(b []byte) (*symRegion, int, bool) {
	t := c.syms.Load()
	if t == nil || len(b) == 0 {
		return nil, 0, false
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	for _, r := range *t {
		base := uintptr(unsafe.Pointer(unsafe.SliceData(r.mine)))
		if p >= base && p-base+uintptr(len(b)) <= uintptr(len(r.mine)) {
			return r, int(p - base), true
		}
	}
	return nil, 0, false
}

// symByID returns the live region with the given Alloc number.
func (c *Comm) symByID(id uint32) *symRegion {
	if t := c.syms.Load(); t != nil {
		for _, r := range *t {
			if r.id == id {
				return r
			}
		}
	}
	return nil
}

// Alloc allocates count elements of dt in symmetric memory: every rank gets
// its own zeroed buffer, and every rank can address every peer's. Large
// collectives on such buffers read peers' data directly (all-reduce does so
// now). Alloc is collective: every rank calls it, in the same order relative
// to its other operations, with the same type and count. It is slow (a
// rendezvous round and a mapping per peer): allocate once, reuse, and Free
// (or Close the Comm) at the end.
//
// Processes map each other's memory only on one host and over shared memory;
// a buffer whose peers are on other hosts still works with every collective,
// through the transports.
func (c *Comm) Alloc(ctx context.Context, dt DataType, count int) (*SymBuffer, error) {
	if err := c.enter(); err != nil {
		return nil, err
	}
	defer c.leave()
	c.async.drain()
	c.allocSeq++
	id := c.allocSeq
	size := count * dt.Size()
	var bad error
	switch {
	case !dt.Valid():
		bad = invalid("Alloc of unknown data type %v", dt)
	case count <= 0:
		bad = invalid("Alloc of %d elements", count)
	case count > maxAllocBytes/dt.Size():
		bad = invalid("Alloc of %d %v elements: more than %d bytes", count, dt, maxAllocBytes)
	}
	reg, err := c.allocRegion(ctx, id, size, bad)
	if err != nil {
		var oe *OpError
		if errors.As(err, &oe) {
			oe.Seq = uint64(id)
			return nil, oe
		}
		return nil, &OpError{Op: "Alloc", Rank: c.rank, Seq: uint64(id), Peer: -1, Err: err}
	}
	c.publishSym(reg)
	if reg.all {
		c.log.Debug("symmetric buffer ready", "subsys", "INIT", "bytes", size, "id", id)
	} else {
		c.log.Info("symmetric buffer: some peers are not on shared memory, collectives on it use the transports",
			"subsys", "INIT", "bytes", size, "id", id)
	}
	return &SymBuffer{c: c, reg: reg, dt: dt, n: count}, nil
}

// maxAllocBytes bounds one Alloc, so a count times an element size cannot
// overflow and a typo cannot ask for exabytes.
const maxAllocBytes = 1 << 40

func (c *Comm) publishSym(r *symRegion) {
	c.symMu.Lock()
	defer c.symMu.Unlock()
	var t symTable
	if old := c.syms.Load(); old != nil {
		t = append(t, *old...)
	}
	t = append(t, r)
	c.syms.Store(&t)
}

func (c *Comm) freeRegion(r *symRegion) error {
	c.symMu.Lock()
	defer c.symMu.Unlock()
	if r.freed {
		return nil
	}
	r.freed = true
	var t symTable
	if old := c.syms.Load(); old != nil {
		for _, o := range *old {
			if o != r {
				t = append(t, o)
			}
		}
	}
	c.syms.Store(&t)
	var err error
	for _, m := range r.maps {
		if e := m.Close(); err == nil {
			err = e
		}
	}
	r.mine, r.peers, r.maps = nil, nil, nil
	return err
}

// freeAllSym releases every region; Close and a failed Init use it.
func (c *Comm) freeAllSym() {
	for {
		t := c.syms.Load()
		if t == nil || len(*t) == 0 {
			return
		}
		c.freeRegion((*t)[0])
	}
}

// agreeAlloc turns the ranks' Alloc outcomes into a verdict that fails on
// every rank if it fails on one: this rank's own error, else the first
// failed peer's (as an *OpError naming it), else a disagreement on the size.
func agreeAlloc(rank, size int, sizes []int, errs []error) error {
	if errs[rank] != nil {
		return errs[rank]
	}
	for p, e := range errs {
		if e != nil {
			return &OpError{Op: "Alloc", Rank: rank, Peer: p, Err: fmt.Errorf("peer could not allocate: %v", e)}
		}
	}
	for p, s := range sizes {
		if s != size {
			return &OpError{Op: "Alloc", Rank: rank, Peer: p, Err: fmt.Errorf(
				"%w: peer allocates %d bytes, this rank %d (Alloc must be called with the same type and count everywhere)",
				ErrMismatch, s, size)}
		}
	}
	return nil
}

// allocRegion is Alloc's rendezvous: each rank allocates its memory
// (rendezvous.allocSym: shared memory across processes, the heap in one
// process), the ranks swap names, each maps the peers' memory it can reach
// (mapSym), reports failures to everyone in a second round, which is also
// the barrier before the names are unlinked (a crash then leaves nothing
// in /dev/shm), and every rank fails if one did.
func (c *Comm) allocRegion(ctx context.Context, id uint32, size int, bad error) (_ *symRegion, err error) {
	reg := &symRegion{id: id, size: size, peers: make([][]byte, c.size)}
	defer func() {
		if err != nil { // reg, not the result, which is nil by now
			for _, m := range reg.maps {
				m.Close()
			}
		}
	}()
	var own symMem
	if bad == nil {
		if own, bad = c.rv.allocSym(c, size); bad == nil {
			reg.maps = append(reg.maps, own)
			reg.mine = own.Bytes()
			reg.peers[c.rank] = reg.mine
		}
	}
	name := ""
	if own != nil {
		name = own.Name()
	}
	sent := size
	if bad != nil {
		sent = 0 // may be out of range; the error is what counts
	}
	sizes, names, err := c.allocRound(ctx, "Alloc", allocInfo{sent, name, bad}, size, nil)
	if err != nil {
		return nil, err
	}
	var mapErr error
	reg.all = true
	for p := range c.size {
		if p == c.rank {
			continue
		}
		m, err := c.rv.mapSym(c, p, names[p], size)
		if err != nil {
			mapErr = err
			break
		}
		if m == nil {
			reg.all = false
			continue
		}
		reg.maps = append(reg.maps, m)
		reg.peers[p] = m.Bytes()
	}
	_, _, err = c.allocRound(ctx, "Alloc", allocInfo{size: size, err: mapErr}, size, sizes)
	if own != nil {
		own.Unlink() // every rank has mapped it, or failed: a crash now leaves nothing in /dev/shm
	}
	if err != nil {
		return nil, err
	}
	return reg, nil
}

// allocRound is one round of the rendezvous of Alloc and RegisterDevice
// (op, for errors): it swaps this rank's info with every rank's and fails
// on every rank if one rank failed or asked for another size than this
// one's. The first round (sizes nil) returns every rank's size and name;
// a later round checks the sizes of the first.
func (c *Comm) allocRound(ctx context.Context, op string, mine allocInfo, size int, sizes []int) ([]int, []string, error) {
	blobs, err := c.rv.allGather(ctx, mine.marshal())
	if err != nil {
		return nil, nil, err
	}
	first := sizes == nil
	if first {
		sizes = make([]int, c.size)
	}
	names := make([]string, c.size)
	errs := make([]error, c.size)
	for p, b := range blobs {
		info, err := unmarshalAllocInfo(b)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: rank %d's %s reply: %w", ErrMismatch, p, op, err)
		}
		if first {
			sizes[p] = info.size
		}
		names[p], errs[p] = info.name, info.err
	}
	errs[c.rank] = mine.err // this rank's own, with its identity (the wire keeps the text)
	return sizes, names, agreeAlloc(c.rank, size, sizes, errs)
}

// allocInfo is one rank's message in an Alloc round: the size it asked
// for, then its region's name, or why it failed.
type allocInfo struct {
	size int
	name string
	err  error
}

func (a allocInfo) marshal() []byte {
	b := binary.AppendUvarint(nil, uint64(a.size))
	if a.err != nil {
		b = append(b, 1)
		return append(b, a.err.Error()...)
	}
	b = append(b, 0)
	return append(b, a.name...)
}

func unmarshalAllocInfo(b []byte) (allocInfo, error) {
	s, n := binary.Uvarint(b)
	if n <= 0 || s > maxAllocBytes || len(b) < n+1 {
		return allocInfo{}, errors.New("malformed")
	}
	rest := string(b[n+1:])
	switch b[n] {
	case 0:
		return allocInfo{size: int(s), name: rest}, nil
	case 1:
		return allocInfo{size: int(s), err: errors.New(rest)}, nil
	}
	return allocInfo{}, errors.New("malformed")
}
