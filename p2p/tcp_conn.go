package p2p

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gccl/gccl/internal/spin"
)

// The tcp backend's socket I/O below the frames: how the progress loop
// waits for the next frame, and how large WRITE payloads leave the
// initiator. Both work on the connection's file descriptor (syscall.Conn,
// which *net.TCPConn and *net.UnixConn are); any other net.Conn (TLS, a
// pipe in tests) gets plain reads and the buffered, copying write path.
//
// Why (docs/P2P.md, "TCP backend vs NIXL"): a small request's round trip
// crossed sleeping goroutines on both sides (the initiator's lane and
// waiter, the target's reader and responder, the initiator's reader), each
// a futex or epoll wake-up of tens of microseconds on a VM; and every
// WRITE byte was copied into the connection's buffer before the kernel
// copied it again.

// directMin is the smallest WRITE piece sent straight from the post's
// memory: below it the copy into the connection's buffer is cheaper than
// a second system call, and lets the piece share one with its commit.
// Posts up to this size also run inside Post (tcpSpec.postInlineMax):
// their frames fit the socket's buffer at once.
const directMin = 64 << 10

// directChunk bounds one write(2) from a post's memory, so that sendMu
// (which retire waits for) is held for a bounded kernel copy (a few
// hundred µs). Each write is a system call whose fixed cost on a VM is
// large: 16 MiB WRITEs over loopback ran at 2.2-2.3 GB/s in 256 KiB
// writes and 3.0-3.2 GB/s in 1 MiB ones (2 or 4 MiB: no better).
const directChunk = 1 << 20

// tcpConn is the connection under the peer's buffered reader and writer.
//
// Reading: frames are read by whoever holds the reading role
// (tcp_progress.go): the reader goroutine, which polls for a bounded,
// adaptive while (tcp_spin.go) before parking in the poller, or a goroutine
// waiting for a post it made inline, which reads its answer itself.
// Payload reads spin only on the target of a streamed WRITE, and for at
// most payloadSpinNs per gap (spinRead): a longer gap means the sender is
// not running, and a spinning receiver would take the core it needs on a
// small machine.
//
// Writing: in nonblocking mode (the frames of a small or inline post, see
// sendTCP) what the socket does not take at once is kept (over) and the
// responder is asked to send it, so that such a post never waits for the
// peer, even when posted from Post or from a completion callback on the
// progress loop. Every later write sends over first: the stream keeps its
// order.
type tcpConn struct {
	conn    net.Conn
	fc      *fdConn         // conn outside the netpoller (tcp_fd_linux.go), or nil
	raw     syscall.RawConn // nil: plain reads, blocking writes
	frames  spinGauge       // the progress loop's wait for a frame
	scratch []byte          // replyNow's frame (under the writer lock)

	// Who reads frames (tcp_progress.go): the reader goroutine, or a
	// goroutine waiting for a small post; want counts the waiters asking.
	reading atomic.Bool
	want    atomic.Int32
	// bulk: the last request either way moved more than directMin in a
	// piece (noteSize); the reader does not spin then (tcp_progress.go).
	bulk atomic.Bool
	poll bool // Read makes one nonblocking attempt (the role's holder sets it)
	// spinRead: Read polls a while before sleeping (the role's holder sets
	// it while it reads a WRITE's payload into memory).
	spinRead bool

	// Under the peer's writer lock.
	nonblock bool
	over     []byte
	backlog  atomic.Int64 // len(over), for tcpPostsInline

	// The raw callbacks and their arguments and results, made once: a
	// closure per call would allocate on every frame.
	rd     rawOp // the role holder's
	wr     rawOp // the writer's
	dw     directWrite
	pollFn func(uintptr)
	peekFn func(uintptr)
	takeFn func(uintptr) bool
	nowFn  func(uintptr) bool
	dirFn  func(uintptr) bool
	peekMu sync.Mutex // socketHasBytes may be asked by any waiter
	peeked bool
}

// rawOp is one raw read or write: its buffer, and what it did.
type rawOp struct {
	b   []byte
	n   int
	err error
}

// overMax bounds what small posts may leave for the responder while the
// peer does not read: past it they wait for the socket like large ones.
const overMax = 1 << 20

// inlineMax is the largest WRITE posted inline (tcpPostsInline): one
// direct write's worth. A larger one goes to the lane, which waits for the
// socket rather than copy what it does not take.
const inlineMax = directChunk

