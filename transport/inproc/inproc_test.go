package inproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/gccl/gccl/transport"
)

func mustWorld(t *testing.T, n int) *World {
	t.Helper()
	w, err := NewWorld(n, 64, 2)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// mustLink returns the two ends of the ring from rank 0 to rank 1 of w.
func mustLink(t *testing.T, w *World) (transport.Sender, transport.Receiver) {
	t.Helper()
	s, err := w.Endpoint(0).Sender(1)
	if err != nil {
		t.Fatal(err)
	}
	r, err := w.Endpoint(1).Receiver(0)
	if err != nil {
		t.Fatal(err)
	}
	return s, r
}

func TestRingFIFOAndBackpressure(t *testing.T) {
	w := mustWorld(t, 2)
	s, r := mustLink(t, w)
	if _, _, ok, _ := r.TryNext(); ok {
		t.Fatal("message on an empty ring")
	}
	for i := 0; i < 2; i++ {
		b, ok, err := s.TryReserve(3)
		if !ok || err != nil {
			t.Fatalf("reserve %d: ok=%v err=%v", i, ok, err)
		}
		copy(b, []byte{byte(i), 1, 2})
		s.Commit(transport.MakeTag(7, uint64(i)))
	}
	if _, ok, _ := s.TryReserve(3); ok {
		t.Fatal("reserved a third slot of a two-slot ring")
	}
	for i := 0; i < 2; i++ {
		m, tag, ok, err := r.TryNext()
		if !ok || err != nil {
			t.Fatalf("next %d: ok=%v err=%v", i, ok, err)
		}
		if !bytes.Equal(m, []byte{byte(i), 1, 2}) || tag.Kind() != 7 || tag.Seq() != uint64(i) {
			t.Fatalf("message %d = %v tag %x", i, m, tag)
		}
		r.Release()
	}
	if _, ok, _ := s.TryReserve(64); !ok {
		t.Fatal("slot not freed by Release")
	}
	if _, _, err := s.TryReserve(65); err == nil {
		t.Fatal("message larger than a slot accepted")
	}
}

func TestWaitWakesOnCommitAndClose(t *testing.T) {
	w := mustWorld(t, 2)
	ep1 := w.Endpoint(1)
	r, _ := ep1.Receiver(0)
	seen := ep1.Seq()
	go func() {
		s, _ := w.Endpoint(0).Sender(1)
		b, _, _ := s.TryReserve(1)
		b[0] = 42
		s.Commit(0)
	}()
	for {
		if m, _, ok, _ := r.TryNext(); ok {
			if m[0] != 42 {
				t.Fatalf("got %d", m[0])
			}
			r.Release()
			break
		}
		if err := ep1.Wait(context.Background(), seen, time.Now().Add(10*time.Second)); err != nil {
			t.Fatal(err)
		}
		seen = ep1.Seq()
	}

	// Closing rank 0 wakes rank 1 and surfaces a PeerError naming rank 0.
	seen = ep1.Seq()
	go w.Endpoint(0).Abort(errors.New("boom"))
	for {
		_, _, ok, err := r.TryNext()
		if ok {
			t.Fatal("unexpected message")
		}
		if err != nil {
			var pe *transport.PeerError
			if !errors.As(err, &pe) || pe.Peer != 0 || !errors.Is(err, transport.ErrPeerClosed) {
				t.Fatalf("err = %v", err)
			}
			break
		}
		if err := ep1.Wait(context.Background(), seen, time.Now().Add(10*time.Second)); err != nil {
			t.Fatal(err)
		}
		seen = ep1.Seq()
	}
	if _, err := w.Endpoint(0).Sender(1); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("closed endpoint made a sender: %v", err)
	}
	s1, err := ep1.Sender(0)
	if err == nil {
		_, _, err = s1.TryReserve(1)
	}
	if !errors.Is(err, transport.ErrPeerClosed) {
		t.Fatalf("send to a closed peer: %v", err)
	}
}

func TestWaitHonoursDeadlineAndContext(t *testing.T) {
	w := mustWorld(t, 2)
	ep := w.Endpoint(0)
	if err := ep.Wait(context.Background(), ep.Seq(), time.Now().Add(time.Millisecond)); !errors.Is(err, transport.ErrTimeout) {
		t.Fatalf("deadline: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ep.Wait(ctx, ep.Seq(), time.Time{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: %v", err)
	}
}

