//go:build linux && cgo

package p2p

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gccl/gccl/internal/testutil"
	"github.com/gccl/gccl/internal/verbs"
	"github.com/gccl/gccl/internal/verbs/verbstest"
)

// The rdma backend's tests run on a real device (tests/rxe/run.sh runs
// them in a Soft-RoCE VM, where GCCL_TEST_REQUIRE_RDMA=1 makes a missing
// device a failure) and, everywhere, on the fake libibverbs
// (internal/verbs/testdata/fakeibv.c) in a child process of the test binary
// (TestRDMAOnFakeVerbs): a process loads one verbs library. Agents of one
// process reach each other through the device with Config.RDMASameHost
// and shared memory and process_vm off.

// TestRDMAOnFakeVerbs runs the TestRDMA tests against the fake libibverbs.
func TestRDMAOnFakeVerbs(t *testing.T) {
	if verbstest.InChild() {
		t.Skip("this is the child")
	}
	if os.Getenv("GCCL_TEST_REQUIRE_RDMA") == "1" {
		// tests/rxe/run.sh ran the fake on the host first.
		t.Skip("the real device runs the tests here (GCCL_TEST_REQUIRE_RDMA=1)")
	}
	// The fake's device, not one that sysfs lists on a machine with RDMA.
	verbstest.RunChild(t, "^TestRDMA", "GCCL_IB_HCA=fakeibv0")
}

// rdmaCfg is an agent configuration that takes the rdma backend between
// agents of this host.
func rdmaCfg(c Config) Config {
	c.DisableSHM, c.DisablePVM, c.RDMASameHost = true, true, true
	return c
}

// rdmaAgent makes an agent and skips the test without a device (fails it
// where one is required: the fake's child, or GCCL_TEST_REQUIRE_RDMA=1).
func rdmaAgent(t *testing.T, name string, cfg Config) *Agent {
	t.Helper()
	a := newAgent(t, name, rdmaCfg(cfg))
	if a.rdma == nil {
		if verbstest.InChild() || os.Getenv("GCCL_TEST_REQUIRE_RDMA") == "1" {
			t.Fatalf("no RDMA device: %v", a.rdmaErr)
		}
		testutil.SkipIfNotSupported(t, a.rdmaErr)
		t.Fatal(a.rdmaErr)
	}
	return a
}

// rdmaPair makes two agents that know each other, a the initiator.
func rdmaPair(t *testing.T, cfg Config) (*Agent, *Agent) {
	t.Helper()
	a := rdmaAgent(t, "a", cfg)
	b := rdmaAgent(t, "b", cfg)
	_, err := a.LoadRemote(ctxT(t), b.LocalMetadata())
	require.NoError(t, err)
	return a, b
}

// fakeOnly skips a test of a fake device's knob on a real one.
func fakeOnly(t *testing.T) {
	if !verbstest.InChild() {
		t.Skip("needs the fake libibverbs' knobs (TestRDMAOnFakeVerbs)")
	}
}

// pending are notifications received but not yet taken by waitNotif, per
// agent.
var pending = map[*Agent][][]byte{}

// waitNotif waits for the next notification from peer (the tests have one
// peer each).
func waitNotif(t *testing.T, a *Agent, peer string) []byte {
	t.Helper()
	for len(pending[a]) == 0 {
		n, f, err := a.WaitEvents(ctxT(t))
		require.NoError(t, err)
		require.Empty(t, f)
		pending[a] = append(pending[a], n[peer]...)
	}
	m := pending[a][0]
	pending[a] = pending[a][1:]
	return m
}

