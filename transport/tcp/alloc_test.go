package tcp

import (
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
