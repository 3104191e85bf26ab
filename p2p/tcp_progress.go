package p2p

import (
	"errors"
	"fmt"
	"os"
	"time"
)

// Who reads a tcp connection's frames. Reading is a role, held by one
// goroutine at a time (tcpConn.reading): by default the peer's reader
// goroutine, but a goroutine in Wait on a small or inline post
// (waitsOnTCP) takes it while the reader is only polling for the next
// frame, and reads the answer to its post itself. Why: the answer is a round trip away, and handing it from
// the reader goroutine to the waiter costs a wake-up of the waiter's
// thread (a futex, then the scheduler finding it a core), which on these
// VMs cost more than the round trip; with one polling thread per process
// a 4 KiB round trip takes what the sockets take (docs/P2P.md, "TCP
// backend vs NIXL").
//
// The rules, so that no frame waits unread while nobody reads:
//   - Only the role's holder touches br or reads the socket. The waiter
//     reads the socket only by nonblocking reads through RawConn.Control,
//     never through the poller: the reader goroutine, parked in
//     RawConn.Read, holds the descriptor's read lock.
//   - The reader parks only without the role, in RawConn.Read, taking it
//     again when the socket has bytes and the role is free (takeIfReadable).
//   - A waiter handles only frames that arrived whole in br (so handling
//     them never waits for the socket) and whose handling never waits for
//     long; anything else it leaves to the reader.
//   - A waiter that lets go of the role with bytes in br or the socket
//     nudges the reader (a read deadline in the past): the poller may have
//     woken it for those bytes while the role was held, and it would
//     otherwise sleep until the next bytes arrive.
//   - On a connection out of the netpoller (tcp_fd_linux.go) a waiter
//     switches the parked reader's read interest off for its wait and
//     back on after (pauseReader, resumeReader): the bytes it reads
//     itself wake no thread.

// awaitFrame returns once the reader goroutine holds the role and a frame
// has begun to arrive (held: it holds the role now). It polls for a
// bounded, adaptive while first, and lets a waiter that asks take the
// role.
func (p *peer) awaitFrame(held bool) error {
	tc := p.tc
	var since int64 // when this wait for a frame began (0: unknown)
	for {
		if held {
			if p.br.Buffered() > 0 {
				return nil
			}
			// The holder polls for frames itself now: what arrives
			// meanwhile should wake nobody.
			tc.fc.quiet()
			// No spinning while bytes stream or replies wait to go out: on
			// a small host the copies and the responder need the cores.
			var sp spinner
			quiet := !tc.bulk.Load() && p.respWork.Load() == 0
			spinning := quiet && sp.begin(&tc.frames)
			since = 0
			if quiet {
				since = monoNow()
			}
			for {
				got, err := p.pollFrames()
				if err != nil {
					return err
				}
				if got {
					if spinning {
						sp.won()
					}
					return nil
				}
				if tc.want.Load() > 0 {
					since = 0 // a waiter reads: the wait below says nothing
					break
				}
				if spinning && p.respWork.Load() > 0 {
					since = 0
					break
				}
				if !spinning || !sp.again() {
					break
				}
			}
			held = false
			tc.reading.Store(false)
		}
		err := tc.raw.Read(tc.takeFn)
		switch {
		case err == nil:
			held = true
			if since != 0 && monoNow()-since <= spinRestoreNs {
				tc.frames.restore()
			}
		case errors.Is(err, os.ErrDeadlineExceeded): // a nudge
			p.conn.SetReadDeadline(time.Time{})
		default:
			return err
		}
	}
}

// takeIfReadable takes the role for the reader when nobody holds it and
// bytes wait, in br (a waiter left them) or in the socket (RawConn.Read's
// callback: false parks until the socket has new bytes, or a nudge).
func (p *peer) takeIfReadable(fd uintptr) bool {
	if !p.tc.reading.CompareAndSwap(false, true) {
		return false
	}
	if p.br.Buffered() > 0 || rawPeek(fd) {
		return true
	}
	p.tc.reading.Store(false)
	return false
}

func (s *tcpConn) peekOnce(fd uintptr) { s.peeked = rawPeek(fd) }

// socketHasBytes reports whether bytes (or an end) wait in the socket;
// anyone may ask.
func (s *tcpConn) socketHasBytes() bool {
	s.peekMu.Lock()
	defer s.peekMu.Unlock()
	s.peeked = true
	if s.raw.Control(s.peekFn) != nil {
		return true // closed: whoever reads finds out
	}
	return s.peeked
}

// pollFrames reads what the socket holds into br without waiting (the
// caller holds the role), and reports whether it read anything.
func (p *peer) pollFrames() (bool, error) {
	n := p.br.Buffered()
	if n == p.br.Size() {
		return false, nil // full: the frame at its head is larger
	}
	p.tc.poll = true
	_, err := p.br.Peek(n + 1) // reads from the socket only past what is buffered
	p.tc.poll = false
	switch {
	case err == nil:
		return true, nil
	case err == errNoBytes:
		return false, nil
	}
	return false, err
}

