package comm

import "github.com/gccl/gccl/transport"

// MemStats is the memory a Comm holds, in bytes, by kind. Device memory is
// not among them: the device collectives work in the callers' buffers, and
// the device engine's own memory is its (gpu).
type MemStats struct {
	// The transports' slot rings, by where they live: process memory
	// (in-process and socket rings), shared memory this rank holds in
	// /dev/shm (its shm mailbox: the rings it sends on, made at its first
	// message to each peer), and memory
	// registered with an RDMA device (ibverbs). In-process rings are
	// counted at their receiver, as they are made (on first use).
	RingHeap, RingShared, RingRegistered int64
	// Symmetric is this rank's symmetric memory (Alloc) still allocated;
	// SymmetricMapped its peers' symmetric memory mapped into this
	// process (for InitLocal's ranks, which share the heap, the same
	// memory as their own Symmetric: do not add the two up across ranks
	// of one process).
	Symmetric, SymmetricMapped int64
	// Staging is the executor's chunk staging, two slots (heap).
	Staging int64
}

// Total is what this rank holds: every kind but SymmetricMapped, which
// is its peers'.
func (m MemStats) Total() int64 {
	return m.RingHeap + m.RingShared + m.RingRegistered + m.Symmetric + m.Staging
}

// MemStats reports the memory the Comm holds now. It is safe to call from
// any goroutine while the Comm is open; after Close it reports zero.
func (c *Comm) MemStats() MemStats {
	if c.released.Load() {
		return MemStats{}
	}
	rings := transport.MemOf(c.ep)
	m := MemStats{RingHeap: rings.Heap, RingShared: rings.Shared, RingRegistered: rings.Registered,
		Staging: int64(len(c.tmp))}
	c.symMu.Lock()
	if t := c.syms.Load(); t != nil {
		for _, r := range *t {
			m.Symmetric += int64(len(r.mine))
			for p, b := range r.peers {
				if p != c.rank {
					m.SymmetricMapped += int64(len(b))
				}
			}
		}
	}
	c.symMu.Unlock()
	return m
}
