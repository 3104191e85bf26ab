//go:build linux && cgo

package p2p

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gccl/gccl/internal/testutil"
	"github.com/gccl/gccl/internal/verbs/verbstest"
)

// Two processes on one RDMA device (the child is the target, tests/rxe
// runs these in the Soft-RoCE VM): the fake NIC does not cross processes,
// so they need a real device.

var rdmaChildEnv = []string{"P2P_TEST_HEAP=1", "GCCL_P2P_RDMA_SAME_HOST=1", "GCCL_SHM_DISABLE=1", "GCCL_P2P_PVM_DISABLE=1"}

func realRDMA(t *testing.T) {
	if verbstest.InChild() {
		t.Skip("the fake NIC does not cross processes")
	}
}

// childSum asks the child for its region's checksum.
func childSum(t *testing.T, a *Agent, c *childProc, tag string) string {
	t.Helper()
	notify(t, a, "sum "+tag)
	for {
		l := c.next(t)
		if v, ok := strings.CutPrefix(l, "SUM "+tag+" "); ok {
			return v
		}
	}
}

// notify sends the child a notification (a zero-length WRITE of its own).
func notify(t *testing.T, a *Agent, msg string) {
	t.Helper()
	own, err := a.RegisterMem(make([]byte, 1))
	require.NoError(t, err)
	defer a.DeregisterMem(own)
	cr, err := a.RemoteRegions("child")
	require.NoError(t, err)
	req, err := a.CreateRequest(Write, one(DRAM), "child", one(DRAM), &RequestOptions{Notif: []byte(msg), Backend: BackendTCP})
	require.NoError(t, err)
	_ = cr
	req.Post()
	require.NoError(t, req.Wait(ctxT(t)))
	req.Release()
}

// WRITE in parts into another process, each part checked by the child when
// its notification arrives, then READ back.
func TestRDMATwoProcesses(t *testing.T) {
	realRDMA(t)
	a := rdmaAgent(t, "parent", Config{})
	const size = 8 << 20
	c := startChild(t, size, rdmaChildEnv...)
	_, err := a.LoadRemote(ctxT(t), c.md)
	require.NoError(t, err)
	cr := childRegion(t, c.md)
	src := make([]byte, size)
	lr, _ := a.RegisterMem(src)
	var local, remote []Desc
	var parts []Part
	for p := range 4 {
		seed := byte(10 + p)
		off := p * (size / 4)
		fill(src[off:off+size/4], seed)
		for i := range 16 { // 16 descriptors of 128 KiB, reversed on the target
			b := uint64(off + i*(size/64))
			local = append(local, lr.Desc(b, size/64))
			remote = append(remote, Desc{Addr: cr.Base + uint64(off) + uint64((15-i)*(size/64)), Len: size / 64})
		}
		parts = append(parts, Part{End: len(local), Notif: fmt.Appendf(nil, "check %d %d %d p%d", seed, off, size/4, p)})
	}
	// The child checks each part as one block; reversed descriptors write
	// the blocks in reverse, so reverse them in the source too.
	for p := range 4 {
		for i := range 16 {
			local[p*16+i] = lr.Desc(uint64(p*(size/4)+(15-i)*(size/64)), size/64)
		}
	}
	req, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: local}, "child", DescList{Type: DRAM, Descs: remote}, &RequestOptions{Parts: parts})
	require.NoError(t, err)
	require.Equal(t, BackendRDMA, req.Backend(), req.BackendReason())
	req.Post()
	require.NoError(t, req.Wait(ctxT(t)))
	for p := range 4 {
		require.Equal(t, fmt.Sprintf("OK p%d", p), c.next(t))
	}
	back := make([]byte, size)
	lb, _ := a.RegisterMem(back)
	rd, err := a.CreateRequest(Read, one(DRAM, lb.Desc(0, size)), "child", one(DRAM, Desc{Addr: cr.Base, Len: size}), nil)
	require.NoError(t, err)
	rd.Post()
	require.NoError(t, rd.Wait(ctxT(t)))
	require.True(t, bytes.Equal(src, back))
	req.Release()
	rd.Release()
	exitChild(t, a, c)
}