// WRITE and READ in parts, each part checked when its notification
// arrives, over several QPs (a striped transfer) with descriptors that
// merge into scatter/gather lists, and regions of several MRs each.
func TestRDMAWriteReadParts(t *testing.T) {
	a, b := rdmaPair(t, Config{RDMAMaxMRSize: 3 << 20})
	const size = 8 << 20
	dst := make([]byte, size)
	rb, err := b.RegisterMem(dst)
	require.NoError(t, err)
	require.Len(t, rb.rd.mrs, 3, "8 MiB in MRs of at most 3 MiB")
	_, err = a.LoadRemote(ctxT(t), b.LocalMetadata())
	require.NoError(t, err)
	src := make([]byte, size)
	fill(src, 3)
	ra, err := a.RegisterMem(src)
	require.NoError(t, err)
	// 4 parts of 2 MiB, each 64 descriptors of 32 KiB, every other one
	// skipped locally (so pieces are contiguous only on the target).
	const blk = 32 << 10
	var local, remote []Desc
	var parts []Part
	for p := range 4 {
		for i := range 64 {
			off := uint64(p*(2<<20) + i*blk)
			local = append(local, ra.Desc(off/2*2, blk))
			remote = append(remote, rb.Desc(off, blk))
		}
		parts = append(parts, Part{End: len(local), Notif: []byte{'p', byte('0' + p)}})
	}
	for i := range local {
		local[i] = ra.Desc(uint64(i%2)*(size/2)+uint64(i/2)*blk, blk)
	}
	req, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: local}, "b", DescList{Type: DRAM, Descs: remote}, &RequestOptions{Parts: parts})
	require.NoError(t, err)
	require.Equal(t, BackendRDMA, req.Backend(), req.BackendReason())
	require.Contains(t, req.BackendReason(), "RDMA")
	_, err = req.Post()
	require.NoError(t, err)
	for p := range 4 {
		require.Equal(t, []byte{'p', byte('0' + p)}, waitNotif(t, b, "a"))
		for i := range 64 {
			k := p*64 + i
			want := src[local[k].Addr-ra.Addr() : local[k].Addr-ra.Addr()+blk]
			require.True(t, bytes.Equal(want, dst[remote[k].Addr-rb.Addr():][:blk]), "part %d block %d differs when notified", p, i)
		}
	}
	require.NoError(t, req.Wait(ctxT(t)))
	require.Equal(t, 4, req.PartsDone())
	require.Greater(t, len(req.rd.wrs[1]), 0, "a 8 MiB request is striped")
	require.NoError(t, req.Release())

	// READ it back into another buffer, in one part.
	back := make([]byte, size)
	rback, err := a.RegisterMem(back)
	require.NoError(t, err)
	rd, err := a.CreateRequest(Read, DescList{Type: DRAM, Descs: []Desc{rback.Desc(0, size)}}, "b", DescList{Type: DRAM, Descs: []Desc{rb.Desc(0, size)}},
		&RequestOptions{Notif: []byte("read")})
	require.NoError(t, err)
	_, err = rd.Post()
	require.NoError(t, err)
	require.NoError(t, rd.Wait(ctxT(t)))
	require.Equal(t, dst, back)
	require.Equal(t, []byte("read"), waitNotif(t, b, "a"))
	require.NoError(t, rd.Release())
	st := a.Stats().RegCache
	require.Equal(t, 2, st.Entries, "%+v", st)
}

// Notifications arrive in posting order and after their data, whatever
// mix of sizes (striped or not) and operations is in flight.
func TestRDMANotificationOrder(t *testing.T) {
	a, b := rdmaPair(t, Config{})
	const size = 4 << 20
	dst := make([]byte, size)
	rb, err := b.RegisterMem(dst)
	require.NoError(t, err)
	_, err = a.LoadRemote(ctxT(t), b.LocalMetadata())
	require.NoError(t, err)
	src := make([]byte, size)
	ra, err := a.RegisterMem(src)
	require.NoError(t, err)
	const n = 60
	reqs := make([]*Request, n)
	for i := range n {
		l := uint64(4096)
		if i%5 == 0 {
			l = 1 << 20 // striped
		}
		off := uint64(i%4) * (1 << 20)
		fill(src[off:off+l], byte(i))
		op := Write
		if i%7 == 3 {
			op = Read
		}
		reqs[i], err = a.CreateRequest(op, one(DRAM, ra.Desc(off, l)), "b", one(DRAM, rb.Desc(off, l)), &RequestOptions{Notif: []byte{byte(i)}})
		require.NoError(t, err)
		_, err = reqs[i].Post()
		require.NoError(t, err)
		if i%4 == 3 { // the next ones reuse the ranges
			for _, r := range reqs[i-3 : i+1] {
				require.NoError(t, r.Wait(ctxT(t)))
			}
		}
	}
	for i := range n {
		require.Equal(t, []byte{byte(i)}, waitNotif(t, b, "a"), "notification %d", i)
	}
	for _, r := range reqs {
		require.NoError(t, r.Wait(ctxT(t)))
		r.Release()
	}
}

