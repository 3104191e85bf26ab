package tcp

import (
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gccl/gccl/transport"
)

// peer is the connection with one other rank: its streams' sockets and the
// two rings. The owner moves data inline (Commit writes, TryNext reads); the
// endpoint's watcher goroutine moves it when the owner cannot: it finishes
// writes that found a socket full, and it reads and rings the bell while the
// owner sleeps.
//
// Each socket's interest in the watcher's epoll set is armed on demand:
//   - write interest when a write found the socket full;
//   - read interest on the streams that expect data, while the owner
//     sleeps (Endpoint.PrepareWait). While the owner polls, nobody else is
//     woken by arriving data, which on a small machine is worth several µs
//     per message. A caller that sleeps without PrepareWait is still safe:
//     until the first PrepareWait, read interest stays armed all the time.
type peer struct {
	ep   *Endpoint
	rank int
	fds  []int
	sec  []*secureStream // by stream, with TLS; nil without
	tx   *txRing
	rx   *rxRing

	up    atomic.Bool             // install is done: fds and sec are set
	rxErr atomic.Pointer[failure] // set once the peer can send no more
	txErr atomic.Pointer[failure] // set once nothing more reaches the peer
	down  atomic.Bool             // the endpoint is closing the sockets: no more I/O
	// rxSleeping: a sleeper announced itself (PrepareWait) and this peer's
	// receiver has not polled since, so arriving data must wake the watcher.
	rxSleeping atomic.Bool

	watches []streamWatch
}

// streamWatch is one socket's registration in the watcher's epoll set.
type streamWatch struct {
	mu    sync.Mutex // serializes re-arming
	armed uint32     // interest armed in the kernel; 0 once it fired
}

type failure struct{ err error }

// newPeer makes the connection with rank, without its sockets yet
// (install); secure says whether its streams will run TLS.
func newPeer(e *Endpoint, rank int, cfg *Config, secure bool) *peer {
	p := &peer{ep: e, rank: rank, watches: make([]streamWatch, cfg.Streams)}
	read, write := p.readStream, p.writeStream
	if secure {
		read, write = p.readTLS, p.writeTLS
	}
	p.rx = newRxRing(cfg.SlotSize, cfg.SlotCount, cfg.Streams, read)
	p.rx.shortDrains = !secure
	p.tx = newTxRing(cfg.SlotSize, cfg.SlotCount, cfg.Streams, write)
	return p
}

// install takes the peer's connected streams over: their descriptors leave
// the net package and join the watcher's epoll set. The caller sets up
// once it returns nil; until then no pass touches the sockets. On error
// every stream is closed.
func (p *peer) install(conns []*net.TCPConn, sec []*secureStream) error {
	fds := make([]int, 0, len(conns))
	fail := func(err error) error {
		for _, fd := range fds {
			closeFD(fd)
		}
		for _, c := range conns[len(fds):] {
			c.Close()
		}
		return err
	}
	for _, c := range conns {
		if err := c.SetNoDelay(true); err != nil {
			return fail(fmt.Errorf("tcp: TCP_NODELAY with rank %d: %w", p.rank, err))
		}
		fd, err := detachFD(c)
		if err != nil {
			return fail(fmt.Errorf("tcp: taking over the socket to rank %d: %w", p.rank, err))
		}
		if sec != nil {
			sec[len(fds)].raw.fd = fd
		}
		fds = append(fds, fd)
	}
	for j, fd := range fds {
		if err := p.ep.poll.add(fd, p.rank, j); err != nil {
			return fail(fmt.Errorf("tcp: watching the socket to rank %d: %w", p.rank, err))
		}
	}
	p.fds, p.sec = fds, sec
	return nil
}

// failConnect records that the pair could not connect: the owner's sends
// and receives report err, naming the peer.
func (p *peer) failConnect(err error) {
	f := &failure{&transport.PeerError{Peer: p.rank, Err: err}}
	p.txErr.CompareAndSwap(nil, f)
	if p.rxErr.CompareAndSwap(nil, f) {
		p.ep.log.Warn(fmt.Sprintf("rank %d cannot connect to rank %d", p.ep.rank, p.rank), "subsys", "NET", "err", err)
	}
	p.ep.bell.Ring()
}

