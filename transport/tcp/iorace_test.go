package tcp

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gccl/gccl/transport"
)

// A message may come back around a ring into the memory it was sent from,
// the way an in-place all-reduce sends a block's partial sum and receives
// its final value: rank 0 posts a receive from rank 2 into buf and sends
// buf by reference to rank 1, which passes it on to rank 2, which sends it
// back; each pass increments every byte. The kernel orders the send's read
// of buf before the answer's write into it, but nothing the race detector
// sees does unless the transport says so (raceSent, raceReceived): the
// send's goroutine never meets the watcher that lands the answer. Under
// -race this checks that it does; everywhere, that the answer lands where
// it was posted.
func TestAnswerLandsInSentMemory(t *testing.T) {
	eps := connectWorld(t, 3, testConfig(1<<20, 4, 1))
	// 32 KiB goes out in one write, so the sending goroutine is done with
	// the socket; 1 MiB leaves the rest to the watcher.
	for round := range 10 {
		n := 32 << 10
		if round%2 == 1 {
			n = 1 << 20
		}
		buf := pattern(0, round, n)
		want := bytes.Clone(buf)
		for i := range want {
			want[i] += 2
		}
		errc := make(chan error, 2)
		for r := 1; r <= 2; r++ {
			go func() {
				m, tag, err := tryRecv(eps[r], r-1)
				if err == nil {
					for i := range m {
						m[i]++
					}
					err = trySend(eps[r], (r+1)%3, m, tag)
				}
				errc <- err
			}()
		}

		r, err := eps[0].Receiver(2)
		if err != nil {
			t.Fatal(err)
		}
		if !r.(transport.PostReceiver).Post(0, buf) {
			t.Fatal("post refused")
		}
		s, err := eps[0].Sender(1)
		if err != nil {
			t.Fatal(err)
		}
		rs := s.(transport.RefSender)
		// The send runs on its own goroutine once rank 0 sleeps.
		sent := make(chan error, 1)
		go func() {
			time.Sleep(time.Millisecond)
			ok, err := rs.TrySendRef(buf, transport.Tag(round))
			if !ok && err == nil {
				err = errors.New("no room for a send by reference")
			}
			sent <- err
		}()
		deadline := time.Now().Add(testTimeout)
		for {
			seen := eps[0].Seq()
			m, _, ok, err := r.TryNext()
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				if &m[0] != &buf[0] {
					t.Fatalf("round %d: the answer did not land in the posted buffer", round)
				}
				r.Release()
				break
			}
			if err := eps[0].Wait(context.Background(), seen, deadline); err != nil {
				t.Fatal(err)
			}
		}
		if err := <-sent; err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for range 2 {
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(buf, want) {
			t.Fatalf("round %d: the answer landed wrong", round)
		}
		if ok, err := rs.Flushed(); !ok || err != nil {
			t.Fatalf("round %d: not flushed after the answer: %v, %v", round, ok, err)
		}
	}
}