// tcpPostsInline: a post runs on Post's goroutine when it is small (or a
// WRITE of host memory of at most inlineMax), the connection is a socket,
// nothing waits to be sent on it and the writer is free (else the lane
// takes it, in order). Its frames never wait for the peer: what the socket
// does not take at once is kept and sent by the responder (nonblock). So
// Post costs the copy into the socket, as UCX's tcp transport's does, and
// no hand-off to the lane goroutine. Inline posts may come from a
// completion callback on the progress loop, which must not wait for a
// writer that waits for the peer to read (a writer taken between this
// check and the post's own is waited for, as the lane would).
func tcpPostsInline(r *Request) bool {
	p := r.p
	if r.bytes > directMin && (r.bytes > inlineMax || r.op != Write || r.local.typ != DRAM) {
		return false
	}
	if p == nil || p.tc.raw == nil || p.tc.backlog.Load() != 0 || !p.wmu.TryLock() {
		return false
	}
	p.wmu.Unlock()
	return true
}

// noteSize records the size of a request just posted or served, one rule
// for both sides: transfers above directMin stream, and a reader spinning
// through them would take the copy's core.
func (c *tcpConn) noteSize(n uint64) { c.bulk.Store(n > directMin) }

// Write is the buffered writer's way to the socket (the caller holds the
// peer's writer).
func (c *tcpConn) Write(b []byte) (int, error) {
	if !c.nonblock || c.raw == nil {
		if err := c.flushOver(); err != nil {
			return 0, err
		}
		return c.conn.Write(b)
	}
	n := 0
	if len(c.over) == 0 { // else b queues behind it
		var err error
		if n, err = c.writeNow(b); err != nil && err != syscall.EAGAIN {
			return n, err
		}
	}
	c.over = append(c.over, b[n:]...)
	c.backlog.Store(int64(len(c.over)))
	return len(b), nil
}

// flushOver sends what a nonblocking write left, waiting for room.
func (c *tcpConn) flushOver() error {
	if len(c.over) == 0 {
		return nil
	}
	_, err := c.conn.Write(c.over)
	c.over = c.over[:0]
	c.backlog.Store(0)
	return err
}

// writeNow writes what the socket takes of b without waiting (the caller
// holds the peer's writer).
func (c *tcpConn) writeNow(b []byte) (int, error) {
	c.wr = rawOp{b: b}
	err := c.raw.Write(c.nowFn)
	if err == nil {
		err = c.wr.err
	}
	n := max(c.wr.n, 0)
	c.wr.b = nil
	return n, err
}

func (c *tcpConn) writeNowOnce(fd uintptr) bool {
	for {
		c.wr.n, c.wr.err = rawWrite(fd, c.wr.b)
		if c.wr.err != syscall.EINTR {
			return true // EAGAIN too: no waiting here
		}
	}
}

func newTCPConn(c net.Conn) *tcpConn {
	s := &tcpConn{conn: c}
	s.fc = asFDConn(c)
	if sc, ok := c.(syscall.Conn); ok && rawIOSupported {
		if raw, err := sc.SyscallConn(); err == nil {
			s.raw = raw
		}
	}
	s.pollFn, s.peekFn, s.nowFn, s.dirFn = s.pollOnce, s.peekOnce, s.writeNowOnce, s.dw.write
	return s
}

// Read is the buffered reader's way to the socket: a blocking read, or,
// with poll set, one nonblocking attempt (errNoBytes when the socket is
// empty).
func (s *tcpConn) Read(b []byte) (int, error) {
	if s.poll {
		return s.pollRead(b)
	}
	if s.spinRead && s.raw != nil && !spinOff {
		if n, got, err := s.spinPoll(b); got {
			return n, err
		}
	}
	for {
		n, err := s.conn.Read(b)
		if err != nil && s.raw != nil && errors.Is(err, os.ErrDeadlineExceeded) {
			// A nudge (tcp_progress.go) that found the role held: no read
			// deadline is set on a connection after its handshake.
			s.conn.SetReadDeadline(time.Time{})
			if n == 0 {
				continue
			}
			err = nil
		}
		return n, err
	}
}

