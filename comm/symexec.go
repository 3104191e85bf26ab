package comm

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/internal/memops"
	"github.com/gccl/gccl/transport"
)

// The symmetric-memory all-reduce. When both buffers of a large all-reduce
// lie in memory from Alloc and every peer's copy is addressable, each rank
// reduces its 1/n slice straight from the peers' inputs and writes the
// result straight into the peers' outputs; nothing goes through slot rings.
// Per rank that is n reads and n writes of N/n bytes, about half the memory
// traffic of the ring's reduce-scatter + all-gather through slots, and no
// copy in or out of a slot.
//
// Two small message rounds over the ordinary transport frame it (rounds.go,
// shared with the device path):
//   - arrival: each rank tells every peer where its buffers are (Alloc
//     number and offset), and the count, type and op; a rank starts reading
//     a peer's input only after that peer's arrival, and checks that the
//     peer's buffers are regions it has mapped and that the operation is the
//     same, else ErrMismatch (and then does no share of the work).
//   - departure: each rank tells every peer it has written its slice, or
//     that it failed; a rank returns only when every peer has departed, so
//     its output is complete, and no peer still reads its input; a peer's
//     failure fails the call everywhere.
//
// Using the transport for the rounds, rather than flags in shared memory,
// gives them the executor's waits, timeouts, watchdog and failure handling,
// and makes a rank that took this path while a peer took the ring fail with
// ErrMismatch instead of hanging. A slice of any input is read by one rank
// only, and a slice of any output is written by one rank only, so in-place
// calls are safe: each rank reads a chunk before anyone writes it.

// symMinBytes is the smallest all-reduce that takes the symmetric path; below
// it the two message rounds cost more than the slot copies they save.
const symMinBytes = 64 << 10

// symChunkBytes is how much of its slice a rank reduces and scatters at a
// time: small enough that the result is still in cache when it is copied to
// the peers.
const symChunkBytes = 128 << 10

// symNTMinBytes is the smallest all-reduce whose cold outputs are written
// with non-temporal stores. Below it the buffers often sit in cache (a 2 MiB
// L2 per core here), where non-temporal stores only evict them: gccl-perf
// -R, 2 processes, buffers reused, 1 MiB out of place took 107 µs with them
// and 46 µs in place without; with buffers far larger than the caches, they
// cut 16 MiB from ~3.3-4.7 ms to ~2.6-2.9 ms.
const symNTMinBytes = 8 << 20

// symRecord is what a rank announces on arrival.
type symRecord struct {
	inID, outID   uint32 // Alloc numbers; noSym for a buffer not passed
	inOff, outOff uint64
	inLen, outLen uint64 // bytes
	count         uint64
	dt, op, coll  uint8
	root          uint32
	scalar        float64 // the rank's own pre-multiplier (PreMulSum, Avg)
}

// noSym marks a record's buffer as absent (a non-root's Broadcast input).
const noSym = ^uint32(0)

const symRecordLen = 63

func (r *symRecord) put(b []byte) {
	le := binary.LittleEndian
	le.PutUint32(b[0:], r.inID)
	le.PutUint32(b[4:], r.outID)
	le.PutUint64(b[8:], r.inOff)
	le.PutUint64(b[16:], r.outOff)
	le.PutUint64(b[24:], r.inLen)
	le.PutUint64(b[32:], r.outLen)
	le.PutUint64(b[40:], r.count)
	b[48], b[49], b[50] = r.dt, r.op, r.coll
	le.PutUint32(b[51:], r.root)
	le.PutUint64(b[55:], math.Float64bits(r.scalar))
}

func (r *symRecord) get(b []byte) {
	le := binary.LittleEndian
	r.inID, r.outID = le.Uint32(b[0:]), le.Uint32(b[4:])
	r.inOff, r.outOff = le.Uint64(b[8:]), le.Uint64(b[16:])
	r.inLen, r.outLen = le.Uint64(b[24:]), le.Uint64(b[32:])
	r.count = le.Uint64(b[40:])
	r.dt, r.op, r.coll = b[48], b[49], b[50]
	r.root = le.Uint32(b[51:])
	r.scalar = math.Float64frombits(le.Uint64(b[55:]))
}

// symPeer is where one peer's buffers are for the running operation.
type symPeer struct {
	in, out []byte
	inPlace bool // in and out are the same memory
	scalar  float64
}

