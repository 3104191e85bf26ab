package tcp

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync/atomic"

	"github.com/gccl/gccl/transport"
)

// errWouldBlock is what a stream's read or write returns when the socket
// has no data or no room right now (EAGAIN).
var errWouldBlock = errors.New("tcp: operation would block")

// errUnsupportedOS is what Listen returns where the data path cannot run.
var errUnsupportedOS = errors.New("tcp: transport needs a Unix system")

// exclusive lets one goroutine at a time run a progress pass over a ring.
// A goroutine that finds a pass running leaves a request instead of
// waiting, and the running goroutine makes one more pass before it lets go,
// so no request is lost and nobody blocks: the owner's inline polls and the
// background goroutines share the sockets without a mutex.
type exclusive struct {
	busy  atomic.Bool
	again atomic.Bool
}

// enter starts a pass, or records a request and reports false when another
// goroutine is running one. After a pass, call leave; if it reports true,
// call enter again.
func (x *exclusive) enter() bool {
	x.again.Store(true)
	if !x.busy.CompareAndSwap(false, true) {
		return false
	}
	x.again.Store(false)
	return true
}

// leave ends a pass and reports whether a request arrived during it.
func (x *exclusive) leave() bool {
	x.busy.Store(false)
	// A requester stores again before trying busy, so either its attempt
	// succeeds after the store above or this load sees its request.
	return x.again.Load()
}

// lock waits for the running pass to end and keeps others out, for Close.
func (x *exclusive) lock() {
	for !x.busy.CompareAndSwap(false, true) {
		runtime.Gosched()
	}
}

func (x *exclusive) unlock() { x.busy.Store(false) }

// cursor is one stream's position in the message sequence of a ring.
type cursor struct {
	seq    uint64 // the message the stream is moving, or will consider next
	active bool   // the stream is in the middle of message seq
	buf    []byte // the message's payload: its slot, or the caller's memory
	off    int    // next byte of buf to move
	end    int    // end of the bytes of buf to move
	hdr    int    // frame header bytes already written (sending stream 0)
}

// rxRing is the receiving half of a connection: slotCount receive slots and
// the state machine that fills them from the streams. The owner (the rank's
// executor) calls peek and release; pass runs under the ring's exclusive,
// from the owner's inline polls or from the background readers.
type rxRing struct {
	slotSize, slotCount, streams int

	data []byte       // slotCount slots of slotSize bytes, made when a message first needs one
	held atomic.Int64 // bytes of data, for MemStats
	lens []int
	tags []transport.Tag
	left []int    // pieces of the slot's message still to arrive
	dst  [][]byte // where the slot's message lands: its slot or a posted buffer

	// Posted receive buffers, 2*slotCount of them so that the owner can post
	// the message that will reuse a slot before it releases the slot:
	// postBuf[k] is for message postSeq[k]-1 (0: none), k = seq mod
	// 2*slotCount. The owner writes a post, then its stamp; a pass reads the
	// buffer only after loading the stamp of the message it parses.
	postSeq []atomic.Uint64
	postBuf [][]byte

	// read reads from stream j into p, returning errWouldBlock when the
	// socket is empty and io.EOF when the peer closed it.
	read func(j int, p []byte) (int, error)
	// shortDrains: a read that returned less than it asked for left the
	// socket empty, so a pass stops there rather than make a read that
	// finds nothing (one system call per message). True for raw sockets;
	// a TLS stream may hold decrypted bytes that its socket no longer has.
	shortDrains bool

	head    atomic.Uint64 // messages released by the owner
	ready   atomic.Uint64 // messages complete, in order
	stalled atomic.Bool   // stream 0 stopped because every slot is taken
	want    atomic.Uint64 // bit j: stream j expects data that a pass could take
	excl    exclusive

	// Owned by the goroutine inside excl.
	next       uint64 // sequence number of the next stream-0 header
	readyLocal uint64
	stage      []byte // stream-0 bytes read ahead at frame boundaries
	lo, hi     int    // unconsumed part of stage
	cur        []cursor
	eof0       bool // stream 0 ended cleanly at a frame boundary
	windowStop bool // the last pumpFrames stopped for lack of a slot
}