// releaseReading lets go of a waiter's role, nudging the reader if bytes
// wait (see the rules above).
func (p *peer) releaseReading() {
	left := p.br.Buffered() > 0
	p.tc.reading.Store(false)
	if left || p.tc.socketHasBytes() {
		p.conn.SetReadDeadline(time.Unix(1, 0))
	}
}

// progressWait waits for a small or inline tcp post (waitsOnTCP) by
// reading its answer on this goroutine, for a bounded, adaptive while
// (tcp_spin.go), and reports whether the post finished meanwhile (else the
// caller sleeps). It reads only what the request was made with, and
// postedInline, an atomic whose staleness costs at most a spin: another
// goroutine may be posting the request again.
func (r *Request) progressWait() bool {
	if !r.waitsOnTCP() {
		return false
	}
	r.a.mu.RLock()
	p := r.a.peers[r.peer]
	r.a.mu.RUnlock()
	if p == nil || p.tc == nil || p.tc.raw == nil {
		return false
	}
	tc := p.tc
	var sp spinner
	if !sp.begin(r.waitGauge()) {
		return false
	}
	tc.want.Add(1)
	tc.fc.pauseReader() // the reader must not wake for what this goroutine reads
	defer func() {
		tc.want.Add(-1)
		tc.fc.resumeReader()
	}()
	held := false
	for r.state.Load() == reqPosted {
		if !held {
			held = tc.reading.CompareAndSwap(false, true)
		}
		if held {
			done, leave := p.waiterFrame()
			if leave {
				break
			}
			if done {
				continue
			}
		}
		if !sp.again() {
			if held {
				p.releaseReading()
			}
			return false
		}
	}
	if held {
		p.releaseReading()
	}
	if r.state.Load() == reqPosted {
		return false
	}
	sp.won()
	return true
}

// waitsOnTCP: a post whose waiter reads the answer itself (progressWait):
// a small one, or one whose bytes Post put in the socket itself (inline),
// so that only the target's reading and the ack remain. A larger one is
// still being written by the lane while Wait runs: a waiter spinning
// through that copy on a small host would take the core it needs.
func (r *Request) waitsOnTCP() bool {
	return r.spec == &tcpSpec && !r.self && (r.bytes <= directMin || r.postedInline.Load())
}

// tcpWaits and tcpBulkWaits are the waiters' spin budgets, one each for
// the process (whether spinning pays depends on how busy the host's cores
// are): a streamed inline WRITE's ack comes later than a small post's
// answer, and its spins that run out must not cut the small posts' budget.
var tcpWaits, tcpBulkWaits spinGauge

func (r *Request) waitGauge() *spinGauge {
	if r.bytes > directMin {
		return &tcpBulkWaits
	}
	return &tcpWaits
}

// waiterFrame handles the next frame for a waiter holding the role, if it
// arrived whole and is one a waiter may handle. It reports whether it
// handled one, and whether the waiter should leave the rest to the reader
// (a frame it may not handle, or the connection failed).
func (p *peer) waiterFrame() (handled, leave bool) {
	if p.br.Buffered() < wireHeaderLen {
		if _, err := p.pollFrames(); err != nil {
			return false, true // the reader finds the error too
		}
		if p.br.Buffered() < wireHeaderLen {
			return false, false
		}
	}
	b, _ := p.br.Peek(wireHeaderLen)
	h, err := parseHeader(b)
	if err != nil || !waiterMayHandle(h) {
		return false, true
	}
	size := wireHeaderLen + int(min(h.payloadLen(), uint64(p.br.Size())))
	if size > p.br.Size() {
		return false, true
	}
	for p.br.Buffered() < size {
		if _, err := p.pollFrames(); err != nil {
			return false, true
		}
		if p.br.Buffered() < size {
			return false, false // the rest is on its way: poll again
		}
	}
	p.br.Discard(wireHeaderLen)
	p.lastRecv.Store(monoNow())
	if err := p.handle(h); err != nil {
		p.fail(fmt.Errorf("%w: %s: %v", ErrRemoteDisconnect, p.name, err), true)
		return true, true
	}
	return true, false
}

// waiterMayHandle: frames whose handling never waits for long (the RDMA
// barrier waits for deliveries; a goodbye or a hello ends or starts the
// connection, the reader's business).
func waiterMayHandle(h header) bool {
	switch h.op {
	case opAck, opReadResp, opWrite, opCommit, opNotif, opPing, opPong, opReadReq, opAbort, opInvalidate:
		return true
	}
	return false
}

// sleptTCP tells the waiters' spin budget about a Wait that slept until
// its post finished: an answer that came soon after the Wait's start
// restores the spin budget (tcp_spin.go).
func (r *Request) sleptTCP(since int64) {
	if at := r.progress.Load(); at-since <= spinRestoreNs {
		r.waitGauge().restore()
	}
}
