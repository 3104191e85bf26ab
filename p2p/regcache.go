package p2p

import (
	"container/list"
	"fmt"
	"log/slog"
	"sync"
)

// The registration cache: the memory regions (MRs) an agent registered
// with its RDMA device, by range. A region's memory is registered when the
// region is (RegisterMem, Alloc, RegisterVRAM); ranges longer than
// Config.RDMAMaxMRSize become several MRs, each at most that long (a single
// MR over 4 GiB ran at 55% of line rate on a ConnectX NIC in a public
// report). Registering a range a region already holds is the region
// cache's hit and makes no MR at all. When a region goes, its MRs go with
// it at once if their keys ever left this agent (a peer may hold them: a
// stale key must stop working, so that a late RDMA operation cannot land in
// memory the owner let go); otherwise they stay here, idle, and a later
// registration of the same range takes them over without a system call.
// Idle entries are evicted, least recently used first, to keep the
// registered bytes under Config.RDMARegCacheBytes; entries in use are never
// evicted (the bound may then be exceeded, logged once).

// mrHandle is a registered MR (verbs.MR; a fake in the cache's tests).
type mrHandle interface {
	LKey() uint32
	RKey() uint32
	Close() error
}

// rkeyRange is one MR of a region as peers see it: [Off, Off+Len) of the
// region, reached with RKey (metadata version 3).
type rkeyRange struct {
	Off, Len uint64
	RKey     uint32
}

// regKey is a registered range: host memory (DRAM) or device memory of a
// device (VRAM).
type regKey struct {
	typ       MemType
	dev       int
	base, len uint64
}

// regEntry is one registered range, as MRs of at most the chunk size.
type regEntry struct {
	key     regKey
	mrs     []mrHandle
	lkeys   []uint32
	keys    []rkeyRange
	chunk   uint64
	how     string // "host memory", "dma-buf", "peer memory"
	refs    int
	exposed bool
	idle    *list.Element // in the LRU while refs == 0
}

// lkey is the local key of the byte off bytes into the range, and how many
// bytes from there lie in the same MR.
func (e *regEntry) lkey(off uint64) (uint32, uint64) {
	i := off / e.chunk
	return e.lkeys[i], min(e.key.len, (i+1)*e.chunk) - off
}

// RegCacheStats are the registration cache's counters (Agent.Stats).
type RegCacheStats struct {
	Hits          uint64 // registrations served without registering (region or idle MR reused)
	Misses        uint64 // ranges registered with the device
	Evictions     uint64 // idle ranges deregistered to keep under the bound
	Invalidations uint64 // ranges deregistered with their region because peers had their keys
	Failures      uint64 // registrations the device refused
	Entries       int    // ranges registered now
	Idle          int    // of which idle (their region gone, keys never published)
	MRs           int    // MRs registered now
	Bytes         uint64 // bytes registered now
	Limit         uint64 // Config.RDMARegCacheBytes
}

// regCache is the agent's registered ranges. It is safe for concurrent
// use; registration (a system call that pins the memory) runs outside its
// lock.
type regCache struct {
	log   *slog.Logger
	chunk uint64
	limit uint64
	// register makes one MR of n bytes at addr (the key's address space) of
	// the range key; how names the way (for the log).
	register func(key regKey, addr, n uint64) (mrHandle, string, error)

	mu     sync.Mutex
	idle   *list.List // of *regEntry, most recently used at the front
	st     RegCacheStats
	warned bool
}

func newRegCache(log *slog.Logger, chunk, limit uint64, register func(regKey, uint64, uint64) (mrHandle, string, error)) *regCache {
	return &regCache{log: log, chunk: chunk, limit: limit, register: register, idle: list.New(), st: RegCacheStats{Limit: limit}}
}

