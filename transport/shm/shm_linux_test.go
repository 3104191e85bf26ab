package shm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gccl/gccl/transport"
)

func TestFIFOOrderTagsAndSizes(t *testing.T) {
	const slot = 256
	eps := world(t, 2, Config{SlotSize: slot, SlotCount: 4})
	sizes := []int{0, 1, 7, inlineMax, inlineMax + 1, 63, 64, 65, 129, slot - 1, slot}
	const n = 2000
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, slot)
		for i := 0; i < n; i++ {
			m := buf[:sizes[i%len(sizes)]]
			fill(m, i)
			if err := send(eps[0], 1, m, transport.MakeTag(5, uint64(i))); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	buf := make([]byte, slot)
	for i := 0; i < n; i++ {
		got, tag, err := recv(eps[1], 0, buf)
		if err != nil {
			t.Fatal(err)
		}
		if want := sizes[i%len(sizes)]; got != want {
			t.Fatalf("message %d: %d bytes, want %d", i, got, want)
		}
		if tag.Kind() != 5 || tag.Seq() != uint64(i) {
			t.Fatalf("message %d: tag kind %d seq %d", i, tag.Kind(), tag.Seq())
		}
		if !check(buf[:got], i) {
			t.Fatalf("message %d: corrupt payload", i)
		}
	}
	wg.Wait()
}

func TestBackpressure(t *testing.T) {
	eps := world(t, 2, Config{SlotSize: 256, SlotCount: 2})
	s, _ := eps[0].Sender(1)
	r, _ := eps[1].Receiver(0)
	if _, _, ok, err := r.TryNext(); ok || err != nil {
		t.Fatalf("empty ring: ok=%v err=%v", ok, err)
	}
	// Messages too long for a slot's line take its data slot: two fill
	// a two-slot ring.
	const long = inlineMax + 1
	for i := 0; i < 2; i++ {
		b, ok, err := s.TryReserve(long)
		if !ok || err != nil {
			t.Fatalf("reserve %d: ok=%v err=%v", i, ok, err)
		}
		copy(b, []byte{byte(i), 1, 2})
		s.Commit(transport.Tag(i))
	}
	if _, ok, err := s.TryReserve(long); ok || err != nil {
		t.Fatalf("third slot of a full two-slot ring: ok=%v err=%v", ok, err)
	}
	// Holding the first message (as a fused step does) frees nothing.
	m, _, ok, _ := r.TryNext()
	if !ok || len(m) != long || !bytes.Equal(m[:3], []byte{0, 1, 2}) {
		t.Fatalf("first message %v ok=%v", m, ok)
	}
	if _, ok, _ := s.TryReserve(long); ok {
		t.Fatal("reserved a slot the receiver still holds")
	}
	r.Release()
	if _, ok, _ := s.TryReserve(256); !ok {
		t.Fatal("slot not freed by Release")
	}
	if _, _, err := s.TryReserve(257); err == nil {
		t.Fatal("message larger than a slot accepted")
	}
	if _, _, err := s.TryReserve(-1); err == nil {
		t.Fatal("negative length accepted")
	}
}

// TestSmallAreaRunsAhead: where slots are larger than smallMax, a message
// too long for its line but not for a small data area needs its line and
// its small area, free once the message minSmall back is released, not a
// data slot; one longer still waits for its data slot. A stream of sizes
// around both limits over many laps arrives intact and in order.
func TestSmallAreaRunsAhead(t *testing.T) {
	eps := world(t, 2, Config{SlotSize: 4096, SlotCount: 2})
	s, _ := eps[0].Sender(1)
	r, _ := eps[1].Receiver(0)
	for i := range minSmall {
		b, ok, err := s.TryReserve(smallMax)
		if !ok || err != nil {
			t.Fatalf("message %d of %d bytes, %d small areas: ok=%v err=%v", i, smallMax, minSmall, ok, err)
		}
		b[0], b[smallMax-1] = byte(i), byte(i+1)
		s.Commit(transport.Tag(i))
	}
	for _, n := range []int{inlineMax + 1, smallMax, smallMax + 1} {
		if _, ok, err := s.TryReserve(n); ok || err != nil {
			t.Fatalf("a %d-byte message with every small area taken: ok=%v err=%v", n, ok, err)
		}
	}
	// A message that fits in its line still has lines to spare.
	if _, ok, err := s.TryReserve(8); !ok || err != nil {
		t.Fatalf("an 8-byte message with lines free: ok=%v err=%v", ok, err)
	}
	for i := range minSmall {
		m, tag, ok, err := r.TryNext()
		if !ok || err != nil || len(m) != smallMax || m[0] != byte(i) || m[smallMax-1] != byte(i+1) || tag != transport.Tag(i) {
			t.Fatalf("message %d: len %d tag %d ok=%v err=%v", i, len(m), tag, ok, err)
		}
		r.Release()
	}

	streamSizes(t, s, r, 5000, 3, []int{1, inlineMax, inlineMax + 1, smallMax, smallMax + 1, 4096, 0, 700, 8, smallMax - 1})
}