func (p *peer) readStream(j int, b []byte) (int, error) { return readFD(p.fds[j], b) }

func (p *peer) writeStream(j int, hdr, payload []byte) (int, error) {
	return writeFD(p.fds[j], hdr, payload)
}

func (p *peer) closeFDs() {
	for _, fd := range p.fds {
		closeFD(fd)
	}
	p.fds = nil
}

// readersArmed reports whether arriving data should wake the watcher.
func (p *peer) readersArmed() bool { return !p.ep.waitHooked.Load() || p.rxSleeping.Load() }

// interest is what socket j should be armed for now.
func (p *peer) interest(j int) uint32 {
	var w uint32
	if p.rxErr.Load() != nil {
		return 0
	}
	if p.rx.want.Load()&(1<<j) != 0 && p.readersArmed() {
		w |= wantRead
	}
	if p.txErr.Load() == nil && p.tx.blocked.Load()&(1<<j) != 0 {
		w |= wantWrite
	}
	return w
}

// watch arms socket j for the events it needs and is not armed for yet.
// Extra interest left armed costs at most one spurious event.
func (p *peer) watch(j int) {
	s := &p.watches[j]
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.down.Load() || !p.up.Load() {
		return
	}
	w := p.interest(j)
	if w&^s.armed == 0 {
		return
	}
	if err := p.ep.poll.arm(p.fds[j], p.rank, j, w|s.armed); err != nil {
		p.ep.log.Warn("tcp: cannot watch a socket", "subsys", "NET", "peer", p.rank, "stream", j, "err", err)
		return
	}
	s.armed |= w
}

// watchAll re-arms every socket of the peer as needed.
func (p *peer) watchAll() {
	for j := range p.watches {
		p.watch(j)
	}
}

// onEvent handles what the watcher saw on socket j: the socket is disarmed
// now (one-shot), so make progress and arm it again as needed.
func (p *peer) onEvent(ev pollEvent) {
	s := &p.watches[ev.stream]
	s.mu.Lock()
	s.armed = 0
	s.mu.Unlock()
	if ev.readable || ev.hangup {
		p.pollRx(true)
	}
	if ev.writable || ev.hangup {
		p.flushTx(true)
	}
	p.watchAll()
}

// pollRx runs receive passes until no request is left. Background passes
// ring the bell when they complete messages; the owner's inline passes need
// not, as the owner looks at the ring right after.
func (p *peer) pollRx(background bool) {
	if !p.up.Load() {
		return // nothing to read before the sockets are there
	}
	rx := p.rx
	if !background && rx.excl.busy.Load() {
		// The watcher is reading. If it lost its processor in a system
		// call, spinning here would keep it from finishing: yield.
		runtime.Gosched()
	}
	for rx.excl.enter() {
		if p.down.Load() || p.rxErr.Load() != nil {
			rx.excl.leave()
			return
		}
		want := rx.want.Load()
		completed, err := rx.pass()
		if err != nil {
			p.failRx(err)
		}
		changed := want ^ rx.want.Load()
		again := rx.excl.leave()
		if err != nil || (completed && background) {
			p.ep.bell.Ring()
		}
		// Streams that started or stopped expecting data need their read
		// interest updated, if readers are armed at all. (The watcher
		// re-arms everything after its own passes.)
		if !background && changed != 0 && p.readersArmed() {
			for ; changed != 0; changed &= changed - 1 {
				p.watch(bits.TrailingZeros64(changed))
			}
		}
		if !again {
			return
		}
	}
}

// flushTx runs send passes until no request is left, and arms write
// interest on the sockets that were full.
func (p *peer) flushTx(background bool) {
	if !p.up.Load() {
		return // the connection flushes what queued once it is up
	}
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
		if err != nil || (freed && background) {
			p.ep.bell.Ring()
		}
		if !background {
			for ; blocked != 0; blocked &= blocked - 1 {
				p.watch(bits.TrailingZeros64(blocked))
			}
		}
		if !again {
			return
		}
	}
}