// runSym runs a prepared all-reduce, reduce-scatter, all-gather or
// broadcast on symmetric memory (classify chose pathSymmetric: symCall).
func (c *Comm) runSym(ctx context.Context, a *collArgs, cl *call) error {
	me := symRecord{
		inID: noSym, outID: noSym, inLen: uint64(len(a.in)), outLen: uint64(len(a.out)),
		count: uint64(a.count), dt: uint8(cl.dtype()), op: uint8(cl.op.Kind), coll: uint8(cl.coll),
		root: uint32(cl.root), scalar: a.s,
	}
	if reg, off, ok := c.findSym(a.in); ok && (cl.coll != algo.Broadcast || cl.root == c.rank) {
		me.inID, me.inOff = reg.id, uint64(off)
	} else {
		me.inLen = 0
	}
	if reg, off, ok := c.findSym(a.out); ok {
		me.outID, me.outOff = reg.id, uint64(off)
	}
	c.symOps.Add(1)
	x := &c.exec
	x.begin(ctx, cl.name(), cl.seq, transport.MakeTag(tagSymArrive, cl.seq))
	me.put(c.symMsg[:])
	failed, err := c.exchange(c.symMsg[:], symArrival)
	if err != nil {
		return err // the transport failed: the Comm aborts
	}
	if failed == nil {
		switch cl.coll {
		case algo.AllReduce:
			c.symReduceScatterWrite(a, &me)
		case algo.ReduceScatter:
			c.symReduceScatter(a, &me)
		case algo.AllGather:
			c.symAllGather(a)
		case algo.Broadcast:
			c.symBroadcast(a, cl.root)
		}
	}
	// Every rank that arrived departs, failed or not (rounds.go).
	x.tag = transport.MakeTag(tagSymDepart, cl.seq)
	if err := c.depart(failed != nil); err != nil && failed == nil {
		failed = err
	}
	return failed
}

// symReduceScatter reduces this rank's block straight from every rank's
// input into its output.
func (c *Comm) symReduceScatter(a *collArgs, me *symRecord) {
	esz := a.esz
	blk := a.count * esz
	base := c.rank * blk
	step := max(symChunkBytes/esz, 1) * esz
	for b := 0; b < blk; b += step {
		f := min(b+step, blk)
		c.symReduceChunk(a, me, a.out[b:f], base+b, base+f)
	}
}

// symAllGather writes this rank's block straight into every rank's output;
// large blocks go to the peers with non-temporal stores (their outputs are
// cold here).
func (c *Comm) symAllGather(a *collArgs) {
	blk := len(a.in)
	at := c.rank * blk
	nt := len(a.out) >= symNTMinBytes
	if !sameMem(a.in, a.out[at:at+blk]) {
		ntCopy(a.out[at:at+blk], a.in, nt)
	}
	for i := 1; i < c.size; i++ {
		p := (c.rank + i) % c.size // spread the writers over the targets
		ntCopy(c.symPeers[p].out[at:at+blk], a.in, nt)
	}
}

// ntCopy copies with non-temporal stores when nt is set (large copies into
// memory this rank has not touched), else with copy.
func ntCopy(dst, src []byte, nt bool) {
	if nt {
		memops.CopyNT(dst, src)
	} else {
		copy(dst, src)
	}
}

// symBroadcast copies the root's input straight into this rank's output:
// every rank pulls its own copy, so the root does not copy n times.
func (c *Comm) symBroadcast(a *collArgs, root int) {
	src := a.in
	if c.rank != root {
		src = c.symPeers[root].in
	}
	if !sameMem(a.out, src) {
		ntCopy(a.out, src, len(a.out) >= symNTMinBytes)
	}
}