// streamSizes sends n messages of sizes[i % len(sizes)] bytes, each byte
// numbered, from s to r, the receiver a random distance behind (seeded),
// and checks that every one arrives intact and in order.
func streamSizes(t *testing.T, s transport.Sender, r transport.Receiver, n int, seed uint64, sizes []int) {
	t.Helper()
	size := func(i int) int { return sizes[i%len(sizes)] }
	sent, got := 0, 0
	rng := rand.New(rand.NewPCG(seed, seed+1))
	for got < n {
		for k := rng.IntN(70); k > 0 && sent < n; k-- {
			b, ok, err := s.TryReserve(size(sent))
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			for j := range b {
				b[j] = byte(sent + j)
			}
			s.Commit(transport.Tag(sent))
			sent++
		}
		for k := rng.IntN(70); k > 0 && got < sent; k-- {
			m, tag, ok, err := r.TryNext()
			if !ok || err != nil || tag != transport.Tag(got) || len(m) != size(got) {
				t.Fatalf("message %d: tag %d len %d ok=%v err=%v", got, tag, len(m), ok, err)
			}
			for j := range m {
				if m[j] != byte(got+j) {
					t.Fatalf("message %d: byte %d is %d", got, j, m[j])
				}
			}
			r.Release()
			got++
		}
	}
}

// TestSmallMessagesUseEveryLine: a message that fits in a slot's line
// needs only a free line, so tiny messages run up to lineCount ahead of the
// receiver; one that needs a data slot still waits for the message
// slotCount back. Interleaved, across several laps of the lines and the
// data slots (whose indexes differ), every message arrives intact and in
// order.
func TestSmallMessagesUseEveryLine(t *testing.T) {
	eps := world(t, 2, Config{SlotSize: 256, SlotCount: 2})
	s, _ := eps[0].Sender(1)
	r, _ := eps[1].Receiver(0)
	for i := range minLines {
		b, ok, err := s.TryReserve(8)
		if !ok || err != nil {
			t.Fatalf("small message %d of %d lines: ok=%v err=%v", i, minLines, ok, err)
		}
		b[0] = byte(i)
		s.Commit(transport.Tag(i))
	}
	if _, ok, err := s.TryReserve(8); ok || err != nil {
		t.Fatalf("a small message past %d lines: ok=%v err=%v", minLines, ok, err)
	}
	if _, ok, err := s.TryReserve(inlineMax + 1); ok || err != nil {
		t.Fatalf("a long message with every line taken: ok=%v err=%v", ok, err)
	}
	for i := range minLines - 1 {
		m, tag, ok, err := r.TryNext()
		if !ok || err != nil || len(m) != 8 || m[0] != byte(i) || tag != transport.Tag(i) {
			t.Fatalf("small message %d: %v %v %v %v", i, m, tag, ok, err)
		}
		r.Release()
	}
	// One small message is outstanding: a long one may take the data slot
	// of the message two back, which was released.
	if _, ok, _ := s.TryReserve(inlineMax + 1); !ok {
		t.Fatal("a long message refused with its data slot free")
	}

	// Now a stream of sizes around the line's capacity over many laps,
	// the receiver a random distance behind.
	eps = world(t, 2, Config{SlotSize: 256, SlotCount: 3})
	s, _ = eps[0].Sender(1)
	r, _ = eps[1].Receiver(0)
	streamSizes(t, s, r, 5000, 1, []int{1, inlineMax, inlineMax + 1, 8, 256, 0, 39, 200})
}

func TestBidirectionalTraffic(t *testing.T) {
	const slot, n = 512, 3000
	eps := world(t, 3, Config{SlotSize: slot, SlotCount: 3})
	// Every rank sends n messages to each peer and receives n from each,
	// progressing all six directions from one goroutine per rank.
	var wg sync.WaitGroup
	for r, ep := range eps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := exchange(ep, r, len(eps), n, slot); err != nil {
				t.Errorf("rank %d: %v", r, err)
			}
		}()
	}
	wg.Wait()
}