// rxStageSize bounds the read-ahead on stream 0. A small message arrives
// with its header in one read; the stage also holds a whole abort frame.
const rxStageSize = 8 << 10

func newRxRing(slotSize, slotCount, streams int, read func(int, []byte) (int, error)) *rxRing {
	r := &rxRing{
		slotSize: slotSize, slotCount: slotCount, streams: streams,
		lens: make([]int, slotCount),
		tags: make([]transport.Tag, slotCount),
		left: make([]int, slotCount),
		dst:  make([][]byte, slotCount),
		read: read,

		postSeq: make([]atomic.Uint64, 2*slotCount),
		postBuf: make([][]byte, 2*slotCount),
		stage:   make([]byte, rxStageSize),
		cur:     make([]cursor, streams),
	}
	r.want.Store(1)
	return r
}

// abortError is how a peer's abort frame surfaces.
type abortError struct{ reason string }

func (e *abortError) Error() string { return "peer aborted: " + e.reason }

// peek returns the oldest complete message. Owner only.
func (r *rxRing) peek() ([]byte, transport.Tag, bool) {
	h := r.head.Load()
	if h == r.ready.Load() {
		return nil, 0, false
	}
	i := int(h % uint64(r.slotCount))
	n := r.lens[i]
	return r.dst[i][:n:n], r.tags[i], true
}

// postWindow is how many messages from head on the owner may post: up to
// the one that will reuse head's slot, so that it can be posted before
// head's release lets a pass parse it.
func (r *rxRing) postWindow() int { return r.slotCount + 1 }

// post asks that message ahead places after head be read into p. The post
// entry's earlier message, 2*slotCount back, was released, which happens
// after the pass that read it. Owner only; each message at most once.
func (r *rxRing) post(ahead int, p []byte) bool {
	if ahead < 0 || ahead >= r.postWindow() || len(p) == 0 || len(p) > r.slotSize {
		return false
	}
	s := r.head.Load() + uint64(ahead)
	k := int(s % uint64(len(r.postSeq)))
	r.postBuf[k] = p
	r.postSeq[k].Store(s + 1)
	return true
}

// posted returns where message s of n bytes lands: the buffer posted for it
// if its length matches, else its slot. Inside excl.
func (r *rxRing) posted(s uint64, n int) []byte {
	if k := int(s % uint64(len(r.postSeq))); r.postSeq[k].Load() == s+1 && len(r.postBuf[k]) == n {
		return r.postBuf[k]
	}
	if r.data == nil {
		r.data = make([]byte, r.slotSize*r.slotCount)
		r.held.Store(int64(len(r.data)))
	}
	base := int(s%uint64(r.slotCount)) * r.slotSize
	return r.data[base : base+n : base+n]
}

// release frees the oldest message's slot and reports whether stream 0 was
// stalled for lack of a slot, in which case the caller must poll again: the
// sender may be waiting for this room. Owner only.
func (r *rxRing) release() (resume bool) {
	h := r.head.Load()
	if h == r.ready.Load() {
		return false // nothing to release
	}
	// Drop the caller's buffer from a spent post: no pass reads it again,
	// as the next message of this entry is 2*slotCount later.
	if k := int(h % uint64(len(r.postSeq))); r.postSeq[k].Load() == h+1 {
		r.postSeq[k].Store(0)
		r.postBuf[k] = nil
	}
	r.head.Store(h + 1)
	return r.stalled.Load() && r.stalled.Swap(false)
}

// windowFull reports whether every slot holds a message the owner has not
// released, so stream 0 must not read the next frame (backpressure).
func (r *rxRing) windowFull() bool {
	if r.next-r.head.Load() < uint64(r.slotCount) {
		return false
	}
	r.stalled.Store(true)
	// release stores head before it reads stalled; reading head after
	// storing stalled means one of the two sees the other.
	return r.next-r.head.Load() >= uint64(r.slotCount)
}