// symResolve checks peer p's arrival record against this rank's and finds
// p's buffers in this rank's views of the regions it names.
func (c *Comm) symResolve(p int, msg, mine []byte) error {
	if p == c.rank {
		var me symRecord
		me.get(mine)
		c.symPeers[c.rank] = symPeer{scalar: me.scalar}
		return nil
	}
	var me, rec symRecord
	me.get(mine)
	rec.get(msg)
	if rec.count != me.count || rec.dt != me.dt || rec.op != me.op || rec.coll != me.coll || rec.root != me.root {
		return fmt.Errorf("%w: peer runs %v of %d %v (op %v, root %d) on symmetric memory, this rank %v of %d %v (op %v, root %d)",
			ErrMismatch, algo.Collective(rec.coll), rec.count, DataType(rec.dt), Op{Kind: OpKind(rec.op)}, int32(rec.root),
			algo.Collective(me.coll), me.count, DataType(me.dt), Op{Kind: OpKind(me.op)}, int32(me.root))
	}
	var in, out []byte
	var err error
	if rec.inID != noSym {
		if in, err = c.symPeerBytes(p, rec.inID, rec.inOff, rec.inLen); err != nil {
			return err
		}
	}
	if out, err = c.symPeerBytes(p, rec.outID, rec.outOff, rec.outLen); err != nil {
		return err
	}
	if (me.inLen != rec.inLen && me.inID != noSym && rec.inID != noSym) || me.outLen != rec.outLen {
		return fmt.Errorf("%w: peer's buffers hold %d and %d bytes, this rank's %d and %d", ErrMismatch, rec.inLen, rec.outLen, me.inLen, me.outLen)
	}
	c.symPeers[p] = symPeer{in: in, out: out, inPlace: sameMem(in, out), scalar: rec.scalar}
	return nil
}

func (c *Comm) symPeerBytes(p int, id uint32, off, n uint64) ([]byte, error) {
	r := c.symByID(id)
	if r == nil || r.peers[p] == nil {
		return nil, fmt.Errorf("%w: peer's buffer is in symmetric allocation #%d, which this rank has not mapped (freed, or never allocated)", ErrMismatch, id)
	}
	if off > uint64(r.size) || n > uint64(r.size)-off {
		return nil, fmt.Errorf("%w: peer's buffer [%d, +%d) lies outside symmetric allocation #%d of %d bytes", ErrMismatch, off, n, id, r.size)
	}
	return r.peers[p][off : off+n], nil
}

// symSlice returns rank r's slice of count elements, in elements, cut on
// 64-byte boundaries so every rank's kernels start aligned.
func symSlice(count, esz, r, n int) (lo, hi int) {
	unit := 64 / esz
	units := (count + unit - 1) / unit
	lo = units * r / n * unit
	hi = min(units*(r+1)/n*unit, count)
	return min(lo, count), hi
}

// symReduceScatterWrite reduces this rank's slice from every rank's input, in
// a fixed order (own input first, then the peers by rank), and writes the
// result to every rank's output, a cache-sized chunk at a time.
//
// In large operations, outputs that are not also inputs are cold: this rank
// has not read them, so an ordinary store would first fetch every line
// (read-for-ownership). Those are written with non-temporal stores instead,
// from a scratch chunk that stays in cache, which removes a third of the
// memory traffic. An in-place output slice was just read by this rank and
// is in its cache, so ordinary stores are the cheap ones there.
func (c *Comm) symReduceScatterWrite(a *collArgs, me *symRecord) {
	esz := a.esz
	lo, hi := symSlice(a.count, esz, c.rank, c.size)
	step := max(symChunkBytes/esz, 1)
	large := len(a.out) >= symNTMinBytes
	scratch := large && !sameMem(a.in, a.out)
	if scratch && len(c.symScratch) < step*esz {
		c.symScratch = make([]byte, step*esz)
	}
	for s := lo; s < hi; s += step {
		e := min(s+step, hi)
		b, f := s*esz, e*esz
		dst := a.out[b:f]
		if scratch {
			dst = c.symScratch[:f-b]
		}
		c.symReduceChunk(a, me, dst, b, f)
		if scratch {
			memops.CopyNT(a.out[b:f], dst)
		}
		for p := range c.size {
			if p != c.rank {
				peer := &c.symPeers[p]
				ntCopy(peer.out[b:f], dst, large && !peer.inPlace)
			}
		}
	}
}

// symReduceChunk reduces bytes [b, f) of every rank's input into dst.
func (c *Comm) symReduceChunk(a *collArgs, me *symRecord, dst []byte, b, f int) {
	own := a.in[b:f]
	first := true
	for p := range c.size {
		if p == c.rank {
			continue
		}
		src := c.symPeers[p].in[b:f]
		switch {
		case first && a.premul:
			a.scale(dst, own, me.scalar)
			a.axpy(dst, dst, src, c.symPeers[p].scalar)
		case first:
			a.red(dst, own, src)
		case a.premul:
			a.axpy(dst, dst, src, c.symPeers[p].scalar)
		default:
			a.red(dst, dst, src)
		}
		first = false
	}
	if a.post {
		a.div(dst, dst, c.size)
	}
}
