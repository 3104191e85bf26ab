package ibverbs

// The transport on a real verbs stack. Where the host has no RDMA device
// these tests skip; tests/rxe/run.sh runs them inside a VM with Soft-RoCE
// (rdma_rxe), where several processes (or ranks of one process) on rxe0
// reach each other through the device's loopback.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gccl/gccl/internal/verbs"
	"github.com/gccl/gccl/transport"
)

// Messages of every size class both ways, on one QP and striped over
// several, between 2 and 3 ranks; every byte and tag checked.
func TestExchange(t *testing.T) {
	const slot = 512 << 10
	sizes := []int{0, 1, 100, 4096, 65536, stripeMin - 1, stripeMin, stripeMin + 4097, slot - 1, slot}
	var all []int
	for range 3 {
		all = append(all, sizes...)
	}
	for _, c := range []struct{ n, qps int }{{2, 1}, {2, 2}, {3, 3}} {
		t.Run(fmt.Sprintf("ranks=%d,qps=%d", c.n, c.qps), func(t *testing.T) {
			w := connectWorld(t, worldConfig{n: c.n, slotSize: slot, slotCount: 4,
				env: map[string]string{"GCCL_IB_QPS_PER_CONNECTION": fmt.Sprint(c.qps)}}, false)
			w.allPump(t, all)
			for r, ep := range w.eps {
				require.Regexp(t, `^NET/IB/\w+:\d+$`, ep.Name())
				for p := range c.n {
					if p != r {
						require.Equal(t, ep.Name(), ep.Via(p))
						require.Equal(t, c.qps, ep.conns[p].g.qps)
						require.Contains(t, w.logs[r].String(), fmt.Sprintf("rank %d -> %d via %s (RoCE v2", r, p, ep.Name()))
					}
				}
				require.Contains(t, w.logs[r].String(), "device buffers cross hosts through registered host staging")
			}
			// Large messages went out striped over every QP.
			if c.qps > 1 {
				for r, ep := range w.eps {
					for _, cn := range ep.list {
						for j := range c.qps {
							require.Positive(t, cn.pieces[j], "rank %d -> %d: QP %d carried no piece", r, cn.peer, j)
						}
					}
				}
			}
		})
	}
}

// The sender stops at slotCount unreleased messages and goes on once the
// receiver releases one: credits flow back.
func TestCreditsFlowBack(t *testing.T) {
	w := connectWorld(t, worldConfig{n: 2, slotSize: 4096, slotCount: 3}, false)
	s, _ := w.eps[0].Sender(1)
	r, _ := w.eps[1].Receiver(0)
	for i := range 3 {
		b, ok, err := s.TryReserve(8)
		require.NoError(t, err)
		require.True(t, ok, "message %d", i)
		b[0] = byte(i)
		s.Commit(transport.Tag(i))
	}
	// The ring is full whatever the receiver has seen.
	time.Sleep(50 * time.Millisecond)
	_, ok, err := s.TryReserve(8)
	require.NoError(t, err)
	require.False(t, ok, "a fourth message on a 3-slot ring")
	next := func() []byte {
		deadline := time.Now().Add(testTimeout)
		for {
			m, _, ok, err := r.TryNext()
			require.NoError(t, err)
			if ok {
				return m
			}
			require.True(t, time.Now().Before(deadline), "no message")
		}
	}
	require.Equal(t, []byte{0, 0, 0, 0, 0, 0, 0, 0}, next())
	r.Release()
	deadline := time.Now().Add(testTimeout)
	for {
		var b []byte
		b, ok, err = s.TryReserve(8)
		require.NoError(t, err)
		if ok {
			b[0] = 3
			break
		}
		require.True(t, time.Now().Before(deadline), "the release never reached the sender")
	}
	s.Commit(3)
	for i := 1; i < 4; i++ {
		require.Equal(t, byte(i), next()[0])
		r.Release()
	}
}