// pass moves whatever the sockets hold into free slots without blocking and
// reports whether it completed messages. An error ends the connection:
// io.EOF for a clean close by the peer, *abortError for an abort frame,
// anything else for a broken or corrupt stream.
func (r *rxRing) pass() (completed bool, err error) {
	before := r.readyLocal
	err = r.pumpFrames()
	for j := 1; j < r.streams && err == nil; j++ {
		err = r.pumpStripe(j)
	}
	if err == nil && r.eof0 && r.stripesIdle() {
		err = io.EOF
	}
	var want uint64
	if err == nil {
		if !r.eof0 && !r.windowStop {
			want = 1
		}
		for j := 1; j < r.streams; j++ {
			if r.cur[j].active {
				want |= 1 << j
			}
		}
	}
	if want != r.want.Load() {
		r.want.Store(want)
	}
	return r.readyLocal != before, err
}

func (r *rxRing) stripesIdle() bool {
	for j := 1; j < r.streams; j++ {
		if r.cur[j].active {
			return false
		}
	}
	return true
}

// pumpFrames reads stream 0: headers and the stream-0 pieces of messages.
func (r *rxRing) pumpFrames() error {
	c := &r.cur[0]
	r.windowStop = false
	// drained: the last read returned less than it asked (shortDrains):
	// at a frame boundary the socket is then empty, most likely until the
	// peer's next message, and the pass ends there.
	drained := false
	for {
		if c.active {
			if r.lo < r.hi {
				k := copy(c.buf[c.off:c.end], r.stage[r.lo:r.hi])
				r.lo += k
				c.off += k
			} else {
				// Inside a message a short read is not the end: the
				// rest is being sent, and is read at once as before.
				want := c.end - c.off
				n, err := r.read(0, c.buf[c.off:c.end])
				if err == errWouldBlock {
					return nil
				}
				if err == io.EOF {
					return fmt.Errorf("tcp: stream 0 ended inside message %d: %w", c.seq, io.ErrUnexpectedEOF)
				}
				if err != nil {
					return err
				}
				c.off += n
				drained = r.shortDrains && n < want
			}
			if c.off == c.end {
				c.active = false
				r.pieceDone(c.seq)
			}
			continue
		}
		if r.eof0 {
			return nil
		}
		if r.hi-r.lo < frameHeaderLen {
			if r.windowFull() {
				r.windowStop = true
				return nil
			}
			if r.lo > 0 {
				r.hi = copy(r.stage, r.stage[r.lo:r.hi])
				r.lo = 0
			}
			if drained {
				return nil
			}
			want := len(r.stage) - r.hi
			n, err := r.read(0, r.stage[r.hi:])
			if err == errWouldBlock {
				return nil
			}
			if err == io.EOF {
				if r.hi > r.lo {
					return fmt.Errorf("tcp: stream 0 ended inside a frame header: %w", io.ErrUnexpectedEOF)
				}
				r.eof0 = true
				return nil
			}
			if err != nil {
				return err
			}
			r.hi += n
			drained = r.shortDrains && n < want
			continue
		}
		h, err := parseFrameHeader(r.stage[r.lo:r.lo+frameHeaderLen], r.slotSize)
		if err != nil {
			return err
		}
		if h.kind == frameAbort {
			return r.readAbort(int(h.length))
		}
		if r.windowFull() {
			r.windowStop = true
			return nil
		}
		r.lo += frameHeaderLen
		n := int(h.length)
		s := r.next
		r.next++
		i := int(s % uint64(r.slotCount))
		r.lens[i], r.tags[i] = n, h.tag
		r.dst[i] = r.posted(s, n)
		parts := pieceCount(n, r.streams)
		r.left[i] = parts
		lo, hi := pieceRange(n, parts, 0)
		*c = cursor{seq: s, active: true, buf: r.dst[i], off: lo, end: hi}
		if lo == hi {
			c.active = false
			r.pieceDone(s)
		}
		for j := 1; j < r.streams; j++ {
			r.advanceStripe(j)
		}
	}
}