// payloadSpinNs bounds each poll for the next bytes of a WRITE's payload
// on the target (spinRead) before the reader sleeps in the poller. While
// the initiator streams, the next segment is microseconds away and
// sleeping costs a wake-up per gap; a longer gap means the sender is not
// running, and spinning through it would take the core it needs (200 µs
// did worse than 50 here: docs/P2P.md, "A WRITE's payload is polled" in
// "Issue 31's tcp rows on a quiet day").
const payloadSpinNs = 50_000

// spinPoll polls for bytes for at most payloadSpinNs; got reports whether
// the socket answered (bytes, end of stream or an error) in that time.
func (s *tcpConn) spinPoll(b []byte) (n int, got bool, err error) {
	end := monoNow() + payloadSpinNs
	for {
		n, err := s.pollRead(b)
		if err != errNoBytes {
			return n, true, err
		}
		if monoNow() > end {
			return 0, false, nil
		}
		spin.Pause(spinPauses)
	}
}

// errNoBytes: a poll found the socket empty.
var errNoBytes = errors.New("p2p: no bytes waiting")

func (s *tcpConn) pollRead(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	r := &s.rd
	r.b, r.n, r.err = b, 0, nil
	cerr := s.raw.Control(s.pollFn)
	n, err := r.n, r.err
	r.b = nil
	switch {
	case cerr != nil:
		return 0, cerr
	case err == syscall.EAGAIN:
		return 0, errNoBytes
	case err != nil:
		return 0, err
	case n <= 0:
		return 0, io.EOF
	}
	return n, nil
}

func (s *tcpConn) pollOnce(fd uintptr) {
	r := &s.rd
	for {
		if r.n, r.err = rawRead(fd, r.b); r.err != syscall.EINTR {
			return
		}
	}
}

// startTCP puts the connection's tcpConn under br and bw, keeping what
// the handshake left buffered in br.
func (p *peer) startTCP() {
	p.conn = detachConn(p.conn)
	p.tc = newTCPConn(p.conn)
	p.tc.takeFn = p.takeIfReadable
	p.bw.Reset(p.tc)
	if n := p.br.Buffered(); n > 0 {
		pending, _ := p.br.Peek(n)
		p.br = bufio.NewReaderSize(io.MultiReader(bytes.NewReader(bytes.Clone(pending)), p.tc), connBufSize)
		return
	}
	p.br.Reset(p.tc)
}

// writeDirect sends WRITE payload mem of post id of r (part part) straight
// from the post's memory: no copy into the connection's buffer. The caller
// holds the writer, has flushed the frame's header, and found the
// connection able to (p.tc.raw set). Each write(2) is non-blocking and
// made under sendMu only while the post is in flight, so once the post has
// failed (timed out) and retire has passed sendMu no later write reads its
// memory; the rest of the frame is then zeros. Waiting for the socket to
// drain happens outside sendMu, bounded by the writer's deadline.
func (p *peer) writeDirect(id uint64, r *Request, mem []byte, part int) error {
	if err := p.tc.flushOver(); err != nil {
		p.werr = err
		return err
	}
	d := &p.tc.dw
	*d = directWrite{p: p, id: id, r: r, mem: mem, part: part, live: true}
	err := p.tc.raw.Write(p.tc.dirFn)
	if err == nil {
		err = d.err
	}
	off := d.off
	*d = directWrite{}
	if err != nil {
		p.werr = err
		return err
	}
	p.lastSend.Store(monoNow())
	return p.padZeros(len(mem) - off)
}

// writeDirectNow is writeDirect for a post whose frames never wait for
// the peer (tcpConn.nonblock, the caller holding the writer): it writes
// what the socket takes of mem at once, straight from the post's memory,
// and keeps a copy of the rest for the responder to send (at most
// inlineMax: the post would not be inline otherwise). Like writeDirect it
// reads mem only under sendMu while the post is in flight.
func (p *peer) writeDirectNow(id uint64, r *Request, mem []byte, part int) error {
	tc := p.tc
	off := 0
	for off < len(mem) {
		p.sendMu.Lock()
		if !p.inFlight(id, r) {
			p.sendMu.Unlock()
			break
		}
		var n int
		var err error
		if len(tc.over) == 0 {
			n, err = tc.writeNow(mem[off:min(len(mem), off+directChunk)])
		}
		if n == 0 && (err == nil || err == syscall.EAGAIN) {
			// The socket is full, or earlier bytes wait: keep the rest.
			tc.over = append(tc.over, mem[off:]...)
			tc.backlog.Store(int64(len(tc.over)))
			n, err = len(mem)-off, nil
		}
		if n > 0 {
			r.tcpLanded[part].Add(uint64(n))
			r.progress.Store(monoNow())
			off += n
		}
		p.sendMu.Unlock()
		if err != nil && err != syscall.EAGAIN {
			p.werr = err
			return err
		}
	}
	p.lastSend.Store(monoNow())
	return p.padZeros(len(mem) - off)
}