// A rank asleep in Wait is woken by the completion channel when a message
// comes (and at most once or twice before, which Wait allows: the channel
// also fires at the completion of the rank's own credit writes).
func TestSleepAndWake(t *testing.T) {
	w := connectWorld(t, worldConfig{n: 2, slotSize: 4096, slotCount: 4}, false)
	s, _ := w.eps[0].Sender(1)
	r, _ := w.eps[1].Receiver(0)
	ep := w.eps[1]
	for i := range 5 {
		go func() {
			time.Sleep(100 * time.Millisecond)
			b, ok, err := s.TryReserve(16)
			if err == nil && ok {
				b[0] = byte(i)
				s.Commit(transport.Tag(i))
			}
		}()
		start := time.Now()
		wakes := 0
		for {
			seen := ep.Seq()
			m, tag, ok, err := r.TryNext()
			require.NoError(t, err)
			if ok {
				require.Equal(t, transport.Tag(i), tag)
				require.Equal(t, byte(i), m[0])
				r.Release()
				break
			}
			require.NoError(t, ep.Wait(context.Background(), seen, time.Now().Add(testTimeout)))
			wakes++
		}
		took := time.Since(start)
		require.Greater(t, took, 50*time.Millisecond, "the message came before it was sent")
		require.LessOrEqual(t, wakes, 3, "woken %d times for one message", wakes)
		t.Logf("round %d: the message %v after the wait began, %d wake-ups", i, took, wakes)
	}
	// With nothing coming, a deadline ends the wait.
	deadline := time.Now().Add(300 * time.Millisecond)
	for i := 0; ; i++ {
		require.Less(t, i, 10, "Wait keeps returning without a message")
		_, _, ok, err := r.TryNext()
		require.NoError(t, err)
		require.False(t, ok)
		err = ep.Wait(context.Background(), ep.Seq(), deadline)
		if err != nil {
			require.ErrorIs(t, err, transport.ErrTimeout)
			break
		}
	}
}