func TestBadPeer(t *testing.T) {
	w := mustWorld(t, 2)
	for _, p := range []int{-1, 0, 2} {
		if _, err := w.Endpoint(0).Sender(p); err == nil {
			t.Errorf("sender to peer %d accepted", p)
		}
	}
	if _, err := NewWorld(0, 0, 0); err == nil {
		t.Error("world of 0 ranks accepted")
	}
	if _, err := NewWorld(2, 0, 1); err == nil {
		t.Error("one slot per ring accepted; fused ring steps need two")
	}
}

func TestSteadyStateAllocatesNothing(t *testing.T) {
	w := mustWorld(t, 2)
	s, _ := w.Endpoint(0).Sender(1)
	r, _ := w.Endpoint(1).Receiver(0)
	a := testing.AllocsPerRun(1000, func() {
		b, _, _ := s.TryReserve(8)
		b[0] = 1
		s.Commit(1)
		r.TryNext()
		r.Release()
		w.Endpoint(0).Sender(1)
	})
	if a != 0 {
		t.Fatalf("%v allocations per message", a)
	}
}

// TestClosedSendersMessagesAreDelivered: what a rank committed before it
// closed reaches its peer, also when the peer first asks for the connection
// after the close; then the peer learns that the rank is gone.
func TestClosedSendersMessagesAreDelivered(t *testing.T) {
	w := mustWorld(t, 3)
	s, err := w.Endpoint(0).Sender(1)
	if err != nil {
		t.Fatal(err)
	}
	b, ok, err := s.TryReserve(3)
	if !ok || err != nil {
		t.Fatalf("reserve: ok=%v err=%v", ok, err)
	}
	copy(b, "abc")
	s.Commit(7)
	w.Endpoint(0).Close()

	r, err := w.Endpoint(1).Receiver(0)
	if err != nil {
		t.Fatalf("receiver from a closed rank that sent first: %v", err)
	}
	m, tag, ok, err := r.TryNext()
	if !ok || err != nil || string(m) != "abc" || tag != 7 {
		t.Fatalf("TryNext = %q, %v, %v, %v; want the message sent before the close", m, tag, ok, err)
	}
	r.Release()
	if _, _, _, err := r.TryNext(); !errors.Is(err, transport.ErrPeerClosed) {
		t.Fatalf("after the last message: %v, want ErrPeerClosed", err)
	}
	// Nothing was ever sent on these: they are dead at once.
	if _, err := w.Endpoint(2).Receiver(0); !errors.Is(err, transport.ErrPeerClosed) {
		t.Fatalf("receiver from a closed rank that sent nothing: %v, want ErrPeerClosed", err)
	}
	if _, err := w.Endpoint(1).Sender(0); !errors.Is(err, transport.ErrPeerClosed) {
		t.Fatalf("sender to a closed rank: %v, want ErrPeerClosed", err)
	}
}

// TestCommitThenCloseRace: a rank that commits its last message and closes
// at once, while its peer polls, never loses that message. The receiver's
// load of the ring's tail and its look at the peer's state are two steps; a
// commit and close between them once read as a closed, empty ring.
func TestCommitThenCloseRace(t *testing.T) {
	for i := range 20000 {
		w := mustWorld(t, 2)
		s, r := mustLink(t, w)
		go func() {
			b, ok, err := s.TryReserve(1)
			if !ok || err != nil {
				panic(fmt.Sprintf("reserve: ok=%v err=%v", ok, err))
			}
			b[0] = 'x'
			s.Commit(1)
			w.Endpoint(0).Close()
		}()
		for {
			m, _, ok, err := r.TryNext()
			if err != nil {
				t.Fatalf("run %d: %v before the message committed ahead of the close", i, err)
			}
			if ok {
				if string(m) != "x" {
					t.Fatalf("run %d: got %q", i, m)
				}
				r.Release()
				break
			}
			runtime.Gosched() // one P: let the sender run
		}
		// The close may not have landed yet: poll until it does.
		var err2 error
		for err2 == nil {
			runtime.Gosched()
			_, _, _, err2 = r.TryNext()
		}
		if !errors.Is(err2, transport.ErrPeerClosed) {
			t.Fatalf("run %d: after the message: %v, want ErrPeerClosed", i, err2)
		}
		w.Endpoint(1).Close()
	}
}