// rdmaProgress is the share of the current post's work requests that
// completed.
func rdmaProgress(req *Request) float64 {
	ch := req.rch
	if ch == nil {
		return 0
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	done, all := 0, 0
	for k := range req.rd.wrs {
		done += int(req.rd.done[k])
		all += len(req.rd.wrs[k])
	}
	return float64(done) / float64(max(all, 1))
}

// memAvailable is /proc/meminfo's MemAvailable in bytes.
func memAvailable() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// Cancel in the middle of a 1 GiB WRITE into another process (256 MiB when
// this machine cannot hold two of them: the rxe VM's 2 GiB): once Cancel
// returns, no byte of the target changes, neither meanwhile nor after the
// source is deregistered and overwritten; the next request goes through.
func TestRDMACancelLargeWrite(t *testing.T) {
	realRDMA(t)
	size := 1 << 30
	if avail := memAvailable(); avail < 3<<30 {
		size = 256 << 20
		t.Logf("MemAvailable %d MiB: a %d MiB WRITE instead of 1 GiB", avail>>20, size>>20)
	}
	a := rdmaAgent(t, "parent", Config{RequestTimeout: 5 * time.Minute})
	c := startChild(t, size, rdmaChildEnv...)
	_, err := a.LoadRemote(ctxT(t), c.md)
	require.NoError(t, err)
	cr := childRegion(t, c.md)
	src := make([]byte, size)
	fill(src, 77)
	lr, err := a.RegisterMem(src)
	require.NoError(t, err)
	req, err := a.CreateRequest(Write, one(DRAM, lr.Desc(0, uint64(size))), "child", one(DRAM, Desc{Addr: cr.Base, Len: uint64(size)}),
		&RequestOptions{Notif: []byte("whole")})
	require.NoError(t, err)
	start := time.Now()
	req.Post()
	// Until about a quarter of the work requests completed (the emulated
	// rxe moves ~15 MB/s: long enough for the cancel to come in the middle).
	testutil.WaitFor(t, time.Minute, "a quarter of the WRITE", func() bool { return rdmaProgress(req) >= 0.25 })
	rep, err := req.Cancel(ctxT(t))
	require.NoError(t, err)
	// The target's bytes as Cancel returns (before Wait, which must not be
	// what makes them still).
	s1 := childSum(t, a, c, "1")
	t.Logf("cancelled after %v: %d of %d MiB landed (%+v)", time.Since(start).Round(time.Millisecond), rep.Landed>>20, size>>20, rep.Parts)
	require.ErrorIs(t, req.Wait(ctxT(t)), ErrCanceled)
	require.Less(t, rep.Landed, uint64(size))
	require.Greater(t, rep.Landed, uint64(0))
	time.Sleep(time.Second)
	require.Equal(t, s1, childSum(t, a, c, "2"), "the target's bytes changed after Cancel returned")
	require.NoError(t, req.Release())
	require.NoError(t, a.DeregisterMem(lr))
	fill(src, 1)
	time.Sleep(500 * time.Millisecond)
	require.Equal(t, s1, childSum(t, a, c, "3"), "the target's bytes changed after the source was deregistered and reused")
	// The channel works on.
	small := src[:4096]
	ls, _ := a.RegisterMem(small)
	next, err := a.CreateRequest(Write, one(DRAM, ls.Desc(0, 4096)), "child", one(DRAM, Desc{Addr: cr.Base, Len: 4096}),
		&RequestOptions{Notif: []byte("check 1 0 4096 next")})
	require.NoError(t, err)
	next.Post()
	require.NoError(t, next.Wait(ctxT(t)))
	require.Equal(t, "OK next", c.next(t))
	next.Release()
	exitChild(t, a, c)
}

// A target killed in the middle of a READ: the READ either fails with
// ErrRemoteDisconnect or, since the target's NIC serves a READ without its
// process (Soft-RoCE in the kernel goes on until the dead process's QPs are
// torn down), completes with the right bytes; either way nothing lands in
// the buffer afterwards, and the next request fails with
// ErrRemoteDisconnect.
func TestRDMAKilledTarget(t *testing.T) {
	realRDMA(t)
	const size = 256 << 20
	// A killed process's QPs may outlive it a while in the kernel (Soft-RoCE
	// tears them down slowly), so its socket closes late: the NIC's own
	// retries (4.096 us x 2^14, 7 times: ~0.5 s) find it gone first.
	t.Setenv("GCCL_IB_TIMEOUT", "14")
	a := rdmaAgent(t, "parent", Config{})
	c := startChild(t, size, rdmaChildEnv...)
	_, err := a.LoadRemote(ctxT(t), c.md)
	require.NoError(t, err)
	cr := childRegion(t, c.md)
	dst := make([]byte, size)
	lr, _ := a.RegisterMem(dst)
	req, err := a.CreateRequest(Read, one(DRAM, lr.Desc(0, size)), "child", one(DRAM, Desc{Addr: cr.Base, Len: size}), nil)
	require.NoError(t, err)
	req.Post()
	testutil.WaitFor(t, time.Minute, "an eighth of the READ", func() bool { return rdmaProgress(req) >= 0.125 })
	killed := time.Now()
	require.NoError(t, c.cmd.Process.Kill())
	err = req.Wait(ctxT(t))
	t.Logf("the READ ended %v after the kill: %v", time.Since(killed).Round(time.Millisecond), err)
	if err == nil {
		want := make([]byte, size)
		fill(want, childSeed)
		require.True(t, bytes.Equal(want, dst), "a READ from a killed target completed with wrong bytes")
	} else {
		require.ErrorIs(t, err, ErrRemoteDisconnect)
	}
	snap := bytes.Clone(dst)
	time.Sleep(time.Second)
	require.True(t, bytes.Equal(snap, dst), "READ data landed after the request ended")
	require.NoError(t, req.Release())
	// The death is noticed: the next request fails.
	testutil.WaitFor(t, time.Minute, "the next request to fail", func() bool {
		r, err := a.CreateRequest(Read, one(DRAM, lr.Desc(0, 4096)), "child", one(DRAM, Desc{Addr: cr.Base, Len: 4096}), nil)
		if err != nil {
			return errors.Is(err, ErrUnknownPeer) || errors.Is(err, ErrRemoteDisconnect)
		}
		defer r.Release()
		r.Post()
		return errors.Is(r.Wait(ctxT(t)), ErrRemoteDisconnect)
	})
	t.Logf("the next request failed %v after the kill", time.Since(killed).Round(time.Millisecond))
}