// TryReserve, Commit, TryNext and Release allocate nothing, whether the
// rank spins or sleeps.
func TestSteadyStateAllocatesNothing(t *testing.T) {
	w := connectWorld(t, worldConfig{n: 2, slotSize: 2 * stripeMin, slotCount: 2,
		env: map[string]string{"GCCL_IB_QPS_PER_CONNECTION": "2"}}, false)
	s01, _ := w.eps[0].Sender(1)
	s10, _ := w.eps[1].Sender(0)
	r01, _ := w.eps[1].Receiver(0)
	r10, _ := w.eps[0].Receiver(1)
	hop := func(from, to *Endpoint, s transport.Sender, r transport.Receiver, n int, sleep bool) {
		var b []byte
		for ok := false; !ok; {
			var err error
			if b, ok, err = s.TryReserve(n); err != nil {
				t.Fatal(err)
			}
		}
		b[0] = 1
		s.Commit(3)
		for {
			seen := to.Seq()
			m, _, ok, err := r.TryNext()
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				if len(m) != n {
					t.Fatalf("got %d bytes, want %d", len(m), n)
				}
				r.Release()
				return
			}
			if sleep {
				if err := to.Wait(context.Background(), seen, time.Time{}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for _, sleep := range []bool{false, true} {
		for _, n := range []int{8, 64 << 10, 2 * stripeMin} {
			round := func() {
				hop(w.eps[0], w.eps[1], s01, r01, n, sleep)
				hop(w.eps[1], w.eps[0], s10, r10, n, sleep)
			}
			for range 20 {
				round()
			}
			require.Zero(t, testing.AllocsPerRun(100, round), "%d-byte messages (sleeping %v): allocations per round trip", n, sleep)
		}
	}
}

// Close: the peer takes what was sent, then sees ErrPeerClosed; nothing
// of either rank's verbs objects is left (connectWorld's cleanup counts
// them).
func TestCloseDrains(t *testing.T) {
	w := connectWorld(t, worldConfig{n: 2, slotSize: 4096, slotCount: 4}, false)
	w.up(t)
	live := verbs.Live()
	require.Equal(t, int64(2), live.Contexts)
	require.Equal(t, int64(2), live.CQs)
	require.Equal(t, int64(2*DefaultQPs), live.QPs)
	require.Equal(t, int64(2), live.MRs)
	s, _ := w.eps[0].Sender(1)
	for i := range 3 {
		b, ok, err := s.TryReserve(4)
		require.NoError(t, err)
		require.True(t, ok)
		b[0] = byte(i)
		s.Commit(transport.Tag(i))
	}
	done := make(chan error, 1)
	go func() { done <- w.eps[0].Close() }()
	r, _ := w.eps[1].Receiver(0)
	for i := range 3 {
		m, _, err := recvOne(w.eps[1], r)
		require.NoError(t, err)
		require.Equal(t, byte(i), m[0])
	}
	_, _, err := recvOne(w.eps[1], r)
	require.ErrorIs(t, err, transport.ErrPeerClosed)
	var pe *transport.PeerError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, 0, pe.Peer)
	s1, _ := w.eps[1].Sender(0)
	_, _, err = s1.TryReserve(4)
	require.ErrorIs(t, err, transport.ErrPeerClosed)
	require.NoError(t, w.eps[1].Close())
	start := time.Now()
	require.NoError(t, <-done)
	// Rank 1 closed second, having rank 0's notice already: it must still
	// send its own, which rank 0's Close waits for (it used to skip it, and
	// rank 0 waited out its whole linger, which a timing check alone could
	// not tell from a slow run).
	for _, c := range w.eps[0].list {
		require.Equal(t, peerClosed, c.peerState, "rank 0 never saw rank 1's close notice")
	}
	require.Less(t, time.Since(start), closeLinger, "Close waited for its peer's notice in vain")
	require.Zero(t, verbs.Live().Total(), "after Close: %v", verbs.Live())
	// Calls after Close.
	_, err = w.eps[0].Sender(1)
	require.ErrorIs(t, err, transport.ErrClosed)
	_, _, err = s.TryReserve(4)
	require.ErrorIs(t, err, transport.ErrClosed)
	require.ErrorIs(t, w.eps[0].Wait(context.Background(), w.eps[0].Seq(), time.Time{}), transport.ErrClosed)
}

// recvOne waits for the next message, copying it.
func recvOne(e *Endpoint, r transport.Receiver) ([]byte, transport.Tag, error) {
	deadline := time.Now().Add(testTimeout)
	for {
		seen := e.Seq()
		m, tag, ok, err := r.TryNext()
		if err != nil {
			return nil, 0, err
		}
		if ok {
			out := append([]byte(nil), m...)
			r.Release()
			return out, tag, nil
		}
		if err := e.Wait(context.Background(), seen, deadline); err != nil {
			return nil, 0, err
		}
	}
}

// Abort: a connected peer asleep waiting for a message is woken and sees
// the reason; the aborted endpoint's own sleeper sees ErrClosed. (A peer
// waiting for a pair's first use learns of the abort from the job, as over
// TCP: the transport has no connection to tell it by.)
func TestAbortReachesPeer(t *testing.T) {
	w := connectWorld(t, worldConfig{n: 3, slotSize: 4096, slotCount: 4}, false)
	w.up(t)
	errc := make(chan error, 2)
	for _, r := range []int{1, 2} {
		go func() {
			rc, _ := w.eps[r].Receiver(0)
			_, _, err := recvOne(w.eps[r], rc)
			errc <- err
		}()
	}
	sleeper := make(chan error, 1)
	go func() {
		rc, _ := w.eps[0].Receiver(1)
		_, _, err := recvOne(w.eps[0], rc)
		sleeper <- err
	}()
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	w.eps[0].Abort(errors.New("rank 0 saw a bad checksum"))
	require.ErrorIs(t, <-sleeper, transport.ErrClosed)
	for range 2 {
		err := <-errc
		require.ErrorIs(t, err, transport.ErrPeerClosed)
		require.ErrorContains(t, err, "rank aborted: rank 0 saw a bad checksum")
	}
	t.Logf("peers saw the abort %v after it", time.Since(start))
}

// A peer that vanished without a word (its QPs destroyed, as when its
// process is killed): the writes to it are retried GCCL_IB_RETRY_CNT times
// and fail, and the operation fails with a PeerError that names the rank,
// the HCA, the QP and the status.
func TestVanishedPeer(t *testing.T) {
	w := connectWorld(t, worldConfig{n: 2, slotSize: 4096, slotCount: 4,
		env: map[string]string{"GCCL_IB_TIMEOUT": "10", "GCCL_IB_RETRY_CNT": "1", "GCCL_IB_QPS_PER_CONNECTION": "1"}}, false)
	w.up(t)
	victim := w.eps[1].conns[0]
	for _, q := range victim.qps {
		require.NoError(t, q.Close())
	}
	s, _ := w.eps[0].Sender(1)
	start := time.Now()
	b, ok, err := s.TryReserve(64)
	require.NoError(t, err)
	require.True(t, ok)
	b[0] = 1
	s.Commit(1)
	r, _ := w.eps[0].Receiver(1)
	_, _, err = recvOne(w.eps[0], r)
	require.Error(t, err)
	t.Logf("failed %v after the write: %v", time.Since(start), err)
	var pe *transport.PeerError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, 1, pe.Peer)
	require.ErrorIs(t, err, transport.ErrPeerClosed)
	qpn := w.eps[0].conns[1].qps[0].QPN()
	for _, want := range []string{"rank 0 -> 1", w.eps[0].name, fmt.Sprintf("QP %#x", qpn), "transport retry counter exceeded"} {
		require.ErrorContains(t, err, want)
	}
	_, _, err = s.TryReserve(64)
	require.ErrorAs(t, err, &pe)
	require.Less(t, time.Since(start), 20*time.Second)
}

// A pair whose QPs cannot reach RTR: TCP carries it, with a WARN on both
// sides naming the pair and the reason; other pairs stay on RDMA. Under
// GCCL_STRICT=1 the pair fails instead: its first use on both sides, or
// Connect when pairs connect at Init (GCCL_RUNTIME_CONNECT=0).
func TestFallbackToTCP(t *testing.T) {
	t.Setenv("GCCL_SOCKET_IFNAME", "lo")
	breakConnect = func(rank, peer int) error {
		if rank == 0 && peer == 1 { // rank 0's side of the pair 0-1
			return errors.New("ibv_modify_qp to RTR: network is unreachable")
		}
		return nil
	}
	defer func() { breakConnect = nil }()
	checkFallback := func(t *testing.T, w *world) {
		require.Equal(t, "TCP", w.eps[0].Via(1))
		require.Equal(t, "TCP", w.eps[1].Via(0))
		require.Equal(t, w.eps[0].name, w.eps[0].Via(2))
		require.Equal(t, w.eps[2].name, w.eps[2].Via(1))
		require.Contains(t, w.logs[0].String(), "WARN INIT rank 0 -> 1 via TCP instead of IB (QP failed to reach RTR/RTS: ibv_modify_qp to RTR: network is unreachable)")
		require.Contains(t, w.logs[1].String(), "WARN INIT rank 1 -> 0 via TCP instead of IB (on rank 0: QP failed to reach RTR/RTS")
		require.NotContains(t, w.logs[2].String(), "WARN")
	}
	t.Run("fallback", func(t *testing.T) {
		w := connectWorld(t, worldConfig{n: 3, slotSize: 64 << 10, slotCount: 4}, false)
		w.allPump(t, []int{1, 1000, 64 << 10, 3, 0})
		checkFallback(t, w)
	})
	t.Run("fallback at Init", func(t *testing.T) {
		w := connectWorld(t, worldConfig{n: 3, slotSize: 64 << 10, slotCount: 4, env: map[string]string{"GCCL_RUNTIME_CONNECT": "0"}}, false)
		checkFallback(t, w)
		w.allPump(t, []int{1, 1000, 64 << 10, 3, 0})
	})
	// What rank 0 queued before the pair failed, and the message it had
	// reserved then, go over TCP in order.
	t.Run("queued messages move", func(t *testing.T) {
		w := connectWorld(t, worldConfig{n: 2, slotSize: 4096, slotCount: 4}, false)
		s, err := w.eps[0].Sender(1)
		require.NoError(t, err)
		for i := range 2 {
			b, ok, err := s.TryReserve(100 + i)
			require.NoError(t, err)
			require.True(t, ok)
			copy(b, pattern(0, i, 100+i))
			s.Commit(transport.Tag(i))
		}
		b, ok, err := s.TryReserve(102)
		require.NoError(t, err)
		require.True(t, ok)
		r, err := w.eps[1].Receiver(0)
		require.NoError(t, err)
		// Rank 0 is in no call: its set-up applies the outcome itself.
		c := w.eps[0].conns[1]
		waitUntil(t, c.applied.Load)
		require.Equal(t, "TCP", w.eps[0].Via(1))
		copy(b, pattern(0, 2, 102))
		s.Commit(2)
		for i := range 3 {
			m, tag, err := recvOne(w.eps[1], r)
			require.NoError(t, err)
			require.Equal(t, transport.Tag(i), tag)
			require.Equal(t, pattern(0, i, 100+i), m, "message %d", i)
		}
		w.allPump(t, []int{7, 4096})
	})
	strictWant := func(t *testing.T, r int, err error) {
		require.ErrorContains(t, err, "GCCL_STRICT=1 forbids a downgrade", "rank %d", r)
		require.ErrorContains(t, err, fmt.Sprintf("rank %d -> %d via TCP instead of IB", r, 1-r))
		require.ErrorIs(t, err, verbs.ErrNotSupported)
	}
	t.Run("strict", func(t *testing.T) {
		w := connectWorld(t, worldConfig{n: 2, slotSize: 4096, slotCount: 2, env: map[string]string{"GCCL_STRICT": "1"}}, false)
		for r, err := range w.pumpEach([]int{8}) {
			strictWant(t, r, err)
			var pe *transport.PeerError
			require.ErrorAs(t, err, &pe)
			require.Equal(t, 1-r, pe.Peer)
		}
	})
	t.Run("strict at Init", func(t *testing.T) {
		w := connectWorld(t, worldConfig{n: 2, slotSize: 4096, slotCount: 2,
			env: map[string]string{"GCCL_STRICT": "1", "GCCL_RUNTIME_CONNECT": "0"}}, true)
		for r, err := range w.errs {
			strictWant(t, r, err)
		}
		require.Zero(t, verbs.Live().Total(), "a failed Connect left %v", verbs.Live())
	})
}

// Many rounds of a ring exchange under a small window, 3 ranks, one
// goroutine each and a scheduler kept busy: the arithmetic of credits and
// pieces holds over thousands of messages and several wraps of the ring.
func TestManyMessages(t *testing.T) {
	w := connectWorld(t, worldConfig{n: 3, slotSize: 2 * stripeMin, slotCount: 2,
		env: map[string]string{"GCCL_IB_QPS_PER_CONNECTION": "2"}}, false)
	sizes := make([]int, 600)
	for i := range sizes {
		sizes[i] = []int{1, 3000, stripeMin + 100, 17}[i%4]
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // contention for the processors
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				runtime.Gosched()
			}
		}
	}()
	w.allPump(t, sizes)
	close(stop)
	wg.Wait()
	for _, ep := range w.eps {
		for _, c := range ep.list {
			require.Equal(t, uint64(len(sizes)), c.tail)
			require.Equal(t, uint64(len(sizes)), c.head)
		}
	}
}

