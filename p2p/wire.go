package p2p

import (
	"encoding/binary"
	"fmt"

	"github.com/gccl/gccl/internal/verbs"
)

// Wire format of the connection between two agents. Every message is a
// 40-byte header, then length payload bytes for the ops that carry data.
// Integers are little endian.
//
//	offset size field
//	0      2    magic 0x5032 ("2P")
//	2      1    op
//	3      1    flags (ackError on ack and readResp: the payload is an error text)
//	4      4    region: the target's region ID (write, readReq)
//	8      8    request: the initiator's request ID
//	16     8    aux: segment index (readReq, readResp), part flags (commit),
//	            handshake ID (rdmaConnect, rdmaAccept), fence ID (ping, pong),
//	            parts done (abort)
//	24     8    offset: address or file offset in the region's space
//	32     8    length: payload bytes, or bytes asked for (readReq)
const (
	wireMagic     = 0x5032
	wireHeaderLen = 40
	// maxCtrlPayload bounds the payloads staged in memory (hello, notif,
	// errors), so that a peer cannot make the receiver allocate much.
	maxCtrlPayload = 1 << 20
	// maxNotifLen bounds one notification (Part.Notif, RequestOptions.Notif).
	maxNotifLen = maxCtrlPayload
	// maxRDMAConnectLen and maxRDMAAcceptLen bound the QP endpoint lists of
	// the RDMA handshake: maxRDMAQPs endpoints after their 8- and 16-byte
	// preambles (an rdmaAccept with flagError carries an error text instead).
	maxRDMAConnectLen = 8 + maxRDMAQPs*verbs.EndpointSize
	maxRDMAAcceptLen  = 16 + maxRDMAQPs*verbs.EndpointSize
)

type op uint8

const (
	opHello      op = 1 // payload: token the receiver published, then the sender's metadata
	opWrite      op = 2 // payload: data for [offset, offset+length) of region
	opReadReq    op = 3 // ask for [offset, offset+length) of region
	opReadResp   op = 4 // payload: data of segment aux of request
	opCommit     op = 5 // end of a request's writes; payload: notification (may be empty)
	opAck        op = 6 // the request's writes are applied (or flags&ackError: refused, payload says why)
	opNotif      op = 7 // payload: a notification (after data that went through shared memory)
	opPing       op = 8
	opPong       op = 9
	opInvalidate op = 10 // the sender deregistered region
	opBye        op = 11 // orderly close
	// RDMA: the sender's QP endpoints for its channel to the receiver,
	// which replaces its responder QPs with new ones connected to them and
	// answers with theirs (rdmaAccept: u16 QPs, 6 reserved, u64 the last
	// notification delivered, endpoints; flagError: the payload says why).
	// rdmaConnect's payload: u16 QPs, 6 reserved, 32-byte endpoints.
	opRDMAConnect op = 12
	opRDMAAccept  op = 13
	opAbort       op = 14 // a request of the sender to the receiver failed; payload: why (PeerFailure)
	// rdmaBarrier: deliver what follows on the connection only once the
	// RDMA notifications up to sequence number aux are delivered.
	opRDMABarrier op = 15
)

const (
	flagError  = 1 << 0 // ack/readResp: payload is an error text
	flagNotify = 1 << 1 // commit: payload is a notification to deliver
	flagAck    = 1 << 2 // commit: the initiator waits for an ack
)

type header struct {
	op     op
	flags  uint8
	region uint32
	req    uint64
	aux    uint64
	offset uint64
	length uint64
}

func putHeader(b []byte, h header) {
	_ = b[wireHeaderLen-1]
	binary.LittleEndian.PutUint16(b[0:], wireMagic)
	b[2], b[3] = byte(h.op), h.flags
	binary.LittleEndian.PutUint32(b[4:], h.region)
	binary.LittleEndian.PutUint64(b[8:], h.req)
	binary.LittleEndian.PutUint64(b[16:], h.aux)
	binary.LittleEndian.PutUint64(b[24:], h.offset)
	binary.LittleEndian.PutUint64(b[32:], h.length)
}