// readAbort stages the reason of an abort frame and returns it as the error.
func (r *rxRing) readAbort(n int) error {
	need := frameHeaderLen + n
	for r.hi-r.lo < need {
		if r.lo > 0 {
			r.hi = copy(r.stage, r.stage[r.lo:r.hi])
			r.lo = 0
		}
		k, err := r.read(0, r.stage[r.hi:])
		if err == errWouldBlock {
			return nil // the rest of the frame is still on its way
		}
		if err == io.EOF {
			return fmt.Errorf("tcp: stream 0 ended inside an abort frame: %w", io.ErrUnexpectedEOF)
		}
		if err != nil {
			return err
		}
		r.hi += k
	}
	reason := string(r.stage[r.lo+frameHeaderLen : r.lo+need])
	r.lo += need
	return &abortError{reason: reason}
}

// advanceStripe moves an idle stream j to the next parsed message that has
// a piece on it. It keeps the invariant that an idle stripe cursor points
// at r.next, so it never reads lens of a slot that was reused.
func (r *rxRing) advanceStripe(j int) {
	c := &r.cur[j]
	for !c.active && c.seq < r.next {
		i := int(c.seq % uint64(r.slotCount))
		n := r.lens[i]
		parts := pieceCount(n, r.streams)
		if parts <= j {
			c.seq++
			continue
		}
		lo, hi := pieceRange(n, parts, j)
		c.active, c.buf, c.off, c.end = true, r.dst[i], lo, hi
	}
}

// pumpStripe reads the expected pieces of stream j, and nothing more: data
// of messages whose header has not arrived stays in the socket.
func (r *rxRing) pumpStripe(j int) error {
	c := &r.cur[j]
	for c.active {
		n, err := r.read(j, c.buf[c.off:c.end])
		if err == errWouldBlock {
			return nil
		}
		if err == io.EOF {
			return fmt.Errorf("tcp: stream %d ended inside message %d: %w", j, c.seq, io.ErrUnexpectedEOF)
		}
		if err != nil {
			return err
		}
		c.off += n
		if c.off == c.end {
			c.active = false
			r.pieceDone(c.seq)
			c.seq++
			r.advanceStripe(j)
		}
	}
	return nil
}

// pieceDone counts a landed piece and publishes the messages now complete,
// oldest first.
func (r *rxRing) pieceDone(seq uint64) {
	r.left[seq%uint64(r.slotCount)]--
	rd := r.readyLocal
	for rd < r.next && r.left[rd%uint64(r.slotCount)] == 0 {
		rd++
	}
	if rd != r.readyLocal {
		r.readyLocal = rd
		r.ready.Store(rd)
	}
}

// txRing is the sending half of a connection: slotCount staging slots that
// the owner fills in place and pass writes to the streams, straight from
// the slot. A slot is free again once all its bytes are in the kernel.
type txRing struct {
	slotSize, slotCount, streams int

	data []byte       // slotCount slots of slotSize bytes, made at the first reserve
	held atomic.Int64 // bytes of data, for MemStats
	lens []int
	hdrs []byte   // a frame header per slot
	refs [][]byte // the caller's memory a slot's message is sent from; nil: the slot

	// write writes hdr then payload to stream j (hdr may be empty) and
	// returns the bytes written, or errWouldBlock when the socket is full.
	write func(j int, hdr, payload []byte) (int, error)

	tail     atomic.Uint64 // messages committed by the owner
	freed    atomic.Uint64 // messages entirely written
	blocked  atomic.Uint64 // bit j: stream j's socket was full at the last pass
	excl     exclusive
	reserved bool // owner: a slot was reserved and not yet committed

	// Owned by the goroutine inside excl.
	cur []cursor
}

func newTxRing(slotSize, slotCount, streams int, write func(int, []byte, []byte) (int, error)) *txRing {
	return &txRing{
		slotSize: slotSize, slotCount: slotCount, streams: streams,
		lens:  make([]int, slotCount),
		hdrs:  make([]byte, frameHeaderLen*slotCount),
		refs:  make([][]byte, slotCount),
		write: write,
		cur:   make([]cursor, streams),
	}
}

