package inproc

import (
	"unsafe"

	"github.com/gccl/gccl/transport"
)

// MemStats counts the rings into this rank (a ring is its receiver's, as a
// shared-memory mailbox is), made so far: rings are made on first use.
func (e *Endpoint) MemStats() transport.MemStats {
	w := e.w
	w.mu.Lock()
	defer w.mu.Unlock()
	var n int64
	for key, r := range w.rings {
		if key[1] == e.rank {
			n += int64(len(r.data) + len(r.lens)*int(unsafe.Sizeof(r.lens[0])) + len(r.tags)*int(unsafe.Sizeof(r.tags[0])))
		}
	}
	return transport.MemStats{Heap: n}
}
