package ibverbs

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/gccl/gccl/transport"
)

// TestPingPong times 8-byte round trips between two ranks of this process,
// spinning and sleeping (diagnostics: it checks nothing but the data).
func TestPingPong(t *testing.T) {
	w := connectWorld(t, worldConfig{n: 2, slotSize: 4096, slotCount: 4}, false)
	for _, sleep := range []bool{false, true} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			echo(w.eps[1], 0, 1000, sleep)
		}()
		var rtts []time.Duration
		s, _ := w.eps[0].Sender(1)
		r, _ := w.eps[0].Receiver(1)
		for i := range 1000 {
			start := time.Now()
			sendWait(w.eps[0], s, i, sleep)
			recvWait(w.eps[0], r, sleep)
			rtts = append(rtts, time.Since(start))
		}
		<-done
		sort.Slice(rtts, func(i, j int) bool { return rtts[i] < rtts[j] })
		t.Logf("sleep=%v: round trip min %v median %v p90 %v", sleep, rtts[0], rtts[len(rtts)/2], rtts[len(rtts)*9/10])
	}
}

func echo(e *Endpoint, peer, n int, sleep bool) {
	s, _ := e.Sender(peer)
	r, _ := e.Receiver(peer)
	for i := range n {
		recvWait(e, r, sleep)
		sendWait(e, s, i, sleep)
	}
}

func sendWait(e *Endpoint, s transport.Sender, i int, sleep bool) {
	for {
		seen := e.Seq()
		b, ok, err := s.TryReserve(8)
		if err != nil {
			panic(err)
		}
		if ok {
			b[0] = byte(i)
			s.Commit(transport.Tag(i))
			return
		}
		if sleep {
			e.Wait(context.Background(), seen, time.Time{})
		}
	}
}

func recvWait(e *Endpoint, r transport.Receiver, sleep bool) {
	for {
		seen := e.Seq()
		_, _, ok, err := r.TryNext()
		if err != nil {
			panic(err)
		}
		if ok {
			r.Release()
			return
		}
		if sleep {
			e.Wait(context.Background(), seen, time.Time{})
		}
	}
}
