package p2p

// MemStats is the memory an agent holds or maps, in bytes, by kind.
type MemStats struct {
	// Registered is heap memory registered with RegisterMem (the caller's,
	// which the agent keeps reachable), Shared the agent's own shared
	// memory from Alloc, and SharedMapped its peers' shared regions
	// mapped here (the shm backend).
	Registered, Shared, SharedMapped int64
	// Device is VRAM registered with RegisterVRAM.
	Device int64
	// Pinned is host memory the agent registered with the CUDA driver
	// (regions it copies VRAM to or from) and its pinned bounce buffers
	// (tcp and file transfers with a VRAM end).
	Pinned int64
	// RDMARegistered is what the agent's regions registered with its RDMA
	// device span (a subset of the kinds above).
	RDMARegistered int64
	// Regions counts the agent's live regions (FILE regions included,
	// whose bytes are none of the above).
	Regions int
}

// MemStats reports what the agent holds now. It is safe to call from any
// goroutine; after Close it reports zero.
func (a *Agent) MemStats() MemStats {
	var m MemStats
	a.mu.RLock()
	if a.closed {
		a.mu.RUnlock()
		return m
	}
	for _, r := range a.regions {
		m.Regions++
		switch {
		case r.seg != nil:
			m.Shared += int64(r.seg.Len())
		case r.info.Type == DRAM:
			m.Registered += int64(r.info.Len)
		case r.info.Type == VRAM:
			m.Device += int64(r.info.Len)
		}
		if r.rd != nil {
			m.RDMARegistered += int64(r.info.Len)
		}
	}
	remotes := make([]*remoteAgent, 0, len(a.remotes))
	for _, ra := range a.remotes {
		remotes = append(remotes, ra)
	}
	a.mu.RUnlock()
	for _, ra := range remotes {
		ra.mu.Lock()
		for _, seg := range ra.maps {
			m.SharedMapped += int64(seg.Len())
		}
		ra.mu.Unlock()
	}
	m.Pinned = a.gpu.pinnedBytes()
	return m
}

// pinnedBytes is the host memory registered with the driver and the
// slots' bounce buffers.
func (g *gpuState) pinnedBytes() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	var n int64
	for _, p := range g.pins {
		if p.ok {
			n += int64(len(p.b))
		}
	}
	for _, s := range g.slots {
		for _, raw := range s.raw {
			n += int64(len(raw))
		}
	}
	return n
}
