package p2p

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gccl/gccl/internal/verbs"
)

// fakeMR is a registered MR of the cache's tests.
type fakeMR struct {
	key    uint32
	closed *int
}

func (m fakeMR) LKey() uint32 { return m.key }
func (m fakeMR) RKey() uint32 { return m.key + 1 }
func (m fakeMR) Close() error { *m.closed++; return nil }

// The registration cache's logic without a device: ranges as MRs of at
// most the chunk size, keys covering the range, idle reuse, invalidation of
// published keys, LRU eviction, failures.
func TestRegCache(t *testing.T) {
	var made, closed int
	var fail error
	c := newRegCache(slog.New(slog.DiscardHandler), 1<<20, 4<<20, func(k regKey, addr, n uint64) (mrHandle, string, error) {
		if fail != nil {
			return nil, "", fail
		}
		made++
		return fakeMR{key: uint32(made) << 8, closed: &closed}, "host memory", nil
	})
	e, err := c.acquire(regKey{typ: DRAM, base: 0x10000, len: 2<<20 + 5})
	require.NoError(t, err)
	require.Len(t, e.mrs, 3)
	require.Equal(t, []rkeyRange{{0, 1 << 20, 0x101}, {1 << 20, 1 << 20, 0x201}, {2 << 20, 5, 0x301}}, e.keys)
	lk, room := e.lkey(1<<20 + 7)
	require.Equal(t, uint32(0x200), lk)
	require.Equal(t, uint64(1<<20-7), room)
	c.release(e) // unpublished: idle
	require.Equal(t, 0, closed)
	again, err := c.acquire(regKey{typ: DRAM, base: 0x10000, len: 2<<20 + 5})
	require.NoError(t, err)
	require.Same(t, e, again)
	require.Equal(t, 3, made, "an idle range is taken over without registering")
	c.expose(again)
	c.release(again) // published: deregistered now
	require.Equal(t, 3, closed)
	st := c.stats()
	require.Equal(t, RegCacheStats{Hits: 1, Misses: 1, Invalidations: 1, Limit: 4 << 20}, st)

	// Idle ranges beyond 4 MiB go, oldest first.
	var es []*regEntry
	for i := range 6 {
		e, err := c.acquire(regKey{typ: DRAM, base: uint64(i+1) << 30, len: 1 << 20})
		require.NoError(t, err)
		es = append(es, e)
	}
	require.Equal(t, uint64(6<<20), c.stats().Bytes, "ranges in use are never evicted")
	for _, e := range es {
		c.release(e)
	}
	st = c.stats()
	require.Equal(t, uint64(2), st.Evictions)
	require.Equal(t, 4, st.Idle)
	require.Equal(t, uint64(4<<20), st.Bytes)
	// The oldest went: the first range registers again.
	_, err = c.acquire(regKey{typ: DRAM, base: 1 << 30, len: 1 << 20})
	require.NoError(t, err)
	require.Equal(t, uint64(1+6+1), c.stats().Misses)

	// A refused registration undoes the MRs it made.
	fail = errors.New("no")
	before := closed
	_, err = c.acquire(regKey{typ: VRAM, base: 1 << 40, len: 1 << 20})
	require.Error(t, err)
	require.Equal(t, before, closed)
	require.Equal(t, uint64(1), c.stats().Failures)
	c.close()
	require.Equal(t, 0, c.stats().Idle)
}

// Metadata version 3 carries the RDMA port and each region's keys, and
// refuses keys that do not cover their region in order.
func TestMetadataRDMA(t *testing.T) {
	m := &agentInfo{Name: "a", Host: "h", Gen: 3,
		RDMA:    &rdmaInfo{Device: "mlx5_0", Port: 1, LinkLayer: verbs.LinkEthernet, MTU: verbs.MTU4096, LID: 0, GID: verbs.GID{15: 1}},
		Regions: []regionInfo{{ID: 1, Type: DRAM, Base: 4096, Len: 3 << 20}, {ID: 2, Type: FILE, Base: 0, Len: 10}, {ID: 3, Type: DRAM, Base: 1 << 30, Len: 10}},
		Keys:    map[uint32][]rkeyRange{1: {{0, 1 << 20, 7}, {1 << 20, 2 << 20, 8}}},
	}
	got, err := decodeMetadata(encodeMetadata(m))
	require.NoError(t, err)
	require.Equal(t, m.RDMA, got.RDMA)
	require.Equal(t, m.Keys, got.Keys)
	require.Equal(t, m.Regions, got.Regions)
	for _, bad := range [][]rkeyRange{
		{{0, 1 << 20, 7}},                        // short of the region
		{{4096, 3<<20 - 4096, 7}},                // not from 0
		{{0, 2 << 20, 7}, {1 << 20, 2 << 20, 8}}, // overlapping
		{{0, 4 << 20, 7}},                        // past the end
	} {
		m.Keys[1] = bad
		_, err := decodeMetadata(encodeMetadata(m))
		require.ErrorIs(t, err, ErrBadMetadata, "%v", bad)
	}
	m.Keys = nil
	m.RDMA = &rdmaInfo{Device: "x", Port: 1, LinkLayer: 9, MTU: verbs.MTU1024}
	_, err = decodeMetadata(encodeMetadata(m))
	require.ErrorIs(t, err, ErrBadMetadata)
}

// sameFabric: the link layer, the InfiniBand subnet, the RoCE GID family.
func TestSameFabric(t *testing.T) {
	ib := func(prefix byte) *rdmaInfo {
		return &rdmaInfo{LinkLayer: verbs.LinkInfiniBand, GID: verbs.GID{0: 0xfe, 1: 0x80, 7: prefix, 15: 1}}
	}
	roce4 := &rdmaInfo{LinkLayer: verbs.LinkEthernet, GID: verbs.GID{10: 0xff, 11: 0xff, 12: 10, 15: 1}}
	roce6 := &rdmaInfo{LinkLayer: verbs.LinkEthernet, GID: verbs.GID{0: 0x20, 15: 1}}
	for _, c := range []struct {
		a, b *rdmaInfo
		ok   bool
	}{
		{ib(0), ib(0), true}, {ib(0), ib(1), false}, {ib(0), roce4, false}, {roce4, roce4, true}, {roce4, roce6, false}, {nil, ib(0), false},
	} {
		ok, why := sameFabric(c.a, c.b)
		require.Equal(t, c.ok, ok, why)
		require.Equal(t, ok, why == "")
	}
}
