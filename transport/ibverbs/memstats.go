package ibverbs

import "github.com/gccl/gccl/transport"

// MemStats counts the regions registered with the device (one per
// connection set up: its slots and the peer's credits), and the rings of
// the TCP fallback's peers. Safe from any goroutine.
func (e *Endpoint) MemStats() transport.MemStats {
	s := transport.MemStats{Registered: e.registered.Load()}
	if e.fallback != nil {
		s = s.Add(e.fallback.MemStats())
	}
	return s
}