// Registration: a cached range costs no MR; a region whose keys were
// published dies with its region (its key then fails at the NIC); idle
// ranges are evicted beyond the bound.
func TestRDMARegistrationCache(t *testing.T) {
	a := rdmaAgent(t, "a", Config{RDMARegCacheBytes: 3 << 20})
	before := verbs.Live().MRs
	buf := make([]byte, 1<<20)
	r, err := a.RegisterMem(buf)
	require.NoError(t, err)
	require.Equal(t, before+1, verbs.Live().MRs)
	r2, err := a.RegisterMem(buf[4096:8192]) // a sub-range: the region's hit
	require.NoError(t, err)
	require.Same(t, r, r2)
	require.NoError(t, a.DeregisterMem(r2))
	require.NoError(t, a.DeregisterMem(r)) // keys never published: cached, idle
	require.Equal(t, before+1, verbs.Live().MRs)
	st := a.Stats().RegCache
	require.Equal(t, RegCacheStats{Hits: 1, Misses: 1, Entries: 1, Idle: 1, MRs: 1, Bytes: 1 << 20, Limit: 3 << 20}, st)
	r, err = a.RegisterMem(buf) // the idle range again: no system call
	require.NoError(t, err)
	require.Equal(t, before+1, verbs.Live().MRs)
	require.Equal(t, uint64(2), a.Stats().RegCache.Hits)
	a.LocalMetadata() // its keys leave the agent
	require.NoError(t, a.DeregisterMem(r))
	require.Equal(t, before, verbs.Live().MRs, "a published key outlived its region")
	require.Equal(t, uint64(1), a.Stats().RegCache.Invalidations)
	// Idle ranges beyond 3 MiB are evicted, oldest first.
	bufs := make([][]byte, 5)
	for i := range bufs {
		bufs[i] = make([]byte, 1<<20)
		r, err := a.RegisterMem(bufs[i])
		require.NoError(t, err)
		require.NoError(t, a.DeregisterMem(r))
	}
	st = a.Stats().RegCache
	require.Equal(t, uint64(2), st.Evictions, "%+v", st)
	require.Equal(t, 3, st.Idle)
	require.LessOrEqual(t, st.Bytes, uint64(3<<20))
	require.Equal(t, before+3, verbs.Live().MRs)
}

