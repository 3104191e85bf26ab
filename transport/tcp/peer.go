package tcp

import (
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gccl/gccl/transport"
)

// peer is the connection with one other rank: its streams, the two rings,
// and a reader and a writer goroutine per stream. The readers are always
// parked in the netpoller, so an arriving message or a lost peer rings the
// bell even while the rank sleeps; a writer only waits for room in its
// socket when a write could not finish inline.
type peer struct {
	ep    *Endpoint
	rank  int
	conns []*net.TCPConn
	raws  []syscall.RawConn
	fds   []int
	tx    *txRing
	rx    *rxRing

	rxErr atomic.Pointer[failure] // set once the peer can send no more
	txErr atomic.Pointer[failure] // set once nothing more reaches the peer
	down  atomic.Bool             // the endpoint closed the sockets: no more I/O

	arm      []chan struct{} // per stream: wake its writer
	quit     chan struct{}   // closed when writers must exit
	quitOnce sync.Once
	wg       sync.WaitGroup
}

type failure struct{ err error }

func newPeer(e *Endpoint, rank int, conns []*net.TCPConn, cfg *Config) (*peer, error) {
	p := &peer{ep: e, rank: rank, conns: conns, quit: make(chan struct{})}
	for _, c := range conns {
		if err := c.SetNoDelay(true); err != nil {
			return nil, fmt.Errorf("tcp: TCP_NODELAY with rank %d: %w", rank, err)
		}
		raw, err := c.SyscallConn()
		if err != nil {
			return nil, err
		}
		fd, err := sockFD(raw)
		if err != nil {
			return nil, err
		}
		p.raws = append(p.raws, raw)
		p.fds = append(p.fds, fd)
		p.arm = append(p.arm, make(chan struct{}, 1))
	}
	p.rx = newRxRing(cfg.SlotSize, cfg.SlotCount, len(conns), p.readStream)
	p.tx = newTxRing(cfg.SlotSize, cfg.SlotCount, len(conns), p.writeStream)
	return p, nil
}

func (p *peer) readStream(j int, b []byte) (int, error) { return readFD(p.fds[j], b) }

func (p *peer) writeStream(j int, hdr, payload []byte) (int, error) {
	return writeFD(p.fds[j], hdr, payload)
}

func (p *peer) start() {
	for j := range p.conns {
		p.wg.Add(2)
		go p.readLoop(j)
		go p.writeLoop(j)
	}
}

// readLoop parks in the netpoller until stream j is readable, then polls.
// Most wake-ups find the data already taken by the owner's inline poll;
// they cost a little CPU, never latency.
func (p *peer) readLoop(j int) {
	defer p.wg.Done()
	_ = p.raws[j].Read(func(uintptr) bool {
		p.pollRx(true)
		return p.down.Load() || p.rxErr.Load() != nil
	})
}

// writeLoop finishes the writes that found stream j's socket full.
func (p *peer) writeLoop(j int) {
	defer p.wg.Done()
	for {
		select {
		case <-p.quit:
			return
		case <-p.arm[j]:
		}
		err := p.raws[j].Write(func(uintptr) bool {
			p.flushTx(j)
			return p.down.Load() || p.sendErr() != nil || p.tx.blocked.Load()&(1<<j) == 0
		})
		if err != nil {
			return
		}
	}
}

// pollRx runs receive passes until no request is left. Background passes
// ring the bell when they complete messages; the owner's inline passes need
// not, as the owner looks at the ring right after.
func (p *peer) pollRx(background bool) {
	rx := p.rx
	for rx.excl.enter() {
		if p.down.Load() || p.rxErr.Load() != nil {
			rx.excl.leave()
			return
		}
		completed, err := rx.pass()
		if err != nil {
			p.failRx(err)
		}
		again := rx.excl.leave()
		if err != nil || (completed && background) {
			p.ep.bell.Ring()
		}
		if !again {
			return
		}
	}
}

// flushTx runs send passes until no request is left. self is the stream
// whose writer is calling, or -1 for the owner.
func (p *peer) flushTx(self int) {
	tx := p.tx
	for tx.excl.enter() {
		if p.down.Load() || p.txErr.Load() != nil {
			tx.excl.leave()
			return
		}
		freed, err := tx.pass()
		if err != nil {
			p.failTx(err)
		}
		blocked := tx.blocked.Load()
		again := tx.excl.leave()
		if err != nil || (freed && self >= 0) {
			p.ep.bell.Ring()
		}
		if self >= 0 {
			blocked &^= 1 << self // that writer waits for room itself
		}
		for ; blocked != 0; blocked &= blocked - 1 {
			select {
			case p.arm[bits.TrailingZeros64(blocked)] <- struct{}{}:
			default:
			}
		}
		if !again {
			return
		}
	}
}

