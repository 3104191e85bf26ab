package tcp

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gccl/gccl/transport"
)

// testTLS turns TLS on in testConfig (TestTLSRunsTheSuite).
var testTLS bool

// testToken is the job token of the test worlds.
var testToken = []byte("0123456789abcdef")

// testConfig is a small configuration over loopback.
func testConfig(slotSize, slotCount, streams int) Config {
	return Config{SlotSize: slotSize, SlotCount: slotCount, Streams: streams, IfName: "=lo", Token: testToken, TLS: testTLS}
}

// connectWorld connects n ranks of this process with each other, each with
// its own doorbell, and closes them when the test ends (checking that no
// goroutine of theirs survives).
func connectWorld(t testing.TB, n int, cfg Config) []*Endpoint {
	t.Helper()
	ls := make([]*Listener, n)
	addrs := make([]string, n)
	pins := make([]string, n)
	for r := range ls {
		c := cfg
		c.Bell = transport.NewDoorbell()
		l, err := Listen(r, n, c)
		if err != nil {
			t.Fatal(err)
		}
		ls[r], addrs[r], pins[r] = l, l.Addr(), l.Pin()
	}
	eps := make([]*Endpoint, n)
	errs := make([]error, n)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for r := range ls {
		var peers []int
		for p := 0; p < n; p++ {
			if p != r {
				peers = append(peers, p)
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			eps[r], errs[r] = ls[r].ConnectPinned(ctx, peers, addrs, pins)
		}()
	}
	wg.Wait()
	for r, l := range ls {
		l.Close()
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
	}
	t.Cleanup(func() {
		for _, e := range eps {
			e.Close()
		}
		checkNoGoroutines(t)
	})
	return eps
}

// checkNoGoroutines fails if a goroutine of this package's endpoints or
// listeners is still running.
func checkNoGoroutines(t testing.TB) {
	t.Helper()
	var stacks string
	for i := 0; i < 200; i++ {
		buf := make([]byte, 1<<20)
		stacks = string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "tcp.(*Endpoint).watch") && !strings.Contains(stacks, "tcp.(*connector)") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("goroutines leaked:\n%s", stacks)
}

const testTimeout = 20 * time.Second

// send reserves a slot to peer, fills it with payload and commits it,
// sleeping on the endpoint while every slot is in use.
func send(t testing.TB, e *Endpoint, peer int, payload []byte, tag transport.Tag) {
	t.Helper()
	if err := trySend(e, peer, payload, tag); err != nil {
		t.Fatal(err)
	}
}

func trySend(e *Endpoint, peer int, payload []byte, tag transport.Tag) error {
	s, err := e.Sender(peer)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(testTimeout)
	for {
		seen := e.Seq()
		b, ok, err := s.TryReserve(len(payload))
		if err != nil {
			return err
		}
		if ok {
			copy(b, payload)
			s.Commit(tag)
			return nil
		}
		if err := e.Wait(context.Background(), seen, deadline); err != nil {
			return fmt.Errorf("rank %d waiting for a slot to %d: %w", e.Rank(), peer, err)
		}
	}
}

// recv returns a copy of the next message from peer, sleeping on the
// endpoint until it arrives.
func recv(t testing.TB, e *Endpoint, peer int) ([]byte, transport.Tag) {
	t.Helper()
	m, tag, err := tryRecv(e, peer)
	if err != nil {
		t.Fatal(err)
	}
	return m, tag
}

func tryRecv(e *Endpoint, peer int) ([]byte, transport.Tag, error) {
	r, err := e.Receiver(peer)
	if err != nil {
		return nil, 0, err
	}
	deadline := time.Now().Add(testTimeout)
	for {
		seen := e.Seq()
		m, tag, ok, err := r.TryNext()
		if err != nil {
			return nil, 0, err
		}
		if ok {
			out := bytes.Clone(m)
			r.Release()
			return out, tag, nil
		}
		if err := e.Wait(context.Background(), seen, deadline); err != nil {
			return nil, 0, fmt.Errorf("rank %d waiting for a message from %d: %w", e.Rank(), peer, err)
		}
	}
}

// pattern is the test payload of message seq from src: n bytes that differ
// between messages and positions.
func pattern(src, seq, n int) []byte {
	b := make([]byte, n)
	x := uint32(src*7919 + seq*104729 + 1)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

// pump sends sizes[i]-byte messages i = 0, 1, ... to peer and checks the
// same sequence coming back from it, from one goroutine, the way a rank's
// executor works: progress on whichever side can move, sleep on the
// endpoint when neither can. gate, if not nil, limits when each side may
// move, to create backpressure.
func pump(ep transport.Endpoint, rank, peer int, sizes []int, gate func(sent, got int) (send, recv bool)) error {
	s, err := ep.Sender(peer)
	if err != nil {
		return err
	}
	rc, err := ep.Receiver(peer)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(testTimeout)
	sent, got := 0, 0
	for sent < len(sizes) || got < len(sizes) {
		seen := ep.Seq()
		canSend, canRecv := true, true
		if gate != nil {
			canSend, canRecv = gate(sent, got)
		}
		progress := false
		if sent < len(sizes) && canSend {
			n := sizes[sent]
			b, ok, err := s.TryReserve(n)
			if err != nil {
				return err
			}
			if ok {
				copy(b, pattern(rank, sent, n))
				s.Commit(transport.MakeTag(uint8(rank+1), uint64(sent)))
				sent++
				progress = true
			}
		}
		if got < len(sizes) && canRecv {
			m, tag, ok, err := rc.TryNext()
			if err != nil {
				return err
			}
			if ok {
				n := sizes[got]
				if want := transport.MakeTag(uint8(peer+1), uint64(got)); tag != want || !bytes.Equal(m, pattern(peer, got, n)) {
					return fmt.Errorf("rank %d message %d from %d: tag %#x, %d bytes; want tag %#x, %d bytes of the pattern", rank, got, peer, uint64(tag), len(m), uint64(want), n)
				}
				rc.Release()
				got++
				progress = true
			}
		}
		if !progress {
			if err := ep.Wait(context.Background(), seen, deadline); err != nil {
				return fmt.Errorf("rank %d after %d sent, %d received: %w", rank, sent, got, err)
			}
		}
	}
	return nil
}
