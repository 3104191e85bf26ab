package shm

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// Mailbox layout. All offsets are from the start of the segment; every
// process maps what it needs, at whatever address, and finds its parts by
// these offsets.
//
//	0                header (one page, or more in a large job)
//	  0                identity and geometry, immutable once magic is set
//	  128              state: open, closed or aborted (and reason at 512)
//	  256              bell: futex word and sleeper count
//	  512              abort reason, reasonLen bytes
//	  1024             ring table: one uint64 per rank of the job, the
//	                   offset of the ring from the owner to that rank; 1 for
//	                   a local peer without a ring yet, 0 for other ranks
//	headerSize       the owner's outgoing rings, in the order it made them,
//	                 each ringStride bytes:
//	  0                head: messages ever released (written by the receiver)
//	  256              the slot lines, lineCount of them (the rest of the
//	                   first linePages pages), 128 bytes each: sequence
//	                   number, length, tag and up to 104 bytes of inline
//	                   data (written by the sender)
//	  smallOff         small data areas, smallCount of smallSize bytes,
//	                   page aligned: message k, up to smallSize bytes and
//	                   too long for its line, is in area k % smallCount
//	                   (absent, smallSize 0, where slots are not larger
//	                   than smallMax)
//	  dataOff          slot data, slotStride bytes per slot, page aligned;
//	                   message k's is data slot k % slotCount
//
// A rank's mailbox starts as its header only; the ring to a peer is added
// (the file grows) when the rank first sends to that peer, so a rank's
// shared memory grows with the peers it talks to, not with the job: the
// all-to-all connects every pair, a ring all-reduce two neighbours. The
// sender owns the ring, so making it never waits for the peer: the sender
// writes it at once and publishes its offset in the table, and the
// receiver maps it (through the descriptor of the file it opened at
// Connect) the first time it looks for a message.
//
// A message is ready when its slot's sequence number says so: the receiver
// polls the one slot line (a pair of cache lines) that also carries
// length, tag and, for small messages, the data, so a small message costs
// one line's transfer.
// Larger messages use a small data area, or beyond smallSize a data slot;
// both stay aligned for the reduction kernels. Message k sits in line
// k % lineCount; a message that fits in its line needs only its line free,
// one of up to smallSize bytes also its small area, free once message
// k - smallCount is released, a larger one its data slot, free once message
// k - slotCount is released. So messages of up to 104 bytes (a broadcast
// of 8 bytes, an arrival round) run up to lineCount ahead of their
// receiver, those of up to 1 KiB smallCount ahead, and ranks that share
// cores hand over their core less often. The sender reads the head only
// when the ring looks full.
//
// Words that different processes write sit at least 128 bytes apart, not
// 64: Intel cores fetch cache lines in adjacent pairs, so two words 64 bytes
// apart still contend.
const (
	segmentMagic  = 0x314d48534c434347 // "GCCLSHM1", little endian
	layoutVersion = 6

	cacheLine    = 64
	pageSize     = 4096
	ringTableOff = 1024
	metaOff      = 256                                         // within a ring
	metaStride   = 2 * cacheLine                               // a slot's line: a pair, as Intel cores fetch them (above)
	inlineMax    = metaStride - 24                             // data bytes carried in the slot's line: 104
	linePages    = 16                                          // a ring's counters and slot lines
	minLines     = (linePages*pageSize - metaOff) / metaStride // the lines those pages hold: 510
	minSmall     = 32                                          // small data areas, where slots are larger
	smallMax     = 1024                                        // each small data area's size
	reasonMax    = 512
)

// Rank states in the header.
const (
	stateOpen    uint32 = 0 // zero: a fresh segment is open
	stateClosed  uint32 = 1
	stateAborted uint32 = 2
)

