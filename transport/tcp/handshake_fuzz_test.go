package tcp

import (
	"bytes"
	"testing"
)

// FuzzParseHello: a dialer's hello, from whatever connected, is parsed
// without panicking, and what parses marshals back to the same bytes.
func FuzzParseHello(f *testing.F) {
	f.Add((&hello{rank: 1, size: 4, stream: 2, streams: 4, slotSize: 1 << 20}).marshal())
	f.Add([]byte(handshakeMagic))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHello(b)
		if err != nil {
			return
		}
		if got := h.marshal(); !bytes.Equal(got, b) {
			t.Fatalf("hello %x parsed as %+v, marshals as %x", b, h, got)
		}
	})
}