// reserve returns the next staging slot, n bytes long. Owner only.
func (t *txRing) reserve(n int) ([]byte, bool) {
	tl := t.tail.Load()
	if tl-t.freed.Load() >= uint64(t.slotCount) {
		return nil, false
	}
	i := int(tl % uint64(t.slotCount))
	t.lens[i], t.refs[i] = n, nil
	t.reserved = true
	if t.data == nil {
		// A connection that only ever sends from the caller's memory, or
		// nothing, holds no slots.
		t.data = make([]byte, t.slotSize*t.slotCount)
		t.held.Store(int64(len(t.data)))
	}
	off := i * t.slotSize
	return t.data[off : off+n : off+n], true
}

// reserveRef takes the next slot for a message sent straight from p, which
// the passes read until the message is freed. Owner only.
func (t *txRing) reserveRef(p []byte) bool {
	tl := t.tail.Load()
	if tl-t.freed.Load() >= uint64(t.slotCount) {
		return false
	}
	i := int(tl % uint64(t.slotCount))
	t.lens[i], t.refs[i] = len(p), p
	t.reserved = true
	return true
}

// payload is the bytes of slot i's message.
func (t *txRing) payload(i int) []byte {
	if p := t.refs[i]; p != nil {
		return p
	}
	off := i * t.slotSize
	return t.data[off : off+t.lens[i]]
}

// commit queues the reserved slot for the wire. Owner only.
func (t *txRing) commit(tag transport.Tag) bool {
	if !t.reserved {
		return false
	}
	t.reserved = false
	tl := t.tail.Load()
	i := int(tl % uint64(t.slotCount))
	putFrameHeader(t.hdrs[i*frameHeaderLen:], frameHeader{kind: frameData, length: uint32(t.lens[i]), tag: tag})
	t.tail.Store(tl + 1)
	return true
}

// idle reports whether every committed message is on the wire.
func (t *txRing) idle() bool { return t.freed.Load() == t.tail.Load() }

// pass writes committed messages until the streams' sockets are full or
// nothing is left, and reports whether slots were freed.
func (t *txRing) pass() (freed bool, err error) {
	tail := t.tail.Load()
	var blocked uint64
	low := tail
	for j := range t.cur {
		c := &t.cur[j]
		for {
			if !c.active {
				t.advance(j, tail)
				if !c.active {
					break
				}
			}
			var n int
			if c.hdr < frameHeaderLen {
				i := int(c.seq % uint64(t.slotCount))
				hdr := t.hdrs[i*frameHeaderLen+c.hdr : (i+1)*frameHeaderLen]
				n, err = t.write(j, hdr, c.buf[c.off:c.end])
			} else {
				n, err = t.write(j, nil, c.buf[c.off:c.end])
			}
			if err == errWouldBlock {
				blocked |= 1 << j
				break
			}
			if err != nil {
				return false, err
			}
			h := min(n, frameHeaderLen-c.hdr)
			c.hdr += h
			c.off += n - h
			if c.hdr == frameHeaderLen && c.off == c.end {
				c.active, c.buf = false, nil
				c.seq++
			}
		}
		low = min(low, c.seq)
	}
	t.blocked.Store(blocked)
	if low != t.freed.Load() {
		t.freed.Store(low)
		return true, nil
	}
	return false, nil
}

// advance points an idle stream at the next committed message it carries.
func (t *txRing) advance(j int, tail uint64) {
	c := &t.cur[j]
	for c.seq < tail {
		i := int(c.seq % uint64(t.slotCount))
		n := t.lens[i]
		parts := pieceCount(n, t.streams)
		if j >= parts {
			c.seq++
			continue
		}
		lo, hi := pieceRange(n, parts, j)
		c.active, c.buf, c.off, c.end = true, t.payload(i), lo, hi
		// Only stream 0 sends a header; other streams start past it.
		c.hdr = frameHeaderLen
		if j == 0 {
			c.hdr = 0
		}
		return
	}
}