// A stale key is refused by the target's device, not only by the
// initiator: with the initiator's check bypassed, a WRITE to a region the
// target deregistered fails with ErrOutOfBounds, and nothing lands.
func TestRDMAStaleKeyRefused(t *testing.T) {
	a, b := rdmaPair(t, Config{})
	dst := make([]byte, 1<<20)
	rb, err := b.RegisterMem(dst)
	require.NoError(t, err)
	_, err = a.LoadRemote(ctxT(t), b.LocalMetadata())
	require.NoError(t, err)
	src := make([]byte, 1<<20)
	fill(src, 9)
	ra, _ := a.RegisterMem(src)
	req, err := a.CreateRequest(Write, one(DRAM, ra.Desc(0, 1<<20)), "b", one(DRAM, rb.Desc(0, 1<<20)), nil)
	require.NoError(t, err)
	require.NoError(t, b.DeregisterMem(rb))
	remote, err := a.remote("b")
	require.NoError(t, err)
	waitFor(t, func() bool { _, dropped := remote.droppedAny(req.remote.rids); return dropped })
	_, err = req.Post()
	require.ErrorIs(t, err, ErrOutOfBounds, "the initiator refuses a deregistered region")
	remote.mu.Lock()
	clear(remote.dropped) // as if the invalidation had not arrived yet
	remote.mu.Unlock()
	_, err = req.Post()
	require.NoError(t, err)
	err = req.Wait(ctxT(t))
	require.ErrorIs(t, err, ErrOutOfBounds)
	require.Contains(t, err.Error(), "refused an RDMA access")
	require.Equal(t, make([]byte, 1<<20), dst, "a write landed through a stale key")
	require.NoError(t, req.Release())
	// The channel recovers for the next request.
	dst2 := make([]byte, 4096)
	rb2, _ := b.RegisterMem(dst2)
	_, err = a.LoadRemote(ctxT(t), b.LocalMetadata())
	require.NoError(t, err)
	ok, err := a.CreateRequest(Write, one(DRAM, ra.Desc(0, 4096)), "b", one(DRAM, rb2.Desc(0, 4096)), nil)
	require.NoError(t, err)
	ok.Post()
	require.NoError(t, ok.Wait(ctxT(t)))
	require.Equal(t, src[:4096], dst2)
}

// slowNIC makes the fake NIC move bytes at rate bytes per second; on a
// real device (the VM's emulated rxe is slow already) it does nothing.
func slowNIC(t *testing.T, rate string) {
	if verbstest.InChild() {
		t.Setenv("GCCL_FAKE_IBV_RATE", rate)
	}
}

// Cancel in the middle of a large WRITE: it returns once nothing can land,
// reports the bytes that did per part, the request fails with
// ErrCanceled; the buffers are then deregistered and reused and no byte at
// the target changes afterwards; the channel goes on for the next request.
func TestRDMACancelWrite(t *testing.T) {
	a, b := rdmaPair(t, Config{})
	size := 64 << 20
	slowNIC(t, "200000000") // ~0.3 s for 64 MiB
	dst := make([]byte, size)
	rb, err := b.RegisterMem(dst)
	require.NoError(t, err)
	_, err = a.LoadRemote(ctxT(t), b.LocalMetadata())
	require.NoError(t, err)
	src := make([]byte, size)
	fill(src, 5)
	ra, _ := a.RegisterMem(src)
	parts := []Part{{End: 1, Notif: []byte("first")}, {End: 2, Notif: []byte("second")}}
	req, err := a.CreateRequest(Write, one(DRAM, ra.Desc(0, uint64(size/2)), ra.Desc(uint64(size/2), uint64(size/2))), "b",
		one(DRAM, rb.Desc(0, uint64(size/2)), rb.Desc(uint64(size/2), uint64(size/2))), &RequestOptions{Parts: parts})
	require.NoError(t, err)
	_, err = req.Post()
	require.NoError(t, err)
	// Data is landing: QP 0's third work request (the fake NIC runs them
	// in posting order, QP 0's first), or on a real device a tenth.
	waitFor(t, func() bool { return dst[8<<20+1] != 0 && (verbstest.InChild() || rdmaProgress(req) >= 0.1) })
	rep, err := req.Cancel(ctxT(t))
	require.NoError(t, err)
	// The target's bytes as Cancel returns: nothing may change from here,
	// not even while Wait and Release run.
	snap := bytes.Clone(dst)
	t.Logf("cancel report: %+v", rep)
	require.True(t, rep.Canceled)
	require.ErrorIs(t, rep.Err, ErrCanceled)
	require.ErrorIs(t, req.Wait(ctxT(t)), ErrCanceled)
	require.Len(t, rep.Parts, 2)
	require.Less(t, rep.Landed, uint64(size), "the whole WRITE landed before the cancel")
	// What is reported landed did land (striped: not a prefix of the part).
	for i, p := range rep.Parts {
		off, equal := i*size/2, uint64(0)
		for j := range size / 2 {
			if src[off+j] == dst[off+j] {
				equal++
			}
		}
		require.GreaterOrEqual(t, equal, p.Landed, "part %d", i)
	}
	time.Sleep(300 * time.Millisecond)
	require.True(t, bytes.Equal(snap, dst), "the target's bytes changed after Cancel returned")
	// The buffers are the owner's: deregister, reuse, and nothing moves.
	require.NoError(t, req.Release())
	require.NoError(t, a.DeregisterMem(ra))
	fill(src, 99)
	time.Sleep(300 * time.Millisecond)
	require.True(t, bytes.Equal(snap, dst), "the target's bytes changed after the source was deregistered and reused")
	// The target learns the request failed.
	var fails []PeerFailure
	waitFor(t, func() bool { fails = append(fails, b.GetFailures()...); return len(fails) > 0 })
	require.Contains(t, fails[0].Err, "canceled")
	require.Equal(t, "a", fails[0].Peer)
	// The channel works on.
	small, _ := a.RegisterMem(src[:4096])
	next, err := a.CreateRequest(Write, one(DRAM, small.Desc(0, 4096)), "b", one(DRAM, rb.Desc(0, 4096)), &RequestOptions{Notif: []byte("next")})
	require.NoError(t, err)
	next.Post()
	require.NoError(t, next.Wait(ctxT(t)))
	require.Equal(t, src[:4096], dst[:4096])
	for {
		msg := waitNotif(t, b, "a")
		if string(msg) == "next" {
			break
		}
		require.Equal(t, "first", string(msg), "only a complete part is notified")
	}
}

