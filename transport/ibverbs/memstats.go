package ibverbs

import "github.com/gccl/gccl/transport"

// MemStats counts the regions registered with the device (one per
// connection: its slots and the peer's credits), and the rings of the TCP
// fallback's peers.
func (e *Endpoint) MemStats() transport.MemStats {
	var s transport.MemStats
	for _, c := range e.list {
		s.Registered += int64(len(c.buf))
	}
	if e.fallback != nil {
		s = s.Add(e.fallback.MemStats())
	}
	return s
}