func exchange(ep *Endpoint, me, size, n, slot int) error {
	sent := make([]int, size)
	recvd := make([]int, size)
	left := 2 * n * (size - 1)
	deadline := time.Now().Add(testTimeout)
	for left > 0 {
		seen := ep.Seq()
		progress := false
		for p := 0; p < size; p++ {
			if p == me {
				continue
			}
			if sent[p] < n {
				s, _ := ep.Sender(p)
				b, ok, err := s.TryReserve((sent[p]*13 + me) % (slot + 1))
				if err != nil {
					return err
				}
				if ok {
					fill(b, sent[p]*size+me)
					s.Commit(transport.MakeTag(uint8(me), uint64(sent[p])))
					sent[p]++
					left--
					progress = true
				}
			}
			if recvd[p] < n {
				r, _ := ep.Receiver(p)
				m, tag, ok, err := r.TryNext()
				if err != nil {
					return err
				}
				if ok {
					i := recvd[p]
					if len(m) != (i*13+p)%(slot+1) || !check(m, i*size+p) || tag != transport.MakeTag(uint8(p), uint64(i)) {
						return fmt.Errorf("message %d from rank %d: %d bytes, tag %x, payload ok %v", i, p, len(m), tag, check(m, i*size+p))
					}
					r.Release()
					recvd[p]++
					left--
					progress = true
				}
			}
		}
		if !progress {
			if err := ep.Wait(context.Background(), seen, deadline); err != nil {
				return err
			}
		}
	}
	return nil
}

func TestBellWakesSleeper(t *testing.T) {
	dir := testDir(t)
	mb, err := Create("bell", 0, 1, nil, Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer mb.Close()
	b := mb.Bell()
	seen := b.Seq()
	done := make(chan error, 1)
	go func() { done <- b.Wait(context.Background(), seen, time.Now().Add(testTimeout)) }()
	time.Sleep(20 * time.Millisecond)
	b.Ring()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if b.Seq() == seen {
		t.Fatal("Ring did not change Seq")
	}

	// The deadline and the context end a wait on a silent bell.
	if err := b.Wait(context.Background(), b.Seq(), time.Now().Add(10*time.Millisecond)); !errors.Is(err, transport.ErrTimeout) {
		t.Fatalf("deadline: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(10 * time.Millisecond); cancel() }()
	if err := b.Wait(ctx, b.Seq(), time.Time{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: %v", err)
	}
	// Close wakes a sleeper with ErrClosed.
	go func() { done <- b.Wait(context.Background(), b.Seq(), time.Time{}) }()
	time.Sleep(10 * time.Millisecond)
	b.Close()
	if err := <-done; !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("closed: %v", err)
	}
}

// TestCommitWakesSleepingReceiver races a peer's commit against the
// receiver going to sleep, many times: peers skip the futex when nobody
// sleeps, so a lost wake-up would show as a timeout here.
func TestCommitWakesSleepingReceiver(t *testing.T) {
	eps := world(t, 2, Config{SlotSize: 64, SlotCount: 2})
	const rounds = 300
	go func() {
		for i := 0; i < rounds; i++ {
			if i%3 == 0 {
				time.Sleep(time.Duration(i%7) * 50 * time.Microsecond)
			}
			if err := send(eps[0], 1, []byte{byte(i)}, transport.Tag(i)); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	r, _ := eps[1].Receiver(0)
	for i := 0; i < rounds; i++ {
		for {
			seen := eps[1].Seq()
			m, tag, ok, err := r.TryNext()
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				if m[0] != byte(i) || tag != transport.Tag(i) {
					t.Fatalf("message %d: %v tag %d", i, m, tag)
				}
				r.Release()
				break
			}
			// Sleep at once, without spinning, to exercise the race.
			if err := eps[1].Wait(context.Background(), seen, time.Now().Add(testTimeout)); err != nil {
				t.Fatalf("message %d: %v", i, err)
			}
		}
	}
}

// TestReleaseWakesSleepingSender is the other direction: a sender that
// sleeps on a full ring must be woken by the receiver's Release.
func TestReleaseWakesSleepingSender(t *testing.T) {
	eps := world(t, 2, Config{SlotSize: 64, SlotCount: 2})
	const rounds = 300
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64)
		for i := 0; i < rounds; i++ {
			if i%3 == 0 {
				time.Sleep(time.Duration(i%7) * 50 * time.Microsecond)
			}
			if _, _, err := recv(eps[1], 0, buf); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	s, _ := eps[0].Sender(1)
	for i := 0; i < rounds; i++ {
		for {
			seen := eps[0].Seq()
			b, ok, err := s.TryReserve(1)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				b[0] = byte(i)
				s.Commit(transport.Tag(i))
				break
			}
			if err := eps[0].Wait(context.Background(), seen, time.Now().Add(testTimeout)); err != nil {
				t.Fatalf("message %d: %v", i, err)
			}
		}
	}
	<-done
}

func TestCloseAndAbortReachThePeerAfterDrain(t *testing.T) {
	eps := world(t, 2, Config{SlotSize: 64, SlotCount: 4})
	for i := 0; i < 2; i++ {
		if err := send(eps[0], 1, []byte{byte(i)}, transport.Tag(i)); err != nil {
			t.Fatal(err)
		}
	}
	r, _ := eps[1].Receiver(0)
	seen := eps[1].Seq()
	// A sleeping peer is woken by the abort.
	woke := make(chan error, 1)
	go func() {
		// Wait only runs on the owner goroutine: this test's goroutine is
		// idle meanwhile.
		woke <- eps[1].Wait(context.Background(), seen, time.Now().Add(testTimeout))
	}()
	time.Sleep(10 * time.Millisecond)
	eps[0].Abort(errors.New("boom"))
	if err := <-woke; err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	for i := 0; i < 2; i++ {
		n, tag, err := recv(eps[1], 0, buf)
		if err != nil || n != 1 || buf[0] != byte(i) || tag != transport.Tag(i) {
			t.Fatalf("message %d sent before the abort: n=%d tag=%d err=%v", i, n, tag, err)
		}
	}
	_, _, _, err := r.TryNext()
	wantPeerClosed(t, err, 0, "boom")
	s, _ := eps[1].Sender(0)
	_, _, err = s.TryReserve(1)
	wantPeerClosed(t, err, 0, "boom")

	// The aborted side refuses further use.
	if _, err := eps[0].Sender(1); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Sender after Abort: %v", err)
	}
	if err := eps[0].Wait(context.Background(), 0, time.Time{}); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Wait after Abort: %v", err)
	}
	if err := eps[0].Close(); err != nil {
		t.Fatalf("Close after Abort: %v", err)
	}

	// A plain Close reads as ErrPeerClosed without a reason.
	eps[1].Close()
	if _, err := eps[1].Receiver(0); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Receiver after Close: %v", err)
	}
}

