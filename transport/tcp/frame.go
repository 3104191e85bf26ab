package tcp

import (
	"encoding/binary"
	"fmt"

	"github.com/gccl/gccl/transport"
)

// Wire format. Stream 0 of a peer carries every message as a frame: a
// 16-byte header, then the message's stream-0 piece. A message of at least
// stripeMin bytes is cut into one piece per stream (see pieceRange); pieces
// on streams 1.. are raw bytes with no header, because the receiver learns
// their length and order from the stream-0 headers. Integers are little
// endian.
//
//	offset size  field
//	0      4     length: message bytes (data frame) or reason bytes (abort frame)
//	4      1     kind: frameData or frameAbort
//	5      3     reserved, zero
//	8      8     tag (data frame), zero (abort frame)
const frameHeaderLen = 16

type frameKind uint8

const (
	// frameData carries one message.
	frameData frameKind = 1
	// frameAbort is the last frame of an aborting endpoint; its payload is
	// the abort reason, as text.
	frameAbort frameKind = 2
)

// maxAbortReason bounds an abort frame's payload, so the receiver can stage
// it whole.
const maxAbortReason = 512

type frameHeader struct {
	kind   frameKind
	length uint32
	tag    transport.Tag
}

func putFrameHeader(b []byte, h frameHeader) {
	_ = b[frameHeaderLen-1]
	binary.LittleEndian.PutUint32(b[0:4], h.length)
	b[4], b[5], b[6], b[7] = byte(h.kind), 0, 0, 0
	binary.LittleEndian.PutUint64(b[8:16], uint64(h.tag))
}

// parseFrameHeader decodes a header that came off the wire. Anything a
// correct peer would not send is an error: the stream is then out of sync
// and the connection unusable.
func parseFrameHeader(b []byte, slotSize int) (frameHeader, error) {
	if len(b) < frameHeaderLen {
		return frameHeader{}, fmt.Errorf("tcp: frame header of %d bytes", len(b))
	}
	h := frameHeader{
		kind:   frameKind(b[4]),
		length: binary.LittleEndian.Uint32(b[0:4]),
		tag:    transport.Tag(binary.LittleEndian.Uint64(b[8:16])),
	}
	if b[5]|b[6]|b[7] != 0 {
		return frameHeader{}, fmt.Errorf("tcp: frame header has reserved bytes % x", b[5:8])
	}
	switch h.kind {
	case frameData:
		if int64(h.length) > int64(slotSize) {
			return frameHeader{}, fmt.Errorf("tcp: peer sent a %d-byte message; slots hold %d", h.length, slotSize)
		}
	case frameAbort:
		if h.length > maxAbortReason || h.tag != 0 {
			return frameHeader{}, fmt.Errorf("tcp: malformed abort frame (reason of %d bytes, tag %#x)", h.length, uint64(h.tag))
		}
	default:
		return frameHeader{}, fmt.Errorf("tcp: unknown frame kind %d", h.kind)
	}
	return h, nil
}

// stripeMin is the smallest message that is striped across streams: below
// it one write and one read beat several.
const stripeMin = 256 << 10

// stripeAlign keeps piece boundaries on page multiples, so the kernel copies
// whole pages into and out of the slots.
const stripeAlign = 4096

// pieceCount is how many streams carry a message of n bytes.
func pieceCount(n, streams int) int {
	if n < stripeMin || streams < 2 {
		return 1
	}
	return streams
}

// pieceRange is the part [lo, hi) of an n-byte message that stream j
// carries, when the message is cut into parts pieces. Every piece of a
// striped message is non-empty: n >= stripeMin >= parts * stripeAlign * 2.
func pieceRange(n, parts, j int) (lo, hi int) {
	if parts == 1 {
		if j == 0 {
			return 0, n
		}
		return 0, 0
	}
	cut := func(k int) int {
		if k >= parts {
			return n
		}
		return int(int64(n)*int64(k)/int64(parts)) &^ (stripeAlign - 1)
	}
	return cut(j), cut(j + 1)
}
