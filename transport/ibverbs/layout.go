package ibverbs

import (
	"encoding/binary"
	"fmt"
)

// The memory of one connection, registered as one region on each side:
//
//	offset                 size              what
//	0                      count × stride    receive ring: the peer's WRITEs land here
//	count × stride         count × stride    send ring: the slots TryReserve hands out
//	2 × count × stride     ctrlSize          control words (below)
//
// A slot is a header line, then slotSize bytes of data (stride =
// hdrSize + slotSize rounded up to a cache line). Both sides of a pair
// use the same geometry, so slot i of one side's send ring goes to slot i
// of the other's receive ring at the same offset.
//
// The header, little endian:
//
//	offset size field
//	0      4    length of the message
//	4      4    the message's sequence number, modulo 2^32 (a check)
//	8      8    tag
//	16     8    credit: the messages of the other direction the sender
//	            has released (its head), piggybacked
const (
	hdrSize  = 64
	hdrUsed  = 24
	lineSize = 64
	// The control area: the peer writes the first three fields, this side
	// the sources of its own writes.
	ctrlCredit    = 0   // the peer's head (messages it released), by its credit writes
	ctrlClose     = 8   // the peer's tail when it closed
	ctrlCreditSrc = 64  // this side's head, the source of its credit writes
	ctrlCloseSrc  = 72  // this side's tail, the source of its close notice
	ctrlReason    = 128 // the peer's abort reason
	ctrlReasonSrc = ctrlReason + reasonMax
	ctrlSize      = 4096
	reasonMax     = 256
)

// Striping: a message of at least stripeMin bytes is cut into one piece
// per QP, on stripeAlign boundaries; smaller ones go whole on QP 0.
const (
	stripeMin   = 128 << 10
	stripeAlign = 4096
	// MaxQPs bounds GCCL_IB_QPS_PER_CONNECTION: a message's piece count
	// travels in 4 bits of the immediate.
	MaxQPs = 16
)

// geometry is the shape of a connection's memory and queues, the same on
// both sides of a pair.
type geometry struct {
	slotSize, count, stride, qps int
}

func newGeometry(slotSize, count, qps int) (geometry, error) {
	switch {
	case slotSize < 1 || slotSize > 1<<30:
		return geometry{}, fmt.Errorf("ibverbs: slot size %d out of range [1, 1 GiB]", slotSize)
	case count < 2 || count > 1<<16:
		return geometry{}, fmt.Errorf("ibverbs: slot count %d out of range [2, 65536]", count)
	case qps < 1 || qps > MaxQPs:
		return geometry{}, fmt.Errorf("ibverbs: %d QPs per connection out of range [1, %d]", qps, MaxQPs)
	}
	stride := hdrSize + (slotSize+lineSize-1)/lineSize*lineSize
	return geometry{slotSize: slotSize, count: count, stride: stride, qps: qps}, nil
}

// recvOff and sendOff are the offsets of slot i's header in the rings.
func (g geometry) recvOff(i int) int { return i * g.stride }
func (g geometry) sendOff(i int) int { return (g.count + i) * g.stride }
func (g geometry) ctrlOff() int      { return 2 * g.count * g.stride }

// bytes is the size of the registered region.
func (g geometry) bytes() int { return g.ctrlOff() + ctrlSize }

// Queue depths. Per QP, the peer has at most count messages in flight
// (credits), each one piece on each QP; and this side at most count
// credits in flight to the peer unpolled (it releases only what it got),
// plus a close or abort notice, all on QP 0.
func (g geometry) recvDepth() int { return 2*g.count + 8 }
func (g geometry) sendDepth() int { return 2*g.count + 8 }

// ctlMax bounds the credit and notice writes outstanding on QP 0.
func (g geometry) ctlMax() int { return g.count + 4 }

// cqDepth is the completions a connection can have outstanding at once.
func (g geometry) cqDepth() int { return g.qps * (g.recvDepth() + g.sendDepth()) }

// pieces is how many QPs carry a message of n bytes.
func (g geometry) pieces(n int) int {
	if n < stripeMin || g.qps < 2 {
		return 1
	}
	return g.qps
}

