package transport

// MemStats is the memory an endpoint holds for its slot rings, by kind.
type MemStats struct {
	// Heap is process memory: in-process rings, socket staging rings.
	Heap int64
	// Shared is shared memory the endpoint holds in /dev/shm: for shm, its
	// own mailbox (the rings it sends on); the rings it reads count at
	// their owners, so a host's ranks sum to what /dev/shm holds.
	Shared int64
	// Registered is memory registered with an RDMA device (ibverbs).
	Registered int64
}

// Total is every kind together.
func (m MemStats) Total() int64 { return m.Heap + m.Shared + m.Registered }

// Add returns m plus o.
func (m MemStats) Add(o MemStats) MemStats {
	return MemStats{Heap: m.Heap + o.Heap, Shared: m.Shared + o.Shared, Registered: m.Registered + o.Registered}
}

// MemOf is what ep holds, as it says through an optional MemStats method
// (the transports of this module have one; an endpoint without counts
// zero). It is safe to call from any goroutine, while ep is in use.
func MemOf(ep Endpoint) MemStats {
	if r, ok := ep.(interface{ MemStats() MemStats }); ok {
		return r.MemStats()
	}
	return MemStats{}
}

// MemStats sums the Mux's transports.
func (m *Mux) MemStats() MemStats {
	var s MemStats
	for _, ep := range m.subs {
		s = s.Add(MemOf(ep))
	}
	return s
}