// DeregisterMem of a region with a request in flight fails the request
// (ErrCanceled) before anything is freed, and nothing lands afterwards.
func TestRDMADeregisterWhileBusy(t *testing.T) {
	a, b := rdmaPair(t, Config{})
	size := 32 << 20
	slowNIC(t, "100000000")
	dst := make([]byte, size)
	rb, _ := b.RegisterMem(dst)
	_, err := a.LoadRemote(ctxT(t), b.LocalMetadata())
	require.NoError(t, err)
	src := make([]byte, size)
	fill(src, 7)
	ra, _ := a.RegisterMem(src)
	req, err := a.CreateRequest(Write, one(DRAM, ra.Desc(0, uint64(size))), "b", one(DRAM, rb.Desc(0, uint64(size))), nil)
	require.NoError(t, err)
	req.Post()
	waitFor(t, func() bool { return dst[0] != 0 })
	err = a.DeregisterMem(ra)
	require.ErrorIs(t, err, ErrRegionBusy, "the request's lists still hold the region")
	err = req.Wait(ctxT(t))
	require.ErrorIs(t, err, ErrCanceled)
	require.Contains(t, err.Error(), "deregistered")
	snap := bytes.Clone(dst)
	require.NoError(t, req.Release())
	require.NoError(t, a.DeregisterMem(ra))
	clear(src)
	time.Sleep(200 * time.Millisecond)
	require.True(t, bytes.Equal(snap, dst), "bytes landed after the deregistration")
}

