package shm

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gccl/gccl/transport"
)

// TestMemoryGrowsWithPeersUsed: a rank's mailbox holds its header and,
// per peer it sent to, a ring's counters and slot lines, plus the lines'
// small data areas once a message needed one, plus of each slot's data the
// pages its longest message covered; whatever the size of the job. The
// file on /dev/shm holds exactly that much memory.
func TestMemoryGrowsWithPeersUsed(t *testing.T) {
	const n = 8
	cfg := Config{SlotSize: 3 * pageSize, SlotCount: 4}
	eps := world(t, n, cfg)
	g, err := newGeometry(cfg.SlotSize, cfg.SlotCount, n)
	if err != nil {
		t.Fatal(err)
	}
	check := func(when string, want []int64) {
		t.Helper()
		for r, ep := range eps {
			if got := ep.mb.Bytes(); got != want[r] {
				t.Errorf("%s: rank %d holds %d bytes, want %d", when, r, got, want[r])
			}
		}
	}
	hdr, lines, page := int64(g.headerSize), int64(g.smallOff), int64(pageSize) // lines: a ring's counters and slot lines
	small := int64(g.dataOff - g.smallOff)
	check("after Connect", []int64{hdr, hdr, hdr, hdr, hdr, hdr, hdr, hdr})
	// Rank 0 sends small messages to 1 and 2; rank 1 answers 0; the others
	// only exist.
	for _, p := range []int{1, 2} {
		if err := send(eps[0], p, []byte("x"), 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := send(eps[1], 0, []byte("y"), 2); err != nil {
		t.Fatal(err)
	}
	// Receivers make nothing; a second Sender to the same peer neither.
	if _, err := eps[3].Receiver(0); err != nil {
		t.Fatal(err)
	}
	if _, err := eps[0].Sender(1); err != nil {
		t.Fatal(err)
	}
	check("after small messages", []int64{hdr + 2*lines, hdr + lines, hdr, hdr, hdr, hdr, hdr, hdr})
	// A message too large for a slot's line takes a small data area,
	// which reserves all of them; one too large for that reserves
	// the pages of its slot's data that it covers: the third message to
	// rank 2 lands in slot 2 and takes its first page, the fourth, in slot
	// 3, all three.
	if err := send(eps[0], 2, make([]byte, inlineMax+1), 3); err != nil {
		t.Fatal(err)
	}
	check("after a small message", []int64{hdr + 2*lines + small, hdr + lines, hdr, hdr, hdr, hdr, hdr, hdr})
	for _, m := range []int{smallMax + 1, 3 * pageSize} {
		if err := send(eps[0], 2, make([]byte, m), 3); err != nil {
			t.Fatal(err)
		}
	}
	check("after large messages", []int64{hdr + 2*lines + small + 4*page, hdr + lines, hdr, hdr, hdr, hdr, hdr, hdr})
	buf := make([]byte, 3*pageSize)
	for _, c := range []struct{ to, from, n int }{{1, 0, 1}, {2, 0, 1}, {2, 0, inlineMax + 1}, {2, 0, smallMax + 1}, {2, 0, 3 * pageSize}, {0, 1, 1}} {
		if n, _, err := recv(eps[c.to], c.from, buf); err != nil || n != c.n {
			t.Fatalf("rank %d from %d: %d bytes, %v", c.to, c.from, n, err)
		}
	}
}

// TestLinesReadyAtTheStart: a ring's counters and slot lines are reserved
// when it is made and mapped on both sides by the first message, so that no
// message of the first lap takes a page fault on either side (one every 32
// lines while the pages were reserved as the sender reached them); the
// small data areas and slot data stay unreserved.
func TestLinesReadyAtTheStart(t *testing.T) {
	runtime.LockOSThread() // the faults counted are this thread's
	defer runtime.UnlockOSThread()
	cfg := Config{SlotSize: 4 * smallMax, SlotCount: 2}
	eps := world(t, 2, cfg)
	g, err := newGeometry(cfg.SlotSize, cfg.SlotCount, 2)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	exchange := func(k int) {
		if err := send(eps[0], 1, []byte{byte(k)}, transport.Tag(k)); err != nil {
			t.Fatal(err)
		}
		if n, tag, err := recv(eps[1], 0, buf); err != nil || n != 1 || buf[0] != byte(k) || tag != transport.Tag(k) {
			t.Fatalf("message %d: %d bytes %v tag %d: %v", k, n, buf[:n], tag, err)
		}
	}
	exchange(0)
	want := int64(g.headerSize + g.smallOff)
	if got := eps[0].mb.Bytes(); got != want {
		t.Fatalf("after the first message: %d bytes held, want %d (header, counters and lines)", got, want)
	}
	var ru unix.Rusage
	faults := func() int64 {
		if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
			t.Fatal(err)
		}
		return ru.Minflt
	}
	before := faults()
	for k := 1; k < g.lineCount+40; k++ {
		exchange(k)
	}
	if n := faults() - before; n != 0 && !raceEnabled {
		t.Fatalf("a lap of messages took %d page faults, want 0", n)
	}
	if got := eps[0].mb.Bytes(); got != want {
		t.Fatalf("after a lap: %d bytes held, want %d", got, want)
	}
}

// TestReceiverBeforeSender: a rank that waits for a peer which has not sent
// yet (so has made no ring) wakes when the ring appears with its message.
func TestReceiverBeforeSender(t *testing.T) {
	eps := world(t, 2, Config{SlotSize: 256, SlotCount: 2})
	got := make(chan error, 1)
	go func() {
		buf := make([]byte, 256)
		n, tag, err := recv(eps[1], 0, buf)
		if err == nil && (string(buf[:n]) != "late" || tag != 5) {
			err = errors.New("wrong message: " + string(buf[:n]))
		}
		got <- err
	}()
	time.Sleep(30 * time.Millisecond) // let the receiver sleep on its bell
	if err := send(eps[0], 1, []byte("late"), 5); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// TestSendThenCloseBeforeReceiverExists: what a rank sent before it closed
// is read by a peer that asks for its receiver only afterwards, and the
// close comes after it.
func TestSendThenCloseBeforeReceiverExists(t *testing.T) {
	for _, early := range []bool{false, true} {
		eps := world(t, 2, Config{SlotSize: 256, SlotCount: 4})
		if early {
			if _, err := eps[1].Receiver(0); err != nil {
				t.Fatal(err)
			}
		}
		for i, m := range []string{"a", "bb"} {
			if err := send(eps[0], 1, []byte(m), transport.Tag(i)); err != nil {
				t.Fatal(err)
			}
		}
		eps[0].Close()
		buf := make([]byte, 256)
		for i, m := range []string{"a", "bb"} {
			n, tag, err := recv(eps[1], 0, buf)
			if err != nil || string(buf[:n]) != m || tag != transport.Tag(i) {
				t.Fatalf("early receiver %v: message %d: %q tag %d %v", early, i, buf[:n], tag, err)
			}
		}
		_, _, err := recv(eps[1], 0, buf)
		var pe *transport.PeerError
		if !errors.Is(err, transport.ErrPeerClosed) || !errors.As(err, &pe) || pe.Peer != 0 {
			t.Fatalf("early receiver %v: after the drain: %v", early, err)
		}
	}
}

// TestSendAndCloseWhileReceiverLooks: a peer that makes its ring, sends and
// closes while the receiver is between its look at the peer's state and its
// look for the ring (the receiver asked before the ring existed) still has
// its message read before its closing is reported. Found by
// comm's TestNestedSplitsDoNotCollide under load: a 2-rank child's
// all-reduce failed on one rank with ErrPeerClosed while the peer, done,
// had closed.
func TestSendAndCloseWhileReceiverLooks(t *testing.T) {
	eps := world(t, 2, Config{SlotSize: 256, SlotCount: 4})
	r, err := eps[1].Receiver(0)
	if err != nil {
		t.Fatal(err)
	}
	var hookErr error
	testHookNotReady = func() {
		testHookNotReady = nil
		hookErr = send(eps[0], 1, []byte("last words"), 7)
		eps[0].Close()
	}
	t.Cleanup(func() { testHookNotReady = nil })
	m, tag, ok, err := r.TryNext()
	if hookErr != nil {
		t.Fatal(hookErr)
	}
	if !ok || err != nil || string(m) != "last words" || tag != 7 {
		t.Fatalf("first look: %q tag %d ok=%v err=%v, want the message", m, tag, ok, err)
	}
	r.Release()
	if _, _, _, err := r.TryNext(); !errors.Is(err, transport.ErrPeerClosed) {
		t.Fatalf("after the message: %v, want ErrPeerClosed", err)
	}
}
