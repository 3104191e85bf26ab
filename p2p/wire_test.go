package p2p

import (
	"bytes"
	"testing"
)

func frame(h header, payload []byte) []byte {
	var b [wireHeaderLen]byte
	if payload != nil {
		h.length = uint64(len(payload))
	}
	putHeader(b[:], h)
	return append(b[:], payload...)
}

func TestWireHeader(t *testing.T) {
	h := header{op: opWrite, region: 3, req: 99, aux: 5, offset: 4096, length: 1 << 20}
	var b [wireHeaderLen]byte
	putHeader(b[:], h)
	got, err := parseHeader(b[:])
	if err != nil || got != h {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	bad := []header{
		{op: 0},
		{op: 99},
		{op: opWrite, offset: ^uint64(0), length: 2},
		{op: opNotif, length: maxCtrlPayload + 1},
		{op: opPing, length: 1},
		{op: opWrite, flags: flagError},
		{op: opCommit, flags: flagError},
	}
	for _, h := range bad {
		putHeader(b[:], h)
		if _, err := parseHeader(b[:]); err == nil {
			t.Errorf("accepted %+v", h)
		}
	}
	putHeader(b[:], h)
	b[0] = 0
	if _, err := parseHeader(b[:]); err == nil {
		t.Error("accepted a bad magic")
	}
	if _, err := parseHeader(b[:10]); err == nil {
		t.Error("accepted a short header")
	}
}

func FuzzWireHeader(f *testing.F) {
	for _, h := range []header{{op: opWrite, length: 10}, {op: opCommit, flags: flagAck | flagNotify, length: 3}, {op: opReadResp, flags: flagError}} {
		var b [wireHeaderLen]byte
		putHeader(b[:], h)
		f.Add(b[:])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHeader(b)
		if err != nil {
			return
		}
		var out [wireHeaderLen]byte
		putHeader(out[:], h)
		if !bytes.Equal(out[:], b[:wireHeaderLen]) {
			t.Fatal("accepted header does not re-encode identically")
		}
		if h.offset+h.length < h.offset {
			t.Fatal("accepted a wrapping range")
		}
		if (h.op == opHello || h.op == opNotif || h.op == opAck || h.op == opCommit) && h.length > maxCtrlPayload {
			t.Fatal("accepted an oversized control payload")
		}
	})
}

// TestWireAckPayload: an ack carries a payload only as an error text; the
// progress engine reads none otherwise, so the header must be refused
// rather than leave the stream out of step.
func TestWireAckPayload(t *testing.T) {
	var b [wireHeaderLen]byte
	putHeader(b[:], header{op: opAck, req: 1, length: 5})
	if _, err := parseHeader(b[:]); err == nil {
		t.Fatal("accepted an ack with a payload but no error flag")
	}
	putHeader(b[:], header{op: opAck, req: 1, flags: flagError, length: 5})
	if _, err := parseHeader(b[:]); err != nil {
		t.Fatal(err)
	}
}