func TestClosedPeerSeenByThirdRank(t *testing.T) {
	eps := world(t, 3, Config{SlotSize: 64, SlotCount: 2})
	eps[2].Close()
	for _, ep := range eps[:2] {
		s, _ := ep.Sender(2)
		_, _, err := s.TryReserve(1)
		wantPeerClosed(t, err, 2, "")
		r, _ := ep.Receiver(2)
		_, _, _, err = r.TryNext()
		wantPeerClosed(t, err, 2, "")
	}
	if err := send(eps[0], 1, []byte("still works"), 1); err != nil {
		t.Fatal(err)
	}
}

// TestOwnAbortWhileReadingPeerReason closes this rank while it reads an
// aborted peer's reason: the peer's header is zeros by then, and the read
// must report this rank closed, not the peer aborted with a reason of NULs
// (seen in a fault soak, where every rank aborts at once).
func TestOwnAbortWhileReadingPeerReason(t *testing.T) {
	eps := world(t, 2, Config{SlotSize: 64, SlotCount: 2})
	// One message first, so that the ring is mapped and the read of the
	// reason is all that stands between TryNext and its answer.
	if err := send(eps[0], 1, []byte{1}, 1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := recv(eps[1], 0, make([]byte, 64)); err != nil {
		t.Fatal(err)
	}
	r, _ := eps[1].Receiver(0)
	eps[0].Abort(errors.New("rendezvous lost"))
	testHookReadingReason = func() { eps[1].Abort(errors.New("own abort")) }
	defer func() { testHookReadingReason = nil }()
	_, _, _, err := r.TryNext()
	if !errors.Is(err, transport.ErrClosed) || errors.Is(err, transport.ErrPeerClosed) {
		t.Fatalf("TryNext while this rank aborts: %v, want ErrClosed", err)
	}
	if strings.ContainsRune(err.Error(), 0) {
		t.Fatalf("error carries NULs: %q", err)
	}
}

// TestAbortWhileInUse aborts an endpoint from another goroutine while its
// owner is inside Try calls: no fault, and the owner sees ErrClosed.
func TestAbortWhileInUse(t *testing.T) {
	eps := world(t, 2, Config{SlotSize: 4096, SlotCount: 4})
	go func() {
		time.Sleep(5 * time.Millisecond)
		eps[1].Abort(errors.New("stop"))
	}()
	s, _ := eps[1].Sender(0)
	r, _ := eps[1].Receiver(0)
	s0, _ := eps[0].Sender(1)
	r0, _ := eps[0].Receiver(1)
	deadline := time.Now().Add(testTimeout)
	for time.Now().Before(deadline) {
		if b, ok, err := s0.TryReserve(4096); ok {
			b[0] = 1
			s0.Commit(1)
		} else if err != nil {
			wantPeerClosed(t, err, 1, "stop")
			break
		}
		if _, _, ok, _ := r0.TryNext(); ok {
			r0.Release()
		}
		b, ok, err := s.TryReserve(4096)
		if err != nil {
			if !errors.Is(err, transport.ErrClosed) {
				t.Fatal(err)
			}
			continue
		}
		if ok {
			clear(b)
			s.Commit(2)
		}
		if _, _, ok, _ := r.TryNext(); ok {
			r.Release()
		}
	}
	if _, _, err := s.TryReserve(1); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("after Abort: %v", err)
	}
}

