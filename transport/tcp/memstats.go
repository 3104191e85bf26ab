package tcp

import (
	"unsafe"

	"github.com/gccl/gccl/transport"
)

// MemStats counts the staging rings of the connections: per peer, the
// slots sent from and received into (made at a connection's first message
// that needs them), with their lengths and headers.
func (e *Endpoint) MemStats() transport.MemStats {
	var n int64
	for _, p := range e.allPeers() {
		if t := p.tx; t != nil {
			n += t.held.Load() + int64(len(t.hdrs)+len(t.lens)*int(unsafe.Sizeof(0)))
		}
		if r := p.rx; r != nil {
			n += r.held.Load() + int64(len(r.stage)+(len(r.lens)+len(r.left))*int(unsafe.Sizeof(0))+
				len(r.tags)*int(unsafe.Sizeof(transport.Tag(0))))
		}
	}
	return transport.MemStats{Heap: n}
}
