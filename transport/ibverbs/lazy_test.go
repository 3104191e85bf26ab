package ibverbs

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gccl/gccl/internal/verbs"
	"github.com/gccl/gccl/transport"
)

// Connect registers nothing and makes no QP; a pair's first use does, on
// both sides, and only for that pair. Messages sent before the peer's first
// use wait in the send ring, and go out although the sender makes no more
// call (its set-up posts them): the receiver, later, gets them all.
func TestPairsConnectAtFirstUse(t *testing.T) {
	w := connectWorld(t, worldConfig{n: 3, slotSize: 4096, slotCount: 4}, false)
	live := verbs.Live()
	require.Zero(t, live.QPs, "QPs at Connect: %v", live)
	require.Zero(t, live.MRs, "memory registered at Connect: %v", live)
	require.Equal(t, int64(3), live.CQs)
	for r, ep := range w.eps {
		require.Zero(t, ep.MemStats().Registered, "rank %d registered memory at Connect", r)
	}

	s, err := w.eps[0].Sender(1)
	require.NoError(t, err)
	for i := range 3 {
		b, ok, err := s.TryReserve(64)
		require.NoError(t, err)
		require.True(t, ok, "message %d queued before the peer's first use", i)
		copy(b, pattern(0, i, 64))
		s.Commit(transport.Tag(i))
	}
	time.Sleep(50 * time.Millisecond) // rank 1 uses the pair later
	r, err := w.eps[1].Receiver(0)
	require.NoError(t, err)
	for i := range 3 {
		m, tag, err := recvOne(w.eps[1], r)
		require.NoError(t, err)
		require.Equal(t, transport.Tag(i), tag)
		require.Equal(t, pattern(0, i, 64), m)
	}
	live = verbs.Live()
	require.Equal(t, int64(2*DefaultQPs), live.QPs, "one pair, both sides: %v", live)
	require.Equal(t, int64(2), live.MRs, "one pair, both sides: %v", live)
	for p, c := range w.eps[2].conns {
		require.Nil(t, c, "rank 2 set up a pair with %d it never used", p)
	}
	ring := int64(w.eps[0].geos[1].bytes())
	require.Equal(t, ring, w.eps[0].MemStats().Registered)
	require.Equal(t, ring, w.eps[1].MemStats().Registered)
	require.Zero(t, w.eps[2].MemStats().Registered)
	require.Contains(t, w.logs[0].String(), fmt.Sprintf("rank 0 -> 1 via %s", w.eps[0].name))
	require.NotContains(t, w.logs[0].String(), "rank 0 -> 2 via")
	require.NotContains(t, w.logs[2].String(), "rank 2 -> ")
	// The rest of the job's pairs connect as they are used.
	w.allPump(t, []int{1, 3000})
	require.Equal(t, int64(6*DefaultQPs), verbs.Live().QPs)
}

// Close delivers what was queued to a pair that comes up within its
// linger: the peer gets the messages, then ErrPeerClosed.
func TestCloseDeliversQueued(t *testing.T) {
	w := connectWorld(t, worldConfig{n: 2, slotSize: 4096, slotCount: 4}, false)
	s, err := w.eps[0].Sender(1)
	require.NoError(t, err)
	for i := range 2 {
		b, ok, err := s.TryReserve(10)
		require.NoError(t, err)
		require.True(t, ok)
		copy(b, pattern(0, i, 10))
		s.Commit(transport.Tag(i))
	}
	done := make(chan error, 1)
	go func() { done <- w.eps[0].Close() }()
	time.Sleep(100 * time.Millisecond)
	r, err := w.eps[1].Receiver(0)
	require.NoError(t, err)
	for i := range 2 {
		m, _, err := recvOne(w.eps[1], r)
		require.NoError(t, err, "message %d", i)
		require.Equal(t, pattern(0, i, 10), m)
	}
	_, _, err = recvOne(w.eps[1], r)
	require.ErrorIs(t, err, transport.ErrPeerClosed)
	require.NoError(t, w.eps[1].Close())
	require.NoError(t, <-done)
}

// A pair nobody used: Close neither waits for it nor leaves anything.
func TestCloseWithPairConnecting(t *testing.T) {
	w := connectWorld(t, worldConfig{n: 2, slotSize: 4096, slotCount: 4}, false)
	_, err := w.eps[0].Receiver(1) // its set-up waits for rank 1's side
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, w.eps[0].Close())
	require.Less(t, time.Since(start), closeLinger, "Close waited for a pair with nothing to deliver")
}

// The peer's side may be up, and its messages land, before this side has
// applied its own outcome: they are taken in order, and the credits for
// them wait for the outcome rather than go out on QPs the owner does not
// own yet (this ran under -race in the VM).
func TestMessagesBeforeOutcome(t *testing.T) {
	hold := make(chan struct{})
	testHookOutcome = func(rank, peer int) {
		if rank == 1 {
			<-hold
		}
	}
	defer func() { testHookOutcome = nil }()
	w := connectWorld(t, worldConfig{n: 2, slotSize: 4096, slotCount: 4}, false)
	r, err := w.eps[1].Receiver(0)
	require.NoError(t, err)
	s, err := w.eps[0].Sender(1)
	require.NoError(t, err)
	send := func(i int) {
		deadline := time.Now().Add(testTimeout)
		for {
			b, ok, err := s.TryReserve(32)
			require.NoError(t, err)
			if ok {
				copy(b, pattern(0, i, 32))
				s.Commit(transport.Tag(i))
				return
			}
			require.True(t, time.Now().Before(deadline), "no room for message %d", i)
			time.Sleep(time.Millisecond)
		}
	}
	for i := range 4 {
		send(i)
	}
	for i := range 4 { // rank 1's set-up has not published its outcome
		m, tag, err := recvOne(w.eps[1], r)
		require.NoError(t, err)
		require.Equal(t, transport.Tag(i), tag)
		require.Equal(t, pattern(0, i, 32), m)
	}
	require.False(t, w.eps[1].conns[0].up)
	close(hold)
	for i := 4; i < 12; i++ { // needs the credits for the first four
		send(i)
		m, tag, err := recvOne(w.eps[1], r)
		require.NoError(t, err)
		require.Equal(t, transport.Tag(i), tag)
		require.Equal(t, pattern(0, i, 32), m)
	}
}
