package tcp

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/gccl/gccl/transport"
)

func TestFrameHeader(t *testing.T) {
	b := make([]byte, frameHeaderLen)
	want := frameHeader{kind: frameData, length: 4096, tag: transport.MakeTag(3, 99)}
	putFrameHeader(b, want)
	if got, err := parseFrameHeader(b, 4096); err != nil || got != want {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	bad := func(name string, edit func([]byte), slotSize int) {
		t.Helper()
		c := bytes.Clone(b)
		edit(c)
		if _, err := parseFrameHeader(c, slotSize); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	bad("length over the slot size", func([]byte) {}, 4095)
	bad("unknown kind", func(c []byte) { c[4] = 9 }, 4096)
	bad("kind zero", func(c []byte) { c[4] = 0 }, 4096)
	bad("reserved bytes", func(c []byte) { c[6] = 1 }, 4096)
	bad("abort with a tag", func(c []byte) { c[4] = byte(frameAbort); c[0], c[1] = 1, 0 }, 4096)
	bad("abort reason too long", func(c []byte) {
		putFrameHeader(c, frameHeader{kind: frameAbort, length: maxAbortReason + 1})
	}, 4096)
	if _, err := parseFrameHeader(b[:15], 4096); err == nil {
		t.Error("short header accepted")
	}
}

func TestPieceRange(t *testing.T) {
	for streams := 1; streams <= MaxStreams; streams++ {
		for _, n := range []int{0, 1, stripeMin - 1, stripeMin, stripeMin + 1, stripeMin + 12345, 1 << 20, 1<<30 - 1, 1 << 30} {
			parts := pieceCount(n, streams)
			if parts < 1 || parts > streams || (n < stripeMin && parts != 1) {
				t.Fatalf("n=%d streams=%d: %d parts", n, streams, parts)
			}
			end := 0
			for j := 0; j < streams; j++ {
				lo, hi := pieceRange(n, parts, j)
				if j >= parts {
					if lo != hi {
						t.Fatalf("n=%d streams=%d: stream %d carries [%d,%d) beyond %d parts", n, streams, j, lo, hi, parts)
					}
					continue
				}
				if lo != end || hi <= lo && n > 0 || (j > 0 && lo%stripeAlign != 0) {
					t.Fatalf("n=%d streams=%d: piece %d is [%d,%d) after %d", n, streams, j, lo, hi, end)
				}
				end = hi
			}
			if end != n {
				t.Fatalf("n=%d streams=%d: pieces end at %d", n, streams, end)
			}
		}
	}
}

func FuzzParseFrameHeader(f *testing.F) {
	b := make([]byte, frameHeaderLen)
	putFrameHeader(b, frameHeader{kind: frameData, length: 100, tag: 5})
	f.Add(b, 4096)
	putFrameHeader(b, frameHeader{kind: frameAbort, length: 10})
	f.Add(b, 64)
	f.Add([]byte{}, 1)
	f.Fuzz(func(t *testing.T, b []byte, slotSize int) {
		h, err := parseFrameHeader(b, slotSize)
		if err != nil {
			return
		}
		if h.kind == frameData && int64(h.length) > int64(slotSize) || h.kind == frameAbort && h.length > maxAbortReason {
			t.Fatalf("accepted %+v with slot size %d", h, slotSize)
		}
		c := make([]byte, frameHeaderLen)
		putFrameHeader(c, h)
		if !bytes.Equal(c, b[:frameHeaderLen]) {
			t.Fatalf("accepted a header that does not re-encode to itself: % x", b[:frameHeaderLen])
		}
	})
}

// memPipe stands in for the sockets of one direction of a connection: a
// byte queue per stream, with how much each read or write may move drawn
// from a script, so that every partial transfer and EAGAIN is exercised.
type memPipe struct {
	queues [][]byte
	closed bool // the writer has gone: reads of an empty queue see EOF
	script []byte
	pos    int
	slow   map[int]int // per stream and direction: stalls in a row
}

// budget is how many bytes the next read (write false) or write of stream
// j may move; 0 means EAGAIN. Stalls and tiny transfers (which split
// headers) come at most 8 times in a row for each stream and direction, so
// a scripted run always progresses.
func (m *memPipe) budget(j int, write bool) int {
	k := 2 * j
	if write {
		k++
	}
	if m.slow == nil {
		m.slow = map[int]int{}
	}
	if len(m.script) == 0 || m.slow[k] >= 8 {
		m.slow[k] = 0
		return 1 << 20
	}
	b := m.script[m.pos%len(m.script)]
	m.pos++
	switch {
	case b%5 == 0:
		m.slow[k]++
		return 0
	case b < 16:
		m.slow[k]++
		return int(b)
	}
	m.slow[k] = 0
	return 1 + int(b)*997%(64<<10)
}

func (m *memPipe) read(j int, p []byte) (int, error) {
	q := m.queues[j]
	if len(q) == 0 {
		if m.closed {
			return 0, io.EOF
		}
		return 0, errWouldBlock
	}
	k := m.budget(j, false)
	if k == 0 {
		return 0, errWouldBlock
	}
	n := copy(p[:min(len(p), k)], q)
	m.queues[j] = q[n:]
	return n, nil
}

func (m *memPipe) write(j int, hdr, payload []byte) (int, error) {
	k := m.budget(j, true)
	if k == 0 {
		return 0, errWouldBlock
	}
	n := 0
	for _, b := range [][]byte{hdr, payload} {
		c := min(len(b), k-n)
		m.queues[j] = append(m.queues[j], b[:c]...)
		n += c
	}
	return n, nil
}

// FuzzFrameStream feeds arbitrary bytes to the receive state machine, as a
// hostile or corrupt peer would: it must report an error or deliver
// well-formed messages, and never crash or read out of range.
func FuzzFrameStream(f *testing.F) {
	var valid []byte
	for _, n := range []int{0, 3, 200} {
		h := make([]byte, frameHeaderLen)
		putFrameHeader(h, frameHeader{kind: frameData, length: uint32(n), tag: transport.Tag(n)})
		valid = append(append(valid, h...), make([]byte, n)...)
	}
	f.Add(valid, []byte{1, 2, 3}, uint8(1))
	f.Add(valid[:20], []byte{5, 5, 7}, uint8(2))
	abort := make([]byte, frameHeaderLen)
	putFrameHeader(abort, frameHeader{kind: frameAbort, length: 4})
	f.Add(append(abort, "boom"...), []byte{9}, uint8(2))
	f.Fuzz(func(t *testing.T, stream0, script []byte, streams uint8) {
		const slotSize = stripeMin + 3*stripeAlign + 5
		s := int(streams%3) + 1
		pipe := &memPipe{queues: make([][]byte, s), closed: true, script: script}
		pipe.queues[0] = stream0
		for j := 1; j < s; j++ {
			pipe.queues[j] = bytes.Repeat([]byte{byte(j)}, slotSize)
		}
		rx := newRxRing(slotSize, 2, s, pipe.read)
		for range 10000 {
			_, err := rx.pass()
			for {
				m, _, ok := rx.peek()
				if !ok {
					break
				}
				if len(m) > slotSize {
					t.Fatalf("delivered %d bytes", len(m))
				}
				rx.release()
			}
			if err != nil {
				return
			}
		}
		t.Fatal("receiver neither finished nor failed")
	})
}

// FuzzRoundTrip sends messages through a send ring and a receive ring
// joined by memPipe, with partial writes, partial reads and EAGAIN at
// scripted places: every message must arrive whole, in order, with its tag.
// A plan byte also picks whether the message is sent from the caller's
// memory (bit 6) and posted to a receive buffer (bit 7): a message sent
// from memory must arrive intact though that memory is scribbled over once
// the ring frees it, and a posted buffer must end up holding its message
// or stay untouched.
func FuzzRoundTrip(f *testing.F) {
	f.Add([]byte{0, 1, 5, 4, 3}, []byte{3, 10, 200, 0}, uint8(2))
	f.Add([]byte{5, 5, 5, 5}, []byte{255, 1}, uint8(3))
	f.Add([]byte{2, 0, 2, 0, 1}, []byte{}, uint8(1))
	f.Add([]byte{0xc5, 0xc4, 0x45, 0x85, 0xc3, 0xc5, 0xc5}, []byte{7, 40, 1}, uint8(2))
	f.Add([]byte{0xc5, 0xc5, 0xc5, 0xc5, 0xc5}, []byte{}, uint8(3))
	f.Add([]byte{0, 1, 5, 0xc4, 3, 0x85}, []byte{3, 10, 200, 0, 17}, uint8(130)) // short reads end passes
	f.Fuzz(func(t *testing.T, plan, script []byte, streams uint8) {
		const slotSize = stripeMin + 5*stripeAlign + 3
		const slots = 2
		sizes := []int{0, 1, 17, 5000, stripeMin, slotSize}
		s := int(streams%3) + 1
		if len(plan) > 24 {
			plan = plan[:24]
		}
		size := func(k int) int { return sizes[int(plan[k]&0x3f)%len(sizes)] }
		pipe := &memPipe{queues: make([][]byte, s), script: script}
		tx := newTxRing(slotSize, slots, s, pipe.write)
		rx := newRxRing(slotSize, slots, s, pipe.read)
		// memPipe's short reads do not mean an empty stream: a pass that
		// ends at one must still lose nothing.
		rx.shortDrains = streams >= 128
		refs := make([][]byte, len(plan)) // message k's memory while the ring may read it
		posts := make([][]byte, len(plan))
		sent, got, posted, scrubbed := 0, 0, 0, 0
		for step := 0; got < len(plan); step++ {
			if step > 100000 {
				t.Fatalf("stuck after %d of %d messages", got, len(plan))
			}
			for ; posted < len(plan) && posted-got < rx.postWindow(); posted++ {
				if n := size(posted); plan[posted]&0x80 != 0 && n > 0 {
					posts[posted] = bytes.Repeat([]byte{0xee}, n)
					if !rx.post(posted-got, posts[posted]) {
						t.Fatalf("post of message %d, %d ahead, refused", posted, posted-got)
					}
				}
			}
			if sent < len(plan) {
				n := size(sent)
				if plan[sent]&0x40 != 0 {
					p := pattern(0, sent, n)
					if tx.reserveRef(p) {
						refs[sent] = p
						tx.commit(transport.Tag(sent))
						sent++
					}
				} else if b, ok := tx.reserve(n); ok {
					copy(b, pattern(0, sent, n))
					tx.commit(transport.Tag(sent))
					sent++
				}
			}
			if _, err := tx.pass(); err != nil {
				t.Fatal(err)
			}
			for ; scrubbed < int(tx.freed.Load()); scrubbed++ {
				for i := range refs[scrubbed] {
					refs[scrubbed][i] = 0x55 // freed: the ring must not read it again
				}
			}
			if _, err := rx.pass(); err != nil {
				t.Fatal(err)
			}
			if m, tag, ok := rx.peek(); ok {
				n := size(got)
				if tag != transport.Tag(got) || !bytes.Equal(m, pattern(0, got, n)) {
					t.Fatalf("message %d: tag %d, %d bytes, want %d bytes", got, tag, len(m), n)
				}
				if p := posts[got]; p != nil && (len(m) == 0 || &m[0] != &p[0]) && !bytes.Equal(p, bytes.Repeat([]byte{0xee}, n)) {
					t.Fatalf("message %d landed in a slot, but its posted buffer was written", got)
				}
				rx.release()
				got++
			}
		}
		if !tx.idle() {
			t.Fatal("send ring not idle after everything arrived")
		}
		// A clean close after the last message is reported as such.
		pipe.closed = true
		if _, err := rx.pass(); !errors.Is(err, io.EOF) {
			t.Fatalf("after close: %v", err)
		}
	})
}

// TestRingsMoveCallersMemory checks that a message sent from the caller's
// memory and posted to a receive buffer crosses with no slot on either side:
// it lands in the posted buffer, and the send slot was never written.
func TestRingsMoveCallersMemory(t *testing.T) {
	const slotSize = 4 * stripeMin
	for _, streams := range []int{1, 3} {
		pipe := &memPipe{queues: make([][]byte, streams)}
		tx := newTxRing(slotSize, 2, streams, pipe.write)
		rx := newRxRing(slotSize, 2, streams, pipe.read)
		want := pattern(1, 2, slotSize)
		dst := make([]byte, slotSize)
		if !rx.post(0, dst) {
			t.Fatal("post refused")
		}
		if rx.post(rx.postWindow(), dst) || rx.post(0, make([]byte, slotSize+1)) {
			t.Fatal("a post beyond the window or longer than a slot was taken")
		}
		if !tx.reserveRef(want) {
			t.Fatal("no slot")
		}
		tx.commit(7)
		for !tx.idle() {
			if _, err := tx.pass(); err != nil {
				t.Fatal(err)
			}
		}
		if tx.data != nil {
			t.Fatal("a message sent from the caller's memory took slot memory")
		}
		var m []byte
		for ok := false; !ok; {
			if _, err := rx.pass(); err != nil {
				t.Fatal(err)
			}
			m, _, ok = rx.peek()
		}
		if &m[0] != &dst[0] || !bytes.Equal(dst, want) {
			t.Fatalf("%d streams: the posted message did not land in its buffer", streams)
		}
		if rx.data != nil {
			t.Fatal("a posted message took slot memory")
		}
		rx.release()
	}
}

// countingStream is one stream whose reads return at most max bytes (all
// of what is queued when max is 0) and are counted.
type countingStream struct {
	q          []byte
	max, reads int
}

func (s *countingStream) read(_ int, p []byte) (int, error) {
	s.reads++
	if len(s.q) == 0 {
		return 0, errWouldBlock
	}
	k := len(p)
	if s.max > 0 {
		k = min(k, s.max)
	}
	n := copy(p[:k], s.q)
	s.q = s.q[n:]
	return n, nil
}

func frame(n int, tag transport.Tag) []byte {
	b := make([]byte, frameHeaderLen+n)
	putFrameHeader(b, frameHeader{kind: frameData, length: uint32(n), tag: tag})
	for i := range n {
		b[frameHeaderLen+i] = byte(i)
	}
	return b
}

// TestShortReadEndsThePass: where a read that returns less than it asked
// for means the socket is empty (a raw socket), the pass that took a whole
// message with it makes no further read, which would find nothing: one
// system call per small message instead of two. Inside a message a short
// read does not end the pass (the rest is read at once, as before), and a
// TLS stream, which may hold decrypted bytes its socket no longer has,
// reads on.
func TestShortReadEndsThePass(t *testing.T) {
	for _, c := range []struct {
		name        string
		shortDrains bool
		q           []byte
		max         int
		wantReads   int
		wantMsgs    int
	}{
		{"one small message, raw", true, frame(8, 1), 0, 1, 1},
		{"one small message, TLS", false, frame(8, 1), 0, 2, 1},
		{"two messages in one read, raw", true, append(frame(8, 1), frame(100, 2)...), 0, 1, 2},
		// 3000 bytes a read: the stage read is short, yet the payload's
		// rest is read in the same pass; that read got all it asked
		// for, which says nothing of what follows, so one more read.
		{"a message in two reads, raw", true, frame(5000, 3), 3000, 3, 1},
		{"a message in two reads, TLS", false, frame(5000, 3), 3000, 3, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &countingStream{q: c.q, max: c.max}
			rx := newRxRing(64<<10, 4, 1, s.read)
			rx.shortDrains = c.shortDrains
			if _, err := rx.pass(); err != nil {
				t.Fatal(err)
			}
			msgs := 0
			for {
				m, tag, ok := rx.peek()
				if !ok {
					break
				}
				if want := frame(len(m), tag)[frameHeaderLen:]; !bytes.Equal(m, want) {
					t.Fatalf("message %d (tag %d) of %d bytes is wrong", msgs, tag, len(m))
				}
				msgs++
				rx.release()
			}
			if msgs != c.wantMsgs || s.reads != c.wantReads {
				t.Fatalf("one pass: %d messages with %d reads, want %d with %d", msgs, s.reads, c.wantMsgs, c.wantReads)
			}
		})
	}
}