// failRx records why the peer can send no more and shuts its sockets, so
// every goroutine parked on them wakes and exits. Called inside rx.excl,
// so the descriptors are still open.
func (p *peer) failRx(err error) {
	cause := err
	if errors.Is(err, io.EOF) {
		cause = nil // a clean close
	}
	if p.rxErr.CompareAndSwap(nil, &failure{peerError(p.rank, cause)}) {
		p.ep.log.Info(fmt.Sprintf("rank %d lost rank %d", p.ep.rank, p.rank), "subsys", "NET", "err", err)
	}
	p.stopWriters()
	for _, fd := range p.fds {
		shutdownFD(fd)
	}
}

// failTx records that writes to the peer fail. Reading goes on, so the
// owner still gets what the peer sent before it went away.
func (p *peer) failTx(err error) {
	if p.txErr.CompareAndSwap(nil, &failure{peerError(p.rank, err)}) {
		p.ep.log.Info(fmt.Sprintf("rank %d cannot send to rank %d", p.ep.rank, p.rank), "subsys", "NET", "err", err)
	}
	p.stopWriters()
}

func (p *peer) stopWriters() { p.quitOnce.Do(func() { close(p.quit) }) }

// sendErr is the error a send to the peer reports, if any.
func (p *peer) sendErr() error {
	if f := p.rxErr.Load(); f != nil {
		return f.err
	}
	if f := p.txErr.Load(); f != nil {
		return f.err
	}
	return nil
}

// drainTx waits until everything committed is written, the peer is lost or
// the deadline passes.
func (p *peer) drainTx(deadline time.Time) {
	for {
		p.flushTx(-1)
		if p.tx.idle() || p.sendErr() != nil || time.Now().After(deadline) {
			return
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// sendAbort tells the peer why this rank aborts, if stream 0 is between
// frames and has room; otherwise the peer just sees the connection end.
func (p *peer) sendAbort(reason error) {
	p.tx.excl.lock()
	defer p.tx.excl.unlock()
	if p.down.Load() || p.sendErr() != nil || p.tx.cur[0].active {
		return
	}
	msg := reason.Error()
	if len(msg) > maxAbortReason {
		msg = msg[:maxAbortReason]
	}
	frame := make([]byte, frameHeaderLen+len(msg))
	putFrameHeader(frame, frameHeader{kind: frameAbort, length: uint32(len(msg))})
	copy(frame[frameHeaderLen:], msg)
	_, _ = writeFD(p.fds[0], frame[:frameHeaderLen], frame[frameHeaderLen:])
}

// shut closes the peer's sockets once no pass is running, then waits for
// its goroutines.
func (p *peer) shut() {
	p.rx.excl.lock()
	p.tx.excl.lock()
	p.down.Store(true)
	p.tx.excl.unlock()
	p.rx.excl.unlock()
	p.stopWriters()
	for _, c := range p.conns {
		c.Close()
	}
	p.wg.Wait()
}

// sender and receiver are the halves of a peer; pointer conversions, so
// handing them out as interfaces allocates nothing.
type sender peer
type receiver peer

// TryReserve returns the next staging slot. When all are still queued for
// the wire it first tries to write them out itself.
func (s *sender) TryReserve(n int) ([]byte, bool, error) {
	p := (*peer)(s)
	if n < 0 || n > p.tx.slotSize {
		return nil, false, fmt.Errorf("tcp: message of %d bytes exceeds slot size %d", n, p.tx.slotSize)
	}
	if p.ep.closed.Load() {
		return nil, false, transport.ErrClosed
	}
	// Nothing sent to a lost peer could ever be read: fail now rather than
	// report success for data that is lost.
	if err := p.sendErr(); err != nil {
		return nil, false, err
	}
	if b, ok := p.tx.reserve(n); ok {
		return b, true, nil
	}
	p.flushTx(-1)
	if b, ok := p.tx.reserve(n); ok {
		return b, true, nil
	}
	return nil, false, p.sendErr()
}

// Commit queues the reserved slot and writes it at once if the socket has
// room.
func (s *sender) Commit(tag transport.Tag) {
	p := (*peer)(s)
	if p.tx.commit(tag) {
		p.flushTx(-1)
	}
}

// TryNext returns the oldest message, reading the sockets itself when none
// is buffered. Messages that arrived before the peer was lost are delivered
// before the error.
func (v *receiver) TryNext() ([]byte, transport.Tag, bool, error) {
	p := (*peer)(v)
	if p.ep.closed.Load() {
		return nil, 0, false, transport.ErrClosed
	}
	if m, tag, ok := p.rx.peek(); ok {
		return m, tag, true, nil
	}
	p.pollRx(false)
	// Load the error before looking again: a failing pass publishes its
	// last messages before the error.
	f := p.rxErr.Load()
	if m, tag, ok := p.rx.peek(); ok {
		return m, tag, true, nil
	}
	if f != nil {
		return nil, 0, false, f.err
	}
	return nil, 0, false, nil
}

// Release frees the oldest message's slot. If reading had stopped for lack
// of a slot, it resumes here: the sender may be blocked on this room.
func (v *receiver) Release() {
	p := (*peer)(v)
	if p.rx.release() {
		p.pollRx(false)
	}
}