// piece is the part of slot memory that QP j writes for an n-byte message
// cut into parts pieces: [off, off+length) from the slot's header. Piece 0
// carries the header with the first part of the data; every piece of a
// striped message is non-empty (n >= stripeMin >= 16 × stripeAlign).
func (g geometry) piece(n, parts, j int) (off, length int) {
	cut := func(k int) int {
		if k >= parts {
			return n
		}
		return int(int64(n)*int64(k)/int64(parts)) &^ (stripeAlign - 1)
	}
	lo, hi := cut(j), cut(j+1)
	if j == 0 {
		return 0, hdrSize + hi
	}
	return hdrSize + lo, hi - lo
}

// putHeader and header write and read a slot's header line; hdrCredit
// reads its credit.
func putHeader(b []byte, n int, seq, tag, credit uint64) {
	binary.LittleEndian.PutUint32(b[0:], uint32(n))
	binary.LittleEndian.PutUint32(b[4:], uint32(seq))
	binary.LittleEndian.PutUint64(b[8:], tag)
	binary.LittleEndian.PutUint64(b[16:], credit)
}

func header(b []byte) (n int, seq uint32, tag uint64) {
	return int(binary.LittleEndian.Uint32(b[0:])), binary.LittleEndian.Uint32(b[4:]), binary.LittleEndian.Uint64(b[8:])
}

func hdrCredit(b []byte) uint64 { return binary.LittleEndian.Uint64(b[16:]) }

// Credits are lazy: a release is credited to the sender once creditBatch
// releases are owed, or the receiver finds nothing to take or is about to
// sleep, or rides in the header of the next message the other way. The
// sender always keeps count-creditBatch+1 slots it may fill, so it never
// waits for a credit the receiver holds back while it works.
func (g geometry) creditBatch() uint64 { return uint64(max(1, g.count/2)) }

// Receives consumed are posted again repostBatch at a time (the queues
// hold 6 more than the most that can be outstanding).
const repostBatch = 4

// Every WRITE of the transport carries an immediate, so that the peer's
// receive completes and its completion channel can wake it: the kind in
// the top 3 bits, then
//
//	data:   pieces-1 (4 bits), the message's sequence number (25 bits)
//	credit: the releasing side's head (29 bits)
//	close:  the closing side's tail (29 bits)
//	abort:  the length of the reason written into the peer's control area
//
// Sequence numbers travel modulo 2^25 or 2^29 and are rebuilt from the
// receiver's own count (advance), which never lags more than count
// (at most 65536) behind.
type immKind uint32

const (
	immData immKind = iota
	immCredit
	immClose
	immAbort
)

const (
	kindShift = 29
	valBits   = 29
	valMask   = 1<<valBits - 1
	seqBits   = 25
	seqMask   = 1<<seqBits - 1
)

func makeImm(k immKind, v uint64) uint32 { return uint32(k)<<kindShift | uint32(v)&valMask }

func dataImm(seq uint64, parts int) uint32 {
	return makeImm(immData, uint64(parts-1)<<seqBits|seq&seqMask)
}

func splitImm(imm uint32) (immKind, uint32) { return immKind(imm >> kindShift), imm & valMask }

// splitData returns a data immediate's piece count and sequence bits.
func splitData(v uint32) (parts int, seq uint32) { return int(v>>seqBits) + 1, v & seqMask }

// advance is how far the counter whose low bits are low is ahead of cur
// (modulo 2^bits): the value is cur + advance.
func advance(cur uint64, low uint32, bits uint) uint64 {
	return (uint64(low) - cur) & (1<<bits - 1)
}

// Work request IDs name what completed: the kind, the QP, the peer.
type wrKind uint8

const (
	wrRecv wrKind = iota + 1
	wrData        // a message piece
	wrCtl         // a credit, or a close or abort notice
)

func makeWRID(k wrKind, qp, peer int) uint64 {
	return uint64(k)<<56 | uint64(qp)<<48 | uint64(uint32(peer))
}

func splitWRID(id uint64) (k wrKind, qp, peer int) {
	return wrKind(id >> 56), int(id >> 48 & 0xff), int(uint32(id))
}