// parseHeader decodes a header off the wire. What a correct peer never sends
// is an error, after which the connection is out of sync and dropped.
// Region bounds are checked later, against the registered regions.
func parseHeader(b []byte) (header, error) {
	if len(b) < wireHeaderLen {
		return header{}, fmt.Errorf("p2p: wire header of %d bytes", len(b))
	}
	if m := binary.LittleEndian.Uint16(b); m != wireMagic {
		return header{}, fmt.Errorf("p2p: bad wire magic %#04x", m)
	}
	h := header{
		op: op(b[2]), flags: b[3],
		region: binary.LittleEndian.Uint32(b[4:]),
		req:    binary.LittleEndian.Uint64(b[8:]),
		aux:    binary.LittleEndian.Uint64(b[16:]),
		offset: binary.LittleEndian.Uint64(b[24:]),
		length: binary.LittleEndian.Uint64(b[32:]),
	}
	if h.offset+h.length < h.offset {
		return header{}, fmt.Errorf("p2p: %v of [%#x, +%d) wraps around", h.op, h.offset, h.length)
	}
	var allowed uint8
	switch h.op {
	case opWrite, opReadReq, opPing, opPong, opInvalidate, opBye, opRDMABarrier:
	case opReadResp, opAck, opRDMAAccept:
		allowed = flagError
	case opRDMAConnect, opAbort:
	case opCommit:
		allowed = flagNotify | flagAck
	case opHello, opNotif:
	default:
		return header{}, fmt.Errorf("p2p: unknown op %d", h.op)
	}
	if h.flags&^allowed != 0 {
		return header{}, fmt.Errorf("p2p: %v with flags %#x", h.op, h.flags)
	}
	switch h.op {
	case opHello, opNotif, opCommit, opAck, opRDMAConnect, opRDMAAccept, opAbort:
		if h.length > maxCtrlPayload {
			return header{}, fmt.Errorf("p2p: %v with a %d-byte payload (at most %d)", h.op, h.length, maxCtrlPayload)
		}
		if h.op == opAck && h.flags&flagError == 0 && h.length != 0 {
			return header{}, fmt.Errorf("p2p: ack with a %d-byte payload and no error", h.length)
		}
		if h.op == opRDMAConnect && h.length > maxRDMAConnectLen {
			return header{}, fmt.Errorf("p2p: rdmaConnect of %d bytes (at most %d QPs, %d bytes)", h.length, maxRDMAQPs, maxRDMAConnectLen)
		}
		if h.op == opRDMAAccept && h.flags&flagError == 0 && h.length > maxRDMAAcceptLen {
			return header{}, fmt.Errorf("p2p: rdmaAccept of %d bytes (at most %d QPs, %d bytes)", h.length, maxRDMAQPs, maxRDMAAcceptLen)
		}
	case opReadResp:
		if h.flags&flagError != 0 && h.length > maxCtrlPayload {
			return header{}, fmt.Errorf("p2p: error text of %d bytes", h.length)
		}
	case opPing, opPong, opInvalidate, opBye, opRDMABarrier:
		if h.length != 0 {
			return header{}, fmt.Errorf("p2p: %v with a payload", h.op)
		}
	}
	return h, nil
}

// payloadLen is how many bytes follow the header on the wire.
func (h header) payloadLen() uint64 {
	if h.op == opReadReq {
		return 0
	}
	return h.length
}

func (o op) String() string {
	names := [...]string{"?", "hello", "write", "readReq", "readResp", "commit", "ack", "notif", "ping", "pong", "invalidate", "bye",
		"rdmaConnect", "rdmaAccept", "abort", "rdmaBarrier"}
	if int(o) < len(names) {
		return names[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}