// header is the start of a mailbox. Fields that other processes read while
// the owner may write them are accessed atomically.
type header struct {
	magic      uint64 // set last at creation: a peer that reads it sees the rest
	version    uint32
	headerSize uint32
	rank       uint32
	worldSize  uint32
	ownerPid   uint32
	nRings     uint32 // rings the owner made so far (informational)
	slotSize   uint64
	slotCount  uint64
	ringStride uint64
	_          uint64
	pidNS      uint64 // inode of the owner's pid namespace, 0 if unknown
	_          [56]byte

	// Line 2, read by peers before every send: stays shared in their
	// caches because it is written once, at close.
	state     uint32
	reasonLen uint32
	_         [120]byte

	// Line 4, the bell. Peers read sleepers after every commit and release,
	// and write only when the owner sleeps.
	bell     uint32 // futex word; Seq
	sleepers uint32 // goroutines of the owner inside Wait
	_        [248]byte

	reason [reasonMax]byte
}

// ringCounters starts every ring.
type ringCounters struct {
	head atomic.Uint64
	_    [metaOff - 8]byte
}

// slotMeta is one slot's line, a pair of cache lines. Each slot has its
// own, so that the sender filling slot i+1 does not disturb the receiver
// reading slot i, not even through the adjacent-line prefetcher.
type slotMeta struct {
	// seq is k+1 once message k (counting from 0) is committed to this
	// slot; the sender stores it last.
	seq    atomic.Uint64
	len    uint32
	_      uint32
	tag    uint64
	inline [inlineMax]byte
}

func init() {
	// The layout is shared between processes: catch accidental changes.
	if unsafe.Offsetof(header{}.state) != 128 || unsafe.Offsetof(header{}.bell) != 256 ||
		unsafe.Offsetof(header{}.reason) != 512 || unsafe.Sizeof(header{}) != ringTableOff ||
		unsafe.Sizeof(ringCounters{}) != metaOff || unsafe.Sizeof(slotMeta{}) != metaStride {
		panic("shm: mailbox layout changed; bump layoutVersion and fix the offsets")
	}
}

// ringNone and ringLocal are ring-table entries below any ring offset:
// not a local peer, and a local peer the owner has not sent to yet.
const (
	ringNone  = 0
	ringLocal = 1
)

// geometry is where everything lies in the mailbox of a job of worldSize
// ranks.
type geometry struct {
	slotSize, slotCount int
	// lineCount is how many slot lines a ring has: at least slotCount,
	// and as many as the ring's first linePages hold (minLines). Message k
	// takes line k % lineCount and, when it does not fit in the line
	// (inlineMax), small data area k % smallCount (up to smallSize bytes)
	// or else data slot k % slotCount.
	lineCount  int
	smallCount int // at least slotCount, and minSmall
	smallSize  int // smallMax where slots are larger, else 0
	worldSize  int
	slotStride int // slot data, rounded to a cache line
	smallOff   int // the small data areas within a ring, page aligned
	dataOff    int // slot data within a ring, page aligned
	ringStride int
	headerSize int
}

func roundUp(n, to int) int { return (n + to - 1) / to * to }

func newGeometry(slotSize, slotCount, worldSize int) (geometry, error) {
	g := geometry{slotSize: slotSize, slotCount: slotCount, lineCount: max(slotCount, minLines),
		smallCount: max(slotCount, minSmall), worldSize: worldSize}
	if slotSize > smallMax {
		g.smallSize = smallMax
	}
	g.slotStride = roundUp(slotSize, cacheLine)
	g.smallOff = roundUp(metaOff+g.lineCount*metaStride, pageSize)
	g.dataOff = roundUp(g.smallOff+g.smallCount*g.smallSize, pageSize)
	ring := int64(g.dataOff) + int64(slotCount)*int64(g.slotStride)
	if ring > 1<<40 {
		return g, fmt.Errorf("shm: ring of %d slots of %d bytes is too large", slotCount, slotSize)
	}
	g.ringStride = roundUp(int(ring), pageSize)
	g.headerSize = roundUp(ringTableOff+8*worldSize, pageSize)
	return g, nil
}

// ringOff is where the owner's i-th ring (counting from 0) lies.
func (g geometry) ringOff(i int) int { return g.headerSize + i*g.ringStride }

// smallLimit is the longest message that needs no data slot.
func (g geometry) smallLimit() int { return max(inlineMax, g.smallSize) }

// size is the mailbox's size with n rings.
func (g geometry) size(n int) int64 { return int64(g.headerSize) + int64(n)*int64(g.ringStride) }
