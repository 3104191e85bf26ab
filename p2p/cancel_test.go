package p2p

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Cancellation and stalls on the backends other than rdma (rdma_test.go
// has its own).

// equalPrefix is how many bytes at the start of a and b are equal.
func equalPrefix(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

// Cancel of a large tcp WRITE: once it returns nothing more lands (the
// target processed every frame sent: a fence), the bytes reported landed
// did, and the source may be deregistered and reused.
func TestCancelTCPWrite(t *testing.T) {
	cfg := Config{DisableSHM: true, DisablePVM: true, DisableRDMA: true}
	a, b := newAgent(t, "a", cfg), newAgent(t, "b", cfg)
	const size = 128 << 20
	dst := make([]byte, size)
	rb, _ := b.RegisterMem(dst)
	_, err := a.LoadRemote(ctxT(t), b.LocalMetadata())
	require.NoError(t, err)
	src := make([]byte, size)
	fill(src, 3)
	ra, _ := a.RegisterMem(src)
	parts := []Part{{End: 1, Notif: []byte("0")}, {End: 2, Notif: []byte("1")}}
	req, err := a.CreateRequest(Write, one(DRAM, ra.Desc(0, size/2), ra.Desc(size/2, size/2)), "b",
		one(DRAM, rb.Desc(0, size/2), rb.Desc(size/2, size/2)), &RequestOptions{Parts: parts})
	require.NoError(t, err)
	require.Equal(t, BackendTCP, req.Backend())
	req.Post()
	waitFor(t, func() bool { return req.tcpLanded[0].Load() > 1<<20 }) // (not dst: that would race)
	rep, err := req.Cancel(ctxT(t))
	require.NoError(t, err)
	t.Logf("%+v", rep)
	snap := bytes.Clone(dst)
	if rep.Canceled && rep.Err != nil {
		require.ErrorIs(t, rep.Err, ErrCanceled)
		require.ErrorIs(t, req.Wait(ctxT(t)), ErrCanceled)
		for i, p := range rep.Parts {
			off := i * size / 2
			require.GreaterOrEqual(t, equalPrefix(src[off:off+size/2], dst[off:off+size/2]), int(p.Landed), "part %d", i)
		}
	} else {
		t.Log("the WRITE finished before the cancel")
	}
	require.NoError(t, req.Release())
	require.NoError(t, a.DeregisterMem(ra))
	clear(src)
	time.Sleep(100 * time.Millisecond)
	require.True(t, bytes.Equal(snap, dst), "bytes landed after Cancel returned")
}

// A target that does not answer: Cancel still takes the post out of
// flight (its memory is free) but says it could not confirm the rest.
func TestCancelTCPUnconfirmed(t *testing.T) {
	a := newAgent(t, "a", Config{ListenAddr: "-", DisableRDMA: true})
	c := fakeTarget(t, a, 4<<20)
	go io.Copy(io.Discard, c) // reads everything, answers nothing
	lr, _ := a.RegisterMem(make([]byte, 4<<20))
	req, err := a.CreateRequest(Write, one(DRAM, lr.Desc(0, 4<<20)), "fake", one(DRAM, Desc{Addr: 1 << 40, Len: 4 << 20}), nil)
	require.NoError(t, err)
	req.Post()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	rep, err := req.Cancel(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), "fence")
	require.True(t, rep.Canceled)
	require.ErrorIs(t, req.Wait(ctxT(t)), ErrCanceled)
	require.NoError(t, req.Release())
}

// Cancel of a large copy (the local backend): it stops at its next block;
// what the report says landed did, and nothing moves afterwards.
func TestCancelCopy(t *testing.T) {
	a := newAgent(t, "a", Config{CopyThreads: 1})
	const size = 128 << 20
	src, dst := make([]byte, size), make([]byte, size)
	fill(src, 9)
	ls, _ := a.RegisterMem(src)
	ld, _ := a.RegisterMem(dst)
	req, err := a.CreateRequest(Write, one(DRAM, ls.Desc(0, size)), a.Name(), one(DRAM, ld.Desc(0, size)), nil)
	require.NoError(t, err)
	require.Equal(t, BackendLocal, req.Backend())
	req.Post()
	waitFor(t, func() bool { return req.stop.landed.Load() > 1<<20 })
	rep, err := req.Cancel(ctxT(t))
	require.NoError(t, err)
	t.Logf("%+v", rep)
	snap := bytes.Clone(dst)
	if rep.Canceled && rep.Err != nil {
		require.ErrorIs(t, req.Wait(ctxT(t)), ErrCanceled)
		require.GreaterOrEqual(t, equalPrefix(src, dst), int(rep.Landed))
		require.Less(t, rep.Landed, uint64(size))
	}
	require.NoError(t, req.Release())
	require.NoError(t, a.DeregisterMem(ls))
	clear(src)
	time.Sleep(50 * time.Millisecond)
	require.True(t, bytes.Equal(snap, dst), "bytes copied after Cancel returned")
	// Cancel of a post that is over reports it, and changes nothing.
	req2, _ := a.CreateRequest(Write, one(DRAM, ld.Desc(0, 4096)), a.Name(), one(DRAM, ld.Desc(8192, 4096)), nil)
	req2.Post()
	require.NoError(t, req2.Wait(ctxT(t)))
	rep, err = req2.Cancel(ctxT(t))
	require.NoError(t, err)
	require.False(t, rep.Canceled)
	require.NoError(t, rep.Err)
	require.Equal(t, []PartReport{{Bytes: 4096, Landed: 4096, Done: true}}, rep.Parts)
	req2.Release()
}

// A request queued behind others is cancelled before it starts: nothing
// of it moves.
func TestCancelQueued(t *testing.T) {
	cfg := Config{DisableSHM: true, DisablePVM: true, DisableRDMA: true}
	a, b := newAgent(t, "a", cfg), newAgent(t, "b", cfg)
	dst := make([]byte, 64<<20)
	rb, _ := b.RegisterMem(dst)
	_, err := a.LoadRemote(ctxT(t), b.LocalMetadata())
	require.NoError(t, err)
	src := make([]byte, 64<<20)
	fill(src, 1)
	ra, _ := a.RegisterMem(src)
	first, _ := a.CreateRequest(Write, one(DRAM, ra.Desc(0, 32<<20)), "b", one(DRAM, rb.Desc(0, 32<<20)), nil)
	second, _ := a.CreateRequest(Write, one(DRAM, ra.Desc(32<<20, 32<<20)), "b", one(DRAM, rb.Desc(32<<20, 32<<20)), nil)
	first.Post()
	second.Post()
	rep, err := second.Cancel(ctxT(t))
	require.NoError(t, err)
	require.NoError(t, first.Wait(ctxT(t)))
	if rep.Canceled && rep.Err != nil {
		require.ErrorIs(t, second.Wait(ctxT(t)), ErrCanceled)
		require.GreaterOrEqual(t, equalPrefix(src[32<<20:], dst[32<<20:]), int(rep.Landed))
	}
	first.Release()
	second.Release()
}

// A tcp target that answers pings but never acknowledges the WRITE: the
// post fails with ErrStalled after StallTimeout, not with a timeout or a
// lost peer.
func TestStallTCP(t *testing.T) {
	a := newAgent(t, "a", Config{ListenAddr: "-", DisableRDMA: true, StallTimeout: 300 * time.Millisecond,
		PeerTimeout: 2 * time.Second, RequestTimeout: 20 * time.Second})
	c := fakeTarget(t, a, 1<<20)
	go func() { // answer pings, ack nothing
		var hb [wireHeaderLen]byte
		for {
			if _, err := io.ReadFull(c, hb[:]); err != nil {
				return
			}
			h, err := parseHeader(hb[:])
			if err != nil {
				return
			}
			if _, err := io.CopyN(io.Discard, c, int64(h.payloadLen())); err != nil {
				return
			}
			if h.op == opPing {
				c.Write(frame(header{op: opPong, aux: h.aux}, nil))
			}
		}
	}()
	lr, _ := a.RegisterMem(make([]byte, 1<<20))
	req, err := a.CreateRequest(Write, one(DRAM, lr.Desc(0, 1<<20)), "fake", one(DRAM, Desc{Addr: 1 << 40, Len: 1 << 20}), nil)
	require.NoError(t, err)
	start := time.Now()
	req.Post()
	err = req.Wait(ctxT(t))
	require.ErrorIs(t, err, ErrStalled)
	require.ErrorIs(t, err, ErrTimeout)
	require.NotErrorIs(t, err, ErrRemoteDisconnect)
	require.Less(t, time.Since(start), 3*time.Second)
	require.NoError(t, req.Release())
}