// A stalled device (the fake's stall file: no completions while the peer
// answers on its connection) fails the request with ErrStalled, not
// ErrRemoteDisconnect; the target is told; the channel recovers.
func TestRDMAStall(t *testing.T) {
	fakeOnly(t)
	a, b := rdmaPair(t, Config{StallTimeout: 300 * time.Millisecond, PeerTimeout: 2 * time.Second})
	dst := make([]byte, 1<<20)
	rb, _ := b.RegisterMem(dst)
	_, err := a.LoadRemote(ctxT(t), b.LocalMetadata())
	require.NoError(t, err)
	src := make([]byte, 1<<20)
	ra, _ := a.RegisterMem(src)
	stall := filepath.Join(t.TempDir(), "stall")
	t.Setenv("GCCL_FAKE_IBV_STALL_FILE", stall)
	require.NoError(t, os.WriteFile(stall, nil, 0o600))
	req, err := a.CreateRequest(Write, one(DRAM, ra.Desc(0, 1<<20)), "b", one(DRAM, rb.Desc(0, 1<<20)), &RequestOptions{Notif: []byte("x")})
	require.NoError(t, err)
	start := time.Now()
	req.Post()
	err = req.Wait(ctxT(t))
	require.ErrorIs(t, err, ErrStalled)
	require.ErrorIs(t, err, ErrTimeout, "a stall is of the timeout kind")
	require.NotErrorIs(t, err, ErrRemoteDisconnect)
	require.Less(t, time.Since(start), 5*time.Second)
	var fails []PeerFailure
	waitFor(t, func() bool { fails = append(fails, b.GetFailures()...); return len(fails) > 0 })
	require.Contains(t, fails[0].Err, "stalled")
	require.NoError(t, os.Remove(stall))
	req.Post()
	require.NoError(t, req.Wait(ctxT(t)))
	require.Equal(t, []byte("x"), waitNotif(t, b, "a"))
}

// A peer that goes away in the middle of a READ fails it with
// ErrRemoteDisconnect (or, on a real device that serves the READ from the
// closing agent's still registered memory, it completes with the right
// bytes), and the local buffer is not written afterwards.
func TestRDMAPeerGone(t *testing.T) {
	a, b := rdmaPair(t, Config{})
	size := 32 << 20
	if !verbstest.InChild() {
		size = 128 << 20 // the emulated rxe: long enough to go away in the middle
	}
	slowNIC(t, "100000000")
	srcB := make([]byte, size)
	fill(srcB, 1)
	rb, _ := b.RegisterMem(srcB)
	_, err := a.LoadRemote(ctxT(t), b.LocalMetadata())
	require.NoError(t, err)
	dst := make([]byte, size)
	ra, _ := a.RegisterMem(dst)
	req, err := a.CreateRequest(Read, one(DRAM, ra.Desc(0, uint64(size))), "b", one(DRAM, rb.Desc(0, uint64(size))), nil)
	require.NoError(t, err)
	req.Post()
	waitFor(t, func() bool { return rdmaProgress(req) >= 0.05 })
	require.NoError(t, b.Close())
	err = req.Wait(ctxT(t))
	if err != nil || verbstest.InChild() { // the fake NIC is paced: always in the middle
		require.ErrorIs(t, err, ErrRemoteDisconnect)
	} else {
		t.Log("the READ completed before the peer's agent went away")
		require.True(t, bytes.Equal(srcB, dst))
	}
	snap := bytes.Clone(dst)
	time.Sleep(200 * time.Millisecond)
	require.True(t, bytes.Equal(snap, dst), "READ data landed after the request failed")
	req.Release()
}