// failRx records why the peer can send no more and shuts its sockets.
// Called inside rx.excl, so the descriptors are still open.
func (p *peer) failRx(err error) {
	cause := err
	if errors.Is(err, io.EOF) {
		cause = nil // a clean close
	}
	if p.rxErr.CompareAndSwap(nil, &failure{peerError(p.rank, cause)}) {
		p.ep.log.Info(fmt.Sprintf("rank %d lost rank %d", p.ep.rank, p.rank), "subsys", "NET", "err", err)
	}
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
}

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
		p.flushTx(false)
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
	if !p.up.Load() || p.down.Load() || p.sendErr() != nil || p.tx.cur[0].active {
		return
	}
	msg := reason.Error()
	if len(msg) > maxAbortReason {
		msg = msg[:maxAbortReason]
	}
	frame := make([]byte, frameHeaderLen+len(msg))
	putFrameHeader(frame, frameHeader{kind: frameAbort, length: uint32(len(msg))})
	copy(frame[frameHeaderLen:], msg)
	if p.sec != nil {
		if !p.sec[0].raw.pending() {
			_, _ = p.writeTLS(0, frame[:frameHeaderLen], frame[frameHeaderLen:])
		}
		return
	}
	_, _ = writeFD(p.fds[0], frame[:frameHeaderLen], frame[frameHeaderLen:])
}

// stop ends all I/O on the peer's sockets but the caller's, once the
// watcher has stopped: it waits out any pass or re-arm still running and
// keeps new ones out until release. The descriptors stay open.
func (p *peer) stop() {
	p.down.Store(true)
	// Empty critical sections: wait out any watch that saw down unset.
	for j := range p.watches {
		p.watches[j].mu.Lock()
		p.watches[j].mu.Unlock()
	}
	p.rx.excl.lock()
	p.tx.excl.lock()
}

// release closes the sockets of a stopped peer.
func (p *peer) release() {
	p.closeFDs()
	p.tx.excl.unlock()
	p.rx.excl.unlock()
}

// sender and receiver are the halves of a peer; pointer conversions, so
// handing them out as interfaces allocates nothing.
type sender peer
type receiver peer

var (
	_ transport.RefSender    = (*sender)(nil)
	_ transport.PostReceiver = (*receiver)(nil)
)

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
	p.flushTx(false)
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
		p.flushTx(false)
	}
}

// TrySendRef queues p to be written straight from the caller's memory, and
// writes it at once if the socket has room.
func (s *sender) TrySendRef(b []byte, tag transport.Tag) (bool, error) {
	p := (*peer)(s)
	if len(b) > p.tx.slotSize {
		return false, fmt.Errorf("tcp: message of %d bytes exceeds slot size %d", len(b), p.tx.slotSize)
	}
	if p.ep.closed.Load() {
		return false, transport.ErrClosed
	}
	if err := p.sendErr(); err != nil {
		return false, err
	}
	if !p.tx.reserveRef(b) {
		p.flushTx(false)
		if !p.tx.reserveRef(b) {
			return false, p.sendErr()
		}
	}
	p.tx.commit(tag)
	p.flushTx(false)
	return true, nil
}

// Flushed reports whether every committed message is in the kernel, writing
// what it can first.
func (s *sender) Flushed() (bool, error) {
	p := (*peer)(s)
	if p.tx.idle() {
		return true, nil
	}
	if p.ep.closed.Load() {
		return false, transport.ErrClosed
	}
	p.flushTx(false)
	if p.tx.idle() {
		return true, nil
	}
	return false, p.sendErr()
}

// Post asks that a message land in b rather than a slot (see
// transport.PostReceiver).
func (v *receiver) Post(ahead int, b []byte) bool { return (*peer)(v).rx.post(ahead, b) }

// PostWindow is how many messages ahead Post accepts.
func (v *receiver) PostWindow() int { return (*peer)(v).rx.postWindow() }

// TryNext returns the oldest message, reading the sockets itself when none
// is buffered. Messages that arrived before the peer was lost are delivered
// before the error.
func (v *receiver) TryNext() ([]byte, transport.Tag, bool, error) {
	p := (*peer)(v)
	if p.ep.closed.Load() {
		return nil, 0, false, transport.ErrClosed
	}
	if p.rxSleeping.Load() {
		p.rxSleeping.Store(false) // the receiver polls again
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