func TestMuxUsesTheMailboxBell(t *testing.T) {
	dir := testDir(t)
	cfg := Config{SlotSize: 128, SlotCount: 2, Dir: dir}
	mb0, err := Create("mux", 0, 3, []int{1}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	mb1, err := Create("mux", 1, 3, []int{0}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ep0, err := mb0.Connect(ctx, map[int]Peer{1: {Name: mb1.Name(), Pid: os.Getpid()}})
	if err != nil {
		t.Fatal(err)
	}
	ep1, err := mb1.Connect(ctx, map[int]Peer{0: {Name: mb0.Name()}})
	if err != nil {
		t.Fatal(err)
	}
	defer ep1.Close()
	// Rank 2 would be on another host (TCP); here it is unreachable.
	mux, err := transport.NewMux(0, 3, 128, mb0.Bell(), []transport.Endpoint{nil, ep0, nil})
	if err != nil {
		t.Fatal(err)
	}
	defer mux.Close()
	if v := transport.Via(mux, 1); v != "SHM" {
		t.Fatalf("via %q", v)
	}
	if _, err := mux.Sender(2); err == nil {
		t.Fatal("unreachable rank has a sender")
	}
	go func() {
		time.Sleep(10 * time.Millisecond)
		send(ep1, 0, []byte("hi"), 9)
	}()
	r, err := mux.Receiver(1)
	if err != nil {
		t.Fatal(err)
	}
	for {
		seen := mux.Seq()
		m, tag, ok, err := r.TryNext()
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			if string(m) != "hi" || tag != 9 {
				t.Fatalf("%q tag %d", m, tag)
			}
			r.Release()
			break
		}
		if err := mux.Wait(ctx, seen, time.Now().Add(testTimeout)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSteadyStateAllocatesNothing(t *testing.T) {
	eps := world(t, 2, Config{SlotSize: 64, SlotCount: 2})
	s, _ := eps[0].Sender(1)
	r, _ := eps[1].Receiver(0)
	a := testing.AllocsPerRun(1000, func() {
		for _, n := range []int{8, 64} { // inline in the slot's line, and in its data area
			b, _, _ := s.TryReserve(n)
			b[0] = 1
			s.Commit(1)
			r.TryNext()
			r.Release()
		}
		eps[0].Sender(1)
		eps[1].Receiver(0)
		r.TryNext() // empty
		eps[1].Seq()
	})
	if a != 0 {
		t.Fatalf("%v allocations per message", a)
	}
}

func TestSegmentsAre0600(t *testing.T) {
	dir := testDir(t)
	old := unix.Umask(0)
	defer unix.Umask(old)
	mb, err := Create("perm", 0, 2, []int{1}, Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer mb.Close()
	reg, err := AllocIn(dir, "perm", 0, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	for _, p := range []string{mb.Name(), reg.Name()} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode() != 0o600 {
			t.Errorf("%s has mode %v, want -rw-------", p, st.Mode())
		}
	}
	if filepath.Base(mb.Name()) != "gccl-perm-0" || !strings.HasPrefix(filepath.Base(reg.Name()), "gccl-perm-0-buf") {
		t.Errorf("names %s, %s", mb.Name(), reg.Name())
	}
}

// TestFullDevShmFailsAtFirstLargeSend: a mailbox is a header until its
// rank sends, and a slot's data is reserved by the first message that
// needs it; so a /dev/shm too small for it fails there, with an error
// naming the pair, not with a SIGBUS, and small messages still pass.
func TestFullDevShmFailsAtFirstLargeSend(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1M,mode=0700"); err != nil {
		t.Skipf("cannot mount a small tmpfs to simulate a full /dev/shm (%v); needs root or CAP_SYS_ADMIN", err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	for _, sub := range []string{"big", "small"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	big := world(t, 2, Config{SlotSize: 1 << 20, SlotCount: 4, Dir: filepath.Join(dir, "big")})
	if err := send(big[0], 1, []byte("small"), 1); err != nil {
		t.Fatalf("a message in a slot's line on a full tmpfs: %v", err)
	}
	s, err := big[0].Sender(1)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = s.TryReserve(1 << 20) // a full slot, more than the tmpfs has left
	var pe *transport.PeerError
	if err == nil || !strings.Contains(err.Error(), "not enough space") || !errors.As(err, &pe) || pe.Peer != 1 ||
		!strings.Contains(err.Error(), "rank 0 to rank 1") {
		t.Fatalf("first large message on a full tmpfs: %v", err)
	}
	t.Log(err)
	buf := make([]byte, 64)
	if n, _, err := recv(big[1], 0, buf); err != nil || string(buf[:n]) != "small" {
		t.Fatalf("rank 1 received %q, %v", buf[:n], err)
	}
	if _, err := AllocIn(dir, "full", 0, 2<<20); err == nil || !strings.Contains(err.Error(), "not enough space") {
		t.Fatalf("Alloc on a full tmpfs: %v", err)
	}
	// What fits still works.
	small := world(t, 2, Config{SlotSize: 4096, SlotCount: 4, Dir: filepath.Join(dir, "small")})
	if err := send(small[0], 1, make([]byte, 4096), 1); err != nil {
		t.Fatal(err)
	}
}

func TestUnlinkLeavesNoFiles(t *testing.T) {
	dir := testDir(t)
	eps := world(t, 2, Config{SlotSize: 64, SlotCount: 2, Dir: dir})
	if names := dirEntries(t, dir); len(names) != 0 {
		t.Fatalf("after Unlink: %v", names)
	}
	// The memory lives on while mapped.
	if err := send(eps[0], 1, []byte("after unlink"), 3); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, _, err := recv(eps[1], 0, buf); err != nil || string(buf[:n]) != "after unlink" {
		t.Fatalf("%q %v", buf[:n], err)
	}
	// Close unlinks a mailbox whose owner never did.
	mb, err := Create("late", 0, 1, nil, Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := mb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := mb.Unlink(); err != nil {
		t.Fatalf("Unlink after Close: %v", err)
	}
	if names := dirEntries(t, dir); len(names) != 0 {
		t.Fatalf("after Close: %v", names)
	}
}

func TestCleanJob(t *testing.T) {
	dir := testDir(t)
	cfg := Config{SlotSize: 64, SlotCount: 2, Dir: dir}
	for r := 0; r < 3; r++ {
		mb, err := Create("j7", r, 3, nil, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer mb.Close()
	}
	reg, err := AllocIn(dir, "j7", 1, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	other, err := Create("j7-1", 0, 1, nil, cfg) // another job whose name extends this one's
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := os.WriteFile(filepath.Join(dir, "gccl-j7-x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	n, err := CleanJob(dir, "j7")
	if err != nil || n != 4 {
		t.Fatalf("CleanJob removed %d (%v), want 3 mailboxes and 1 region", n, err)
	}
	names := dirEntries(t, dir)
	if strings.Join(names, " ") != "gccl-j7-1-0 gccl-j7-x" {
		t.Fatalf("left %v, want only the other job's mailbox and the unrelated file", names)
	}
	if n, err := CleanJob(dir, "j7"); n != 0 || err != nil {
		t.Fatalf("second CleanJob: %d %v", n, err)
	}
	if _, err := CleanJob(dir, "../etc"); err == nil {
		t.Fatal("job ID with a slash accepted")
	}
}

func TestConnectRejectsMismatches(t *testing.T) {
	dir := testDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	me := os.Getpid()
	cfg := Config{SlotSize: 256, SlotCount: 4, Dir: dir}
	mk := func(job string, rank, size int, peers []int, c Config) *Mailbox {
		t.Helper()
		mb, err := Create(job, rank, size, peers, c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mb.Close() })
		return mb
	}
	connectErr := func(mb *Mailbox, peers map[int]Peer, want string) {
		t.Helper()
		ep, err := mb.Connect(ctx, peers)
		if err == nil {
			ep.Close()
			t.Fatalf("Connect accepted a mismatch (want %q)", want)
		}
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not mention %q", err, want)
		}
	}

	a := mk("geo", 0, 2, []int{1}, cfg)
	b := mk("geo", 1, 2, []int{0}, Config{SlotSize: 512, SlotCount: 4, Dir: dir})
	connectErr(a, map[int]Peer{1: {Name: b.Name(), Pid: me}}, "slot geometry")

	a = mk("ver", 0, 2, []int{1}, cfg)
	b = mk("ver", 1, 2, []int{0}, cfg)
	b.hdr.version = 99
	connectErr(a, map[int]Peer{1: {Name: b.Name(), Pid: me}}, "layout version 99")

	connectErr(a, map[int]Peer{1: {Name: b.Name(), Pid: me}, 3: {Name: "x"}}, "not one of the local peers")
	connectErr(a, map[int]Peer{}, "no mailbox name for local peer 1")

	a = mk("pid", 0, 2, []int{1}, cfg)
	b = mk("pid", 1, 2, []int{0}, cfg)
	connectErr(a, map[int]Peer{1: {Name: b.Name(), Pid: 1}}, "owned by pid")
	connectErr(a, map[int]Peer{1: {Name: a.Name(), Pid: me}}, "belongs to rank 0 of 2, want rank 1")

	// Ranks that disagree on who is local.
	a = mk("tbl", 0, 3, []int{1}, cfg)
	b = mk("tbl", 1, 3, []int{2}, cfg)
	connectErr(a, map[int]Peer{1: {Name: b.Name(), Pid: me}}, "has no ring for rank 0")

	// Not a mailbox at all.
	junk := filepath.Join(dir, "gccl-junk-1")
	if err := os.WriteFile(junk, bytes.Repeat([]byte{0xAB}, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	a = mk("junk", 0, 2, []int{1}, cfg)
	connectErr(a, map[int]Peer{1: {Name: junk, Pid: me}}, "not a gccl mailbox")

	// A mailbox that never appears: Connect gives up with ctx.
	short, cancelShort := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancelShort()
	if _, err := a.Connect(short, map[int]Peer{1: {Name: filepath.Join(dir, "gccl-none-1")}}); err == nil || !errors.Is(err, unix.ENOENT) && !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("missing mailbox: %v", err)
	}

	// After those failures the mailbox still connects.
	os.Remove(junk)
	b = mk("junk", 1, 2, []int{0}, cfg)
	go func() {
		if ep, err := b.Connect(ctx, map[int]Peer{0: {Name: a.Name(), Pid: me}}); err == nil {
			t.Cleanup(func() { ep.Close() })
		}
	}()
	ep, err := a.Connect(ctx, map[int]Peer{1: {Name: b.Name(), Pid: me}})
	if err != nil {
		t.Fatal(err)
	}
	ep.Close()
}

func TestConnectWaitsForALatePeer(t *testing.T) {
	dir := testDir(t)
	cfg := Config{SlotSize: 64, SlotCount: 2, Dir: dir}
	a, err := Create("late", 0, 2, []int{1}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	created := make(chan *Mailbox, 1)
	go func() {
		time.Sleep(30 * time.Millisecond)
		b, err := Create("late", 1, 2, []int{0}, cfg)
		if err != nil {
			t.Error(err)
		}
		created <- b
	}()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	ep, err := a.Connect(ctx, map[int]Peer{1: {Name: mailboxPath(dir, "late", 1), Pid: os.Getpid()}})
	if err != nil {
		t.Fatal(err)
	}
	ep.Close()
	if b := <-created; b != nil {
		b.Close()
	}
}

func TestCreateRejectsBadArguments(t *testing.T) {
	dir := testDir(t)
	for _, c := range []struct {
		job        string
		rank, size int
		peers      []int
		cfg        Config
	}{
		{"", 0, 1, nil, Config{Dir: dir}},
		{"a/b", 0, 1, nil, Config{Dir: dir}},
		{"..", 0, 1, nil, Config{Dir: dir}},
		{"ok", 1, 1, nil, Config{Dir: dir}},
		{"ok", 0, 2, []int{0}, Config{Dir: dir}},
		{"ok", 0, 3, []int{1, 1}, Config{Dir: dir}},
		{"ok", 0, 2, []int{2}, Config{Dir: dir}},
		{"ok", 0, 2, []int{1}, Config{Dir: dir, SlotCount: 1}},
		{"ok", 0, 2, []int{1}, Config{Dir: dir, SlotSize: 8}},
	} {
		if mb, err := Create(c.job, c.rank, c.size, c.peers, c.cfg); err == nil {
			mb.Close()
			t.Errorf("Create(%q, %d, %d, %v, %+v) accepted", c.job, c.rank, c.size, c.peers, c.cfg)
		}
	}
	mb, err := Create("twice", 0, 1, nil, Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer mb.Close()
	if _, err := Create("twice", 0, 1, nil, Config{Dir: dir}); err == nil || !strings.Contains(err.Error(), "CleanJob") {
		t.Fatalf("second Create of one name: %v", err)
	}
}

func TestBadPeer(t *testing.T) {
	eps := world(t, 2, Config{SlotSize: 64, SlotCount: 2})
	for _, p := range []int{-1, 0, 2} {
		if _, err := eps[0].Sender(p); err == nil {
			t.Errorf("sender to peer %d accepted", p)
		}
		if _, err := eps[0].Receiver(p); err == nil {
			t.Errorf("receiver from peer %d accepted", p)
		}
	}
	if eps[0].Name() != "SHM" || eps[0].Rank() != 0 || eps[0].Size() != 2 || eps[0].SlotSize() != 64 {
		t.Fatal("endpoint identity")
	}
}

// TestNoLeaks runs a whole life cycle and checks that no file descriptor,
// shared mapping or file remains.
func TestNoLeaks(t *testing.T) {
	dir := testDir(t)
	fds := countFDs(t)
	goroutines := runtime.NumGoroutine()
	for i := 0; i < 3; i++ {
		mbs := make([]*Mailbox, 2)
		for r := range mbs {
			mb, err := Create(fmt.Sprintf("leak%d", i), r, 2, []int{1 - r}, Config{SlotSize: 4096, SlotCount: 2, Dir: dir})
			if err != nil {
				t.Fatal(err)
			}
			mbs[r] = mb
		}
		var eps []*Endpoint
		for r, mb := range mbs {
			ep, err := mb.Connect(context.Background(), map[int]Peer{1 - r: {Name: mbs[1-r].Name(), Pid: os.Getpid()}})
			if err != nil {
				t.Fatal(err)
			}
			eps = append(eps, ep)
		}
		reg, err := AllocIn(dir, "leak", 0, 8192)
		if err != nil {
			t.Fatal(err)
		}
		peer, err := MapRegion(reg.Name(), 0)
		if err != nil {
			t.Fatal(err)
		}
		send(eps[0], 1, []byte("x"), 1)
		eps[0].Close()
		eps[1].Abort(errors.New("done"))
		reg.Close()
		peer.Close()
	}
	// More goroutines than before is a leak; fewer is another test's
	// goroutine ending meanwhile (seen once under -race in CI).
	for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > goroutines; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Errorf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), goroutines, buf[:runtime.Stack(buf, true)])
			break
		}
	}
	if n := countFDs(t); n != fds {
		t.Errorf("%d file descriptors open, %d before", n, fds)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(maps), dir) {
		t.Errorf("segments still mapped:\n%s", grepLines(string(maps), dir))
	}
	if names := dirEntries(t, dir); len(names) != 0 {
		t.Errorf("files left: %v", names)
	}
}

func countFDs(t *testing.T) int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(es)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestGeometry(t *testing.T) {
	g, err := newGeometry(1000, 3, 2)
	if err != nil {
		t.Fatal(err)
	}
	// The counters and slot lines fill linePages pages, then the slots
	// (3 KiB: one more page).
	if g.lineCount != minLines || g.slotStride != 1024 || g.dataOff != linePages*pageSize || g.ringStride != (linePages+1)*pageSize ||
		g.headerSize != pageSize || g.size(2) != (1+2*(linePages+1))*pageSize {
		t.Fatalf("%+v", g)
	}
	if g.ringOff(1) != (2+linePages)*pageSize {
		t.Fatalf("ring 1 at %d", g.ringOff(1))
	}
	// Slots larger than smallMax: after the lines' pages, minSmall small
	// data areas (32 KiB: 8 pages), then the slots.
	if g, _ := newGeometry(4096, 2, 2); g.smallSize != smallMax || g.smallCount != minSmall || g.smallOff != linePages*pageSize ||
		g.dataOff != (linePages+8)*pageSize || g.ringStride != (linePages+10)*pageSize || g.smallLimit() != smallMax {
		t.Fatalf("4 KiB slots: %+v", g)
	}
	if g.smallSize != 0 || g.smallOff != g.dataOff || g.smallLimit() != inlineMax {
		t.Fatalf("1000-byte slots have a small data area: %+v", g)
	}
	// A large job grows the ring table beyond the first page.
	if g, _ := newGeometry(64, 2, 1000); g.headerSize != 3*pageSize {
		t.Fatalf("header of a job of 1000 ranks: %d", g.headerSize)
	}
}

// TestPeerWithLargerHeader: in a large job the ring table spans several
// pages; two ranks still find each other's rings in it, both ways.
func TestPeerWithLargerHeader(t *testing.T) {
	dir := testDir(t)
	cfg := Config{SlotSize: 64, SlotCount: 2, Dir: dir}
	const size = 1101
	var mbs [2]*Mailbox
	for r := range mbs {
		mb, err := Create("hdr", r*1000, size, []int{1000 - r*1000}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		mbs[r] = mb
	}
	if mbs[0].geo.headerSize <= pageSize {
		t.Fatalf("header of %d bytes; the test needs more than a page", mbs[0].geo.headerSize)
	}
	var eps [2]*Endpoint
	for r, mb := range mbs {
		ep, err := mb.Connect(context.Background(), map[int]Peer{1000 - r*1000: {Name: mbs[1-r].Name(), Pid: os.Getpid()}})
		if err != nil {
			t.Fatal(err)
		}
		defer ep.Close()
		eps[r] = ep
	}
	for r, ep := range eps {
		if err := send(ep, 1000-r*1000, []byte("hello"), transport.Tag(7+r)); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 64)
	for r, ep := range eps {
		n, tag, err := recv(ep, 1000-r*1000, buf)
		if err != nil || string(buf[:n]) != "hello" || tag != transport.Tag(8-r) {
			t.Fatalf("rank %d received %q tag %d: %v", r*1000, buf[:n], tag, err)
		}
	}
}
