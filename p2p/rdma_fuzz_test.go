package p2p

import (
	"encoding/binary"
	"testing"

	"github.com/gccl/gccl/internal/verbs"
)

// FuzzParseRDMAAccept: a peer's answer to an RDMA connect is parsed
// without panicking, and yields exactly the QPs asked for.
func FuzzParseRDMAAccept(f *testing.F) {
	ok := make([]byte, 16+2*verbs.EndpointSize)
	binary.LittleEndian.PutUint16(ok, 2)
	f.Add(ok, uint8(2))
	f.Add(ok[:16], uint8(0))
	f.Fuzz(func(t *testing.T, b []byte, n uint8) {
		eps, _, err := parseRDMAAccept(b, int(n))
		if err == nil && len(eps) != int(n) {
			t.Fatalf("%d endpoints for %d QPs", len(eps), n)
		}
	})
}