// Listen's reasons: a malformed variable, a port the filter excludes.
func TestListenReasons(t *testing.T) {
	requireDevice(t)
	for env, want := range map[string]string{
		"GCCL_IB_QPS_PER_CONNECTION=99": "GCCL_IB_QPS_PER_CONNECTION=\"99\"",
		"GCCL_IB_HCA=nosuchdevice":      "not selected by GCCL_IB_HCA=nosuchdevice",
		"GCCL_RUNTIME_CONNECT=yes":      "GCCL_RUNTIME_CONNECT=\"yes\": want 1",
	} {
		k, v, _ := strings.Cut(env, "=")
		s := transport.Setup{JobID: "x", Rank: 0, Size: 2, SlotSize: 4096, SlotCount: 2, Hosts: []string{"a", "b"}, Pids: []int{1, 2},
			Unclaimed: []int{1}, Getenv: func(n string) string {
				if n == k {
					return v
				}
				return ""
			}}
		l, err := ibTransport{}.Listen(context.Background(), &s)
		require.Nil(t, l)
		require.ErrorContains(t, err, want)
	}
	// GCCL_IB_DISABLE=1, or no peer to serve: nothing to do, no reason.
	s := transport.Setup{JobID: "x", Rank: 0, Size: 2, SlotSize: 4096, SlotCount: 2, Hosts: []string{"a", "b"}, Pids: []int{1, 2},
		Unclaimed: []int{1}, Getenv: func(n string) string {
			if n == "GCCL_IB_DISABLE" {
				return "1"
			}
			return ""
		}}
	l, err := ibTransport{}.Listen(context.Background(), &s)
	require.NoError(t, err)
	require.Nil(t, l)
	s.Unclaimed, s.Getenv = nil, func(string) string { return "" }
	l, err = ibTransport{}.Listen(context.Background(), &s)
	require.NoError(t, err)
	require.Nil(t, l)
	require.Zero(t, verbs.Live().Total())
}
