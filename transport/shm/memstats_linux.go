package shm

import "github.com/gccl/gccl/transport"

// MemStats counts the shared memory mapped for the rings: this rank's
// mailbox (the rings from its local peers) and each local peer's (the
// rings this rank writes into), as mapped; segments that Close or Abort
// released no longer count.
func (e *Endpoint) MemStats() transport.MemStats {
	var n int64
	if s := e.mb.seg; s != nil && !s.dropped.Load() {
		n += int64(s.size)
	}
	for _, l := range e.linkList {
		if s := l.seg; s != nil && !s.dropped.Load() {
			n += int64(s.size)
		}
	}
	return transport.MemStats{Shared: n}
}