// padZeros ends a frame whose post failed midway with n zeros: the rest of
// its memory is its owner's again.
func (p *peer) padZeros(n int) error {
	for n > 0 {
		k := min(n, len(zeroPad))
		if _, err := p.bw.Write(zeroPad[:k]); err != nil {
			p.werr = err
			return err
		}
		n -= k
	}
	return nil
}

// directWrite is writeDirect's state, for its raw callback.
type directWrite struct {
	p    *peer
	id   uint64
	r    *Request
	mem  []byte
	part int
	off  int
	live bool
	err  error
}

func (d *directWrite) write(fd uintptr) bool {
	p, r := d.p, d.r
	for d.off < len(d.mem) {
		p.sendMu.Lock()
		if d.live = d.live && p.inFlight(d.id, r); !d.live {
			p.sendMu.Unlock()
			return true
		}
		n, e := rawWrite(fd, d.mem[d.off:min(len(d.mem), d.off+directChunk)])
		if n > 0 {
			r.tcpLanded[d.part].Add(uint64(n))
			r.progress.Store(monoNow())
			d.off += n
		}
		p.sendMu.Unlock()
		switch {
		case e == nil, e == syscall.EINTR:
		case e == syscall.EAGAIN:
			return false // wait for room, then go on
		default:
			d.err = e
			return true
		}
	}
	return true
}

// opFlush is a reply that only has the responder flush the connection's
// buffer (see replyNow); never on the wire.
const opFlush op = 0

// replyNow sends reply rp (an ack, a READ's notification, or the answer
// to a small READ of a memory region) from the progress loop itself (or a
// waiter reading for it), saving the responder's wake-up, when that cannot
// block or reorder anything: the writer is
// free, no earlier reply is queued or being written, and the socket takes
// the frame without waiting. What the socket does not take at once stays
// in the connection's buffer for the responder to flush, so the reader
// still never blocks on a write (two agents reading from each other could
// then deadlock). It reports whether rp was sent (else the caller queues
// it; the region of a READ answer stays pinned either way until sent).
func (p *peer) replyNow(rp reply) bool {
	if p.tc.raw == nil || rp.err != "" || spinOff {
		return false
	}
	var payload []byte
	switch {
	case rp.op == opAck:
	case rp.op == opNotif && len(rp.payload) <= directMin:
		payload = rp.payload
	case rp.op == opReadResp && rp.region != nil && rp.region.mem != nil && rp.length <= directMin &&
		rp.region.info.Type != FILE && rp.region.info.Type != VRAM:
		off := rp.offset - rp.region.info.Base
		payload = rp.region.mem[off : off+rp.length]
	default:
		return false
	}
	if !p.wmu.TryLock() {
		return false
	}
	defer p.wmu.Unlock()
	p.respMu.Lock()
	idle := len(p.resp) == 0 && !p.respBusy && !p.respDone
	p.respMu.Unlock()
	if !idle || p.werr != nil || p.bw.Buffered() > 0 || len(p.tc.over) > 0 {
		return false
	}
	var hdr [wireHeaderLen]byte
	frame := append(p.tc.scratch[:0], hdr[:]...)
	putHeader(frame, header{op: rp.op, req: rp.req, aux: rp.aux, length: uint64(len(payload))})
	frame = append(frame, payload...)
	p.tc.scratch = frame[:0]
	if rp.region != nil {
		rp.region.busy.Add(-1) // copied: the region may go
	}
	n := 0
	for n < len(frame) {
		k, err := p.tc.writeNow(frame[n:])
		n += k
		if err != nil {
			break
		}
	}
	if n > 0 {
		p.lastSend.Store(monoNow())
	}
	if n < len(frame) {
		p.bw.Write(frame[n:]) // fits: the buffer was empty
		p.queue(reply{op: opFlush})
	}
	return true
}
