package shm

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/gccl/gccl/transport"
)

// TestMemoryGrowsWithPeersUsed: a rank's mailbox holds its header and one
// ring per peer it sent to, whatever the size of the job; the file on
// /dev/shm is exactly that big.
func TestMemoryGrowsWithPeersUsed(t *testing.T) {
	const n = 8
	cfg := Config{SlotSize: 4096, SlotCount: 4}
	eps := world(t, n, cfg)
	g, err := newGeometry(cfg.SlotSize, cfg.SlotCount, n)
	if err != nil {
		t.Fatal(err)
	}
	for r, ep := range eps {
		if got := ep.mb.Bytes(); got != int64(g.headerSize) {
			t.Fatalf("rank %d holds %d bytes after Connect, want its header only (%d)", r, got, g.headerSize)
		}
	}
	// Rank 0 sends to 1 and 2; rank 1 answers 0; the others only exist.
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
	want := []int{2, 1, 0, 0, 0, 0, 0, 0}
	for r, ep := range eps {
		if got, w := ep.mb.Bytes(), g.size(want[r]); got != w {
			t.Errorf("rank %d holds %d bytes, want header and %d rings (%d)", r, got, want[r], w)
		}
		var st os.FileInfo
		if st, err = os.Stat(ep.mb.path); err == nil && st.Size() != g.size(want[r]) {
			t.Errorf("rank %d's mailbox file is %d bytes, want %d", r, st.Size(), g.size(want[r]))
		}
	}
	buf := make([]byte, 8)
	for _, c := range []struct{ to, from int }{{1, 0}, {2, 0}, {0, 1}} {
		if n, _, err := recv(eps[c.to], c.from, buf); err != nil || n != 1 {
			t.Fatalf("rank %d from %d: %q %v", c.to, c.from, buf[:n], err)
		}
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