// GCCL_STRICT: RDMA expected but unusable (a local VRAM region the device
// could not register: no dma-buf, no peer memory) is an error; without it,
// a warning, and tcp staged through pinned buffers.
func TestRDMAStrict(t *testing.T) {
	fakeOnly(t)
	t.Setenv("GCCL_FAKE_IBV_NO_DMABUF", "1")
	t.Setenv("GCCL_FAKE_IBV_NO_PEERMEM", "1")
	ctxs := fakeGPU(t)
	for _, strict := range []bool{false, true} {
		var log testutil.SyncBuffer
		a := rdmaAgent(t, "a", Config{Strict: strict, Logger: slog.New(slog.NewTextHandler(&log, nil))})
		b := rdmaAgent(t, "b", Config{})
		_, err := a.LoadRemote(ctxT(t), b.LocalMetadata())
		require.NoError(t, err)
		dst, _ := b.RegisterMem(make([]byte, 4096))
		_, err = a.LoadRemote(ctxT(t), b.LocalMetadata())
		require.NoError(t, err)
		p := devAlloc(t, ctxs[0], 1<<20, 1)
		v, err := a.RegisterVRAM(uint64(p), 1<<20, 0)
		require.NoError(t, err)
		require.Nil(t, v.rd)
		require.Contains(t, log.String(), "cannot register VRAM (no GPUDirect RDMA)")
		require.Contains(t, log.String(), "dma-buf")
		req, err := a.CreateRequest(Write, one(VRAM, v.Desc(0, 4096)), "b", one(DRAM, dst.Desc(0, 4096)), nil)
		if strict {
			require.ErrorIs(t, err, ErrNotSupported)
			require.Contains(t, err.Error(), "GCCL_STRICT")
			require.Contains(t, err.Error(), "not registered")
			continue
		}
		require.NoError(t, err)
		require.Equal(t, BackendTCP, req.Backend())
		require.Contains(t, log.String(), "expected RDMA to b but cannot use it")
		req.Post()
		require.NoError(t, req.Wait(ctxT(t)))
		require.Equal(t, devRead(t, ctxs[0], p, 4096), dst.Bytes()[:4096])
		req.Release()
		a.Close()
		b.Close()
	}
}

// GPUDirect RDMA against the fake CUDA driver and the fake verbs: VRAM is
// registered as a dma-buf, else through peer memory; a WRITE from DRAM
// into a peer's VRAM and a READ of it back move the bytes on the device.
func TestRDMAVRAM(t *testing.T) {
	fakeOnly(t)
	ctxs := fakeGPU(t)
	for _, how := range []string{"dma-buf", "peer memory"} {
		t.Run(strings.ReplaceAll(how, " ", "-"), func(t *testing.T) {
			if how == "peer memory" {
				t.Setenv("GCCL_FAKE_IBV_NO_DMABUF", "1")
			}
			a, b := rdmaPair(t, Config{})
			p := devAlloc(t, ctxs[0], 2<<20, 0)
			v, err := b.RegisterVRAM(uint64(p), 2<<20, 0)
			require.NoError(t, err)
			require.NotNil(t, v.rd)
			require.Equal(t, how, v.rd.how)
			_, err = a.LoadRemote(ctxT(t), b.LocalMetadata())
			require.NoError(t, err)
			src := make([]byte, 1<<20)
			fill(src, 11)
			ra, _ := a.RegisterMem(src)
			w, err := a.CreateRequest(Write, one(DRAM, ra.Desc(0, 1<<20)), "b", one(VRAM, v.Desc(4096, 1<<20)), nil)
			require.NoError(t, err)
			require.Equal(t, BackendRDMA, w.Backend())
			require.Contains(t, w.BackendReason(), "GPUDirect")
			w.Post()
			require.NoError(t, w.Wait(ctxT(t)))
			require.Equal(t, src, devRead(t, ctxs[0], p+4096, 1<<20))
			back := make([]byte, 1<<20)
			rback, _ := a.RegisterMem(back)
			r, err := a.CreateRequest(Read, one(DRAM, rback.Desc(0, 1<<20)), "b", one(VRAM, v.Desc(4096, 1<<20)), nil)
			require.NoError(t, err)
			r.Post()
			require.NoError(t, r.Wait(ctxT(t)))
			require.Equal(t, src, back)
			w.Release()
			r.Release()
		})
	}
}