// acquire returns a registration of key's range: an idle entry that holds
// it (a hit), or a new one.
func (c *regCache) acquire(key regKey) (*regEntry, error) {
	c.mu.Lock()
	for el := c.idle.Front(); el != nil; el = el.Next() {
		e := el.Value.(*regEntry)
		if e.key.typ == key.typ && e.key.dev == key.dev && e.key.base == key.base && e.key.len == key.len {
			c.idle.Remove(el)
			e.idle, e.refs = nil, 1
			c.st.Hits++
			c.st.Idle--
			c.mu.Unlock()
			return e, nil
		}
	}
	c.mu.Unlock()
	e := &regEntry{key: key, chunk: c.chunk, refs: 1}
	for off := uint64(0); off < key.len; off += c.chunk {
		n := min(c.chunk, key.len-off)
		mr, how, err := c.register(key, key.base+off, n)
		if err != nil {
			for _, m := range e.mrs {
				m.Close()
			}
			c.mu.Lock()
			c.st.Failures++
			c.mu.Unlock()
			return nil, err
		}
		e.how = how
		e.mrs = append(e.mrs, mr)
		e.lkeys = append(e.lkeys, mr.LKey())
		e.keys = append(e.keys, rkeyRange{Off: off, Len: n, RKey: mr.RKey()})
	}
	c.mu.Lock()
	c.st.Misses++
	c.st.Entries++
	c.st.MRs += len(e.mrs)
	c.st.Bytes += key.len
	evict := c.trimLocked()
	over := c.st.Bytes > c.limit && !c.warned
	if over {
		c.warned = true
	}
	st := c.st
	c.mu.Unlock()
	c.closeAll(evict)
	c.log.Debug("p2p registered memory with the RDMA device", "type", key.typ, "bytes", key.len, "mrs", len(e.mrs), "how", e.how,
		"cache_bytes", st.Bytes, "hits", st.Hits, "misses", st.Misses, "evictions", st.Evictions)
	if over {
		c.log.Warn("p2p registration cache over its bound: the registered regions are in use and cannot be evicted",
			"bytes", st.Bytes, "limit", c.limit)
	}
	return e, nil
}

// trimLocked takes the least recently used idle entries out until the
// registered bytes fit the bound, and returns them for closing.
func (c *regCache) trimLocked() []*regEntry {
	var out []*regEntry
	for c.st.Bytes > c.limit {
		el := c.idle.Back()
		if el == nil {
			break
		}
		e := el.Value.(*regEntry)
		c.idle.Remove(el)
		e.idle = nil
		c.dropLocked(e)
		c.st.Evictions++
		c.st.Idle--
		out = append(out, e)
	}
	return out
}

func (c *regCache) dropLocked(e *regEntry) {
	c.st.Entries--
	c.st.MRs -= len(e.mrs)
	c.st.Bytes -= e.key.len
}

func (c *regCache) closeAll(es []*regEntry) {
	for _, e := range es {
		for _, m := range e.mrs {
			if err := m.Close(); err != nil {
				c.log.Warn("p2p cannot deregister an MR", "err", err)
			}
		}
		c.log.Debug("p2p deregistered memory from the RDMA device", "type", e.key.typ, "bytes", e.key.len)
	}
}

// release drops a region's use of e. Keys that left this agent die with
// the region; the others stay cached, idle.
func (c *regCache) release(e *regEntry) {
	c.mu.Lock()
	e.refs--
	if e.refs > 0 {
		c.mu.Unlock()
		return
	}
	if e.exposed {
		c.dropLocked(e)
		c.st.Invalidations++
		c.mu.Unlock()
		c.closeAll([]*regEntry{e})
		return
	}
	e.idle = c.idle.PushFront(e)
	c.st.Idle++
	evict := c.trimLocked()
	c.mu.Unlock()
	c.closeAll(evict)
}

// expose marks e's keys as published: from now on the region's end
// deregisters them.
func (c *regCache) expose(e *regEntry) {
	c.mu.Lock()
	e.exposed = true
	c.mu.Unlock()
}

// hit counts a registration the region cache served.
func (c *regCache) hit() {
	c.mu.Lock()
	c.st.Hits++
	c.mu.Unlock()
}

func (c *regCache) stats() RegCacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st
}

// close deregisters the idle entries (regions deregister their own first).
func (c *regCache) close() {
	c.mu.Lock()
	var es []*regEntry
	for el := c.idle.Front(); el != nil; el = el.Next() {
		e := el.Value.(*regEntry)
		c.dropLocked(e)
		es = append(es, e)
	}
	c.idle.Init()
	c.st.Idle = 0
	st := c.st
	c.mu.Unlock()
	c.closeAll(es)
	c.log.Info("p2p registration cache", "hits", st.Hits, "misses", st.Misses, "evictions", st.Evictions,
		"invalidations", st.Invalidations, "failures", st.Failures, "left_bytes", st.Bytes)
}

func (e *regEntry) String() string {
	return fmt.Sprintf("%v [%#x, +%d) as %d MRs (%s)", e.key.typ, e.key.base, e.key.len, len(e.mrs), e.how)
}
