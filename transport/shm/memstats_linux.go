package shm

import "github.com/gccl/gccl/transport"

// MemStats counts the shared memory this rank's endpoint holds in
// /dev/shm: its mailbox, whose rings carry its messages to the peers it
// sent to (the blocks the file occupies). The rings it reads are its
// peers' and count there, so summing over a host's ranks counts each byte
// once. A closed endpoint holds nothing.
func (e *Endpoint) MemStats() transport.MemStats {
	e.closeMu.Lock()
	defer e.closeMu.Unlock()
	if e.closed.Load() || e.mb.seg.dropped.Load() {
		return transport.MemStats{}
	}
	return transport.MemStats{Shared: e.mb.Bytes()}
}