// The post and poll path allocates nothing: a Post and Wait of a prepared
// request costs what it costs on shm (the post's done channel).
func TestRDMAPostAllocs(t *testing.T) {
	a, b := rdmaPair(t, Config{})
	dst := make([]byte, 1<<20)
	rb, _ := b.RegisterMem(dst)
	_, err := a.LoadRemote(ctxT(t), b.LocalMetadata())
	require.NoError(t, err)
	src := make([]byte, 1<<20)
	ra, _ := a.RegisterMem(src)
	var descs, rdescs []Desc
	for i := range 64 {
		descs = append(descs, ra.Desc(uint64(i)*8192, 4096))
		rdescs = append(rdescs, rb.Desc(uint64(63-i)*8192, 4096))
	}
	req, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: descs}, "b", DescList{Type: DRAM, Descs: rdescs}, nil)
	require.NoError(t, err)
	ctx := context.Background()
	run := func() {
		if _, err := req.Post(); err != nil {
			panic(err)
		}
		if err := req.Wait(ctx); err != nil {
			panic(err)
		}
	}
	run()
	allocs := testing.AllocsPerRun(200, run)
	t.Logf("%.2f allocations per Post+Wait of 64 descriptors over rdma", allocs)
	require.LessOrEqual(t, allocs, 1.0, "more than the done channel (AllocsPerRun counts the progress goroutine's too)")
	req.Release()
}

// Notifications keep posting order across the rdma path and the
// connection: rdma and tcp requests alternate, large and small.
func TestRDMANotificationOrderMixed(t *testing.T) {
	a, b := rdmaPair(t, Config{})
	dst := make([]byte, 4<<20)
	rb, _ := b.RegisterMem(dst)
	_, err := a.LoadRemote(ctxT(t), b.LocalMetadata())
	require.NoError(t, err)
	src := make([]byte, 4<<20)
	ra, _ := a.RegisterMem(src)
	const n = 40
	var reqs []*Request
	for i := range n {
		o := &RequestOptions{Notif: []byte{byte(i)}}
		l := uint64(4096)
		if i%3 == 0 {
			o.Backend = BackendTCP
		}
		if i%4 == 1 {
			l = 2 << 20
		}
		off := uint64(i%2) * (2 << 20)
		req, err := a.CreateRequest(Write, one(DRAM, ra.Desc(off, l)), "b", one(DRAM, rb.Desc(off, l)), o)
		require.NoError(t, err)
		_, err = req.Post()
		require.NoError(t, err)
		reqs = append(reqs, req)
	}
	for i := range n {
		require.Equal(t, []byte{byte(i)}, waitNotif(t, b, "a"), "notification %d (backend %v)", i, reqs[i].Backend())
	}
	for _, r := range reqs {
		require.NoError(t, r.Wait(ctxT(t)))
		r.Release()
	}
}

// OnComplete may post: two requests whose callbacks post each other, on
// the progress goroutine that finishes them, neither deadlock nor lose a
// completion.
func TestRDMAPostFromCallback(t *testing.T) {
	a, b := rdmaPair(t, Config{})
	dst := make([]byte, 1<<20)
	rb, _ := b.RegisterMem(dst)
	_, err := a.LoadRemote(ctxT(t), b.LocalMetadata())
	require.NoError(t, err)
	src := make([]byte, 1<<20)
	fill(src, 4)
	ra, _ := a.RegisterMem(src)
	done := make(chan error, 2)
	var left atomic.Int32
	left.Store(20)
	var reqs [2]*Request
	for i := range reqs {
		off := uint64(i) * (64 << 10)
		reqs[i], err = a.CreateRequest(Write, one(DRAM, ra.Desc(off, 64<<10)), "b", one(DRAM, rb.Desc(off, 64<<10)), &RequestOptions{
			OnComplete: func(r *Request, err error) {
				if err != nil || left.Add(-1) <= 0 {
					done <- err
					return
				}
				if _, err := reqs[1-i].Post(); err != nil {
					done <- err
				}
			}})
		require.NoError(t, err)
	}
	reqs[0].Post()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the chain of posts stopped")
	}
	for _, r := range reqs {
		require.NoError(t, r.Wait(ctxT(t)))
		r.Release()
	}
	require.Equal(t, src[:128<<10], dst[:128<<10])
}
