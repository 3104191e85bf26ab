package tcp

import (
	"runtime"
	"testing"

	"github.com/gccl/gccl/transport"
)

// TestSteadyStateAllocatesNothing sends messages both ways from one
// goroutine, spinning on TryNext as the executor does, and counts heap
// allocations per round trip after warm-up.
func TestSteadyStateAllocatesNothing(t *testing.T) {
	eps := connectWorld(t, 2, testConfig(stripeMin*2, 2, 2))
	s01, _ := eps[0].Sender(1)
	s10, _ := eps[1].Sender(0)
	r01, _ := eps[1].Receiver(0)
	r10, _ := eps[0].Receiver(1)
	hop := func(s transport.Sender, r transport.Receiver, n int) {
		b, ok, err := s.TryReserve(n)
		for !ok && err == nil {
			b, ok, err = s.TryReserve(n)
		}
		if err != nil {
			t.Fatal(err)
		}
		b[0] = 1
		s.Commit(3)
		for {
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
		}
	}
	for _, n := range []int{8, 64 << 10, stripeMin * 2} {
		round := func() {
			hop(s01, r01, n)
			hop(s10, r10, n)
			eps[0].Sender(1)
			eps[0].Receiver(1)
		}
		for range 50 {
			round()
		}
		if a := testing.AllocsPerRun(500, round); a != 0 {
			t.Errorf("%d-byte messages: %v allocations per round trip", n, a)
		}
	}
}

// TestSleepPathAllocatesNothing covers the other way a message arrives:
// the receiver announces a sleep (PrepareWait arms its socket), and the
// watcher reads the message and rings the bell.
func TestSleepPathAllocatesNothing(t *testing.T) {
	eps := connectWorld(t, 2, testConfig(64<<10, 2, 2))
	s, _ := eps[0].Sender(1)
	r, _ := eps[1].Receiver(0)
	round := func() {
		seen := eps[1].Seq()
		eps[1].PrepareWait()
		b, ok, err := s.TryReserve(100)
		if !ok || err != nil {
			t.Fatalf("reserve: %v %v", ok, err)
		}
		b[0] = 1
		s.Commit(1)
		// Wait for the watcher to take the message, without polling.
		for eps[1].Seq() == seen {
			runtime.Gosched()
		}
		if _, _, ok, err := r.TryNext(); !ok || err != nil {
			t.Fatalf("next after the bell: %v %v", ok, err)
		}
		r.Release()
	}
	for range 50 {
		round()
	}
	if a := testing.AllocsPerRun(300, round); a != 0 {
		t.Errorf("%v allocations per message on the sleep path", a)
	}
}
