package shm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gccl/gccl/transport"
)

// Endpoint is a rank's shared-memory attachment to its local peers. Try
// calls, Commit, Release and Wait belong to one goroutine at a time (the
// rank's executor); Close and Abort may come from any goroutine.
type Endpoint struct {
	mb         *Mailbox
	rank, size int
	slotSize   int
	links      []*peerLink // by rank; nil for self and ranks on other hosts
	linkList   []*peerLink // the local peers, for scans
	closed     atomic.Bool
	closeMu    sync.Mutex

	// Liveness checks, rare and guarded by livenessMu (Close closes the
	// pidfds they poll).
	livenessMu   sync.Mutex
	nextLiveness time.Time
	pollFds      []unix.PollFd
	idleTries    uint32 // Try calls that found nothing to do; owner only
}

var _ transport.Endpoint = (*Endpoint)(nil)

// peerLink is everything about one local peer.
type peerLink struct {
	rank  int
	seg   *segment // our mapping of the peer's mailbox
	hdr   *header
	send  *sender   // our ring in the peer's mailbox
	recv  *receiver // the peer's ring in our mailbox
	pid   int       // 0: the peer's process cannot be watched
	pidfd int       // -1: watch with kill(pid, 0)

	dead      atomic.Bool           // its process exited without closing
	failure   atomic.Pointer[error] // the PeerError, built once
	seenState uint32                // for Endpoint.poll; owner only
}

// watch prepares the liveness check of the peer's process.
func (l *peerLink) watch(pid int, peerNS, myNS uint64) error {
	if peerNS != 0 && myNS != 0 && peerNS != myNS {
		// Another pid namespace (another container sharing /dev/shm): its
		// pid means nothing here. The peer's Close still reaches us; a
		// crash is left to the bootstrap heartbeat.
		return nil
	}
	l.pid = pid
	fd, err := unix.PidfdOpen(pid, 0)
	switch {
	case err == nil:
		l.pidfd = fd
	case errors.Is(err, unix.ESRCH):
		return &transport.PeerError{Peer: l.rank, Err: fmt.Errorf("%w: process %d of rank %d is not running", transport.ErrPeerClosed, pid, l.rank)}
	default:
		// No pidfds (kernel before 5.3, seccomp): kill(pid, 0) still tells
		// an exited process, though not a zombie, from a live one.
	}
	return nil
}

// err returns the link's failure, nil while the peer is open and alive. It
// is two loads of words that stay in cache.
func (l *peerLink) err() error {
	if atomic.LoadUint32(&l.hdr.state) == stateOpen && !l.dead.Load() {
		return nil
	}
	return l.failureErr()
}

func (l *peerLink) failureErr() error {
	if p := l.failure.Load(); p != nil {
		return *p
	}
	var err error
	switch atomic.LoadUint32(&l.hdr.state) {
	case stateAborted:
		n := min(int(atomic.LoadUint32(&l.hdr.reasonLen)), reasonMax)
		err = fmt.Errorf("%w: rank aborted: %s", transport.ErrPeerClosed, l.hdr.reason[:n])
	case stateClosed:
		err = transport.ErrPeerClosed
	default:
		err = fmt.Errorf("%w: process %d exited without closing (killed?)", transport.ErrPeerClosed, l.pid)
	}
	var e error = &transport.PeerError{Peer: l.rank, Err: err}
	l.failure.CompareAndSwap(nil, &e)
	return *l.failure.Load()
}

func (e *Endpoint) Rank() int     { return e.rank }
func (e *Endpoint) Size() int     { return e.size }
func (e *Endpoint) Name() string  { return "SHM" }
func (e *Endpoint) SlotSize() int { return e.slotSize }
func (e *Endpoint) Seq() uint64   { return e.mb.bell.Seq() }

// Wait sleeps on the mailbox's bell; see Mailbox.Bell.
func (e *Endpoint) Wait(ctx context.Context, seen uint64, deadline time.Time) error {
	if e.closed.Load() {
		return transport.ErrClosed
	}
	return e.mb.bell.Wait(ctx, seen, deadline)
}

func (e *Endpoint) link(peer int) (*peerLink, error) {
	if e.closed.Load() {
		return nil, transport.ErrClosed
	}
	if peer < 0 || peer >= e.size || peer == e.rank {
		return nil, fmt.Errorf("shm: rank %d has no peer %d", e.rank, peer)
	}
	l := e.links[peer]
	if l == nil {
		return nil, &transport.PeerError{Peer: peer, Err: errors.New("shm: not a local peer of this rank")}
	}
	return l, nil
}

// Sender returns the connection to peer. Every connection exists from
// Connect on; this allocates nothing.
func (e *Endpoint) Sender(peer int) (transport.Sender, error) {
	l, err := e.link(peer)
	if err != nil {
		return nil, err
	}
	return l.send, nil
}

// Receiver returns the connection from peer.
func (e *Endpoint) Receiver(peer int) (transport.Receiver, error) {
	l, err := e.link(peer)
	if err != nil {
		return nil, err
	}
	return l.recv, nil
}

// poll is the bell's look at the connections before it sleeps and after
// each slice: it reports whether any ring counter or peer state moved since
// the owner last looked (updating what it has seen, so each change wakes the
// owner once), or a peer was found dead.
func (e *Endpoint) poll() bool {
	changed := false
	for _, l := range e.linkList {
		if t := l.recv.ctr.tail.Load(); t != l.recv.seenTail {
			l.recv.seenTail, changed = t, true
		}
		if h := l.send.ctr.head.Load(); h != l.send.seenHead {
			l.send.seenHead, changed = h, true
		}
		if s := atomic.LoadUint32(&l.hdr.state); s != l.seenState {
			l.seenState, changed = s, true
		}
	}
	return e.checkLiveness(false) || changed
}

// idle is called by Try calls that found nothing to do. A caller that only
// polls (never sleeps in Wait) still gets its dead peers noticed.
func (e *Endpoint) idle() {
	e.idleTries++
	if e.idleTries%4096 == 0 {
		e.checkLiveness(false)
	}
}

// checkLiveness looks, at most every LivenessInterval unless forced, for
// peers whose process has exited, marks them dead and reports whether it
// found any.
func (e *Endpoint) checkLiveness(force bool) bool {
	now := time.Now()
	if !force && now.Before(e.nextLiveness) {
		return false
	}
	e.livenessMu.Lock()
	defer e.livenessMu.Unlock()
	if e.closed.Load() {
		return false
	}
	e.nextLiveness = now.Add(LivenessInterval)
	found := false
	fds := e.pollFds[:0]
	for _, l := range e.linkList {
		if l.dead.Load() || l.pid == 0 {
			continue
		}
		if l.pidfd >= 0 {
			fds = append(fds, unix.PollFd{Fd: int32(l.pidfd), Events: unix.POLLIN})
		} else if unix.Kill(l.pid, 0) == unix.ESRCH {
			l.dead.Store(true)
			found = true
		}
	}
	if len(fds) > 0 {
		// A pidfd polls readable once its process has exited, zombie or
		// not; one system call covers every peer.
		if n, _ := unix.Poll(fds, 0); n > 0 {
			for _, fd := range fds {
				if fd.Revents == 0 {
					continue
				}
				for _, l := range e.linkList {
					if l.pidfd == int(fd.Fd) && !l.dead.Load() {
						l.dead.Store(true)
						found = true
					}
				}
			}
		}
	}
	e.pollFds = fds
	return found
}

// Close tells the peers that this rank is gone (they see
// transport.ErrPeerClosed once they have drained what it sent), wakes them
// and this rank's waiter, and releases the mailboxes.
func (e *Endpoint) Close() error { return e.shut(nil) }

// Abort is Close after a failure: peers see transport.ErrPeerClosed with
// err's text.
func (e *Endpoint) Abort(err error) {
	if err == nil {
		err = errors.New("aborted")
	}
	e.shut(err)
}

func (e *Endpoint) shut(reason error) error {
	e.closeMu.Lock()
	defer e.closeMu.Unlock()
	if e.closed.Swap(true) {
		return nil
	}
	h := e.mb.hdr
	state := stateClosed
	if reason != nil {
		n := copy(h.reason[:], reason.Error())
		atomic.StoreUint32(&h.reasonLen, uint32(n))
		state = stateAborted
	}
	// The state store publishes the reason written before it.
	atomic.StoreUint32(&h.state, state)
	for _, l := range e.linkList {
		ring(l.hdr)
	}
	e.release()
	return nil
}

// release drops the peers' mailboxes and closes this one.
func (e *Endpoint) release() {
	e.dropLinks()
	e.mb.Close()
}

// dropLinks closes the pidfds and drops the mappings of the peers' mailboxes.
func (e *Endpoint) dropLinks() {
	e.closed.Store(true)
	e.livenessMu.Lock()
	for _, l := range e.links {
		if l != nil && l.pidfd >= 0 {
			unix.Close(l.pidfd)
			l.pidfd = -1
		}
	}
	e.livenessMu.Unlock()
	for _, l := range e.links {
		if l != nil {
			l.seg.drop()
		}
	}
}

// sender is the producing half of the ring from this rank to a peer, which
// lies in the peer's mailbox. Its counters are the only words it shares;
// tail and a recent head are cached here.
type sender struct {
	ctr      *ringCounters
	metas    []slotMeta
	slots    [][]byte // each slotSize bytes, capacity included
	count    uint64
	slotSize int
	tail     uint64 // slots committed; this side is the only writer
	seenHead uint64 // head as last read: a lower bound of the real one
	idx      int    // tail % count
	peerHdr  *header
	link     *peerLink
	ep       *Endpoint
}

// receiver is the consuming half of the ring from a peer, in this rank's
// mailbox.
type receiver struct {
	ctr      *ringCounters
	metas    []slotMeta
	slots    [][]byte
	count    uint64
	slotSize int
	head     uint64 // slots released; this side is the only writer
	seenTail uint64 // tail as last read
	idx      int    // head % count
	peerHdr  *header
	link     *peerLink
	ep       *Endpoint
}

func ringParts(seg *segment, off int, g geometry) (*ringCounters, []slotMeta, [][]byte) {
	ctr := (*ringCounters)(seg.at(off))
	metas := unsafe.Slice((*slotMeta)(seg.at(off+metaOff)), g.slotCount)
	slots := make([][]byte, g.slotCount)
	for i := range slots {
		slots[i] = seg.bytes(off+g.dataOff+i*g.slotStride, g.slotSize)
	}
	return ctr, metas, slots
}

func newSender(ep *Endpoint, l *peerLink, peerSeg *segment, off int, g geometry) *sender {
	ctr, metas, slots := ringParts(peerSeg, off, g)
	s := &sender{ctr: ctr, metas: metas, slots: slots, count: uint64(g.slotCount), slotSize: g.slotSize,
		peerHdr: l.hdr, link: l, ep: ep}
	// A fresh ring is empty, but read the counters anyway: cheap, and right
	// should a segment ever be reused.
	s.tail = ctr.tail.Load()
	s.seenHead = ctr.head.Load()
	s.idx = int(s.tail % s.count)
	return s
}

func newReceiver(ep *Endpoint, l *peerLink, mySeg *segment, off int, g geometry) *receiver {
	ctr, metas, slots := ringParts(mySeg, off, g)
	r := &receiver{ctr: ctr, metas: metas, slots: slots, count: uint64(g.slotCount), slotSize: g.slotSize,
		peerHdr: l.hdr, link: l, ep: ep}
	r.head = ctr.head.Load()
	r.seenTail = ctr.tail.Load()
	r.idx = int(r.head % r.count)
	return r
}

// TryReserve returns the next free slot, n bytes long. The fast path reads
// only this process's cached head; the shared head is loaded when the ring
// looks full.
func (s *sender) TryReserve(n int) ([]byte, bool, error) {
	if uint(n) > uint(s.slotSize) {
		return nil, false, fmt.Errorf("shm: message of %d bytes exceeds slot size %d", n, s.slotSize)
	}
	if s.ep.closed.Load() {
		return nil, false, transport.ErrClosed
	}
	// Nothing sent to a closed or dead peer could ever be read.
	if err := s.link.err(); err != nil {
		return nil, false, err
	}
	if s.tail-s.seenHead >= s.count {
		// The load is an acquire: the receiver's reads of the slot it
		// released happened before; we may overwrite it.
		s.seenHead = s.ctr.head.Load()
		if used := s.tail - s.seenHead; used >= s.count {
			if used > s.count {
				return nil, false, s.corrupt("head %d ahead of tail %d", s.seenHead, s.tail)
			}
			s.ep.idle()
			return nil, false, nil
		}
	}
	s.metas[s.idx].len = uint64(n)
	return s.slots[s.idx][:n:n], true, nil
}

// Commit publishes the reserved slot.
func (s *sender) Commit(tag transport.Tag) {
	s.metas[s.idx].tag = uint64(tag)
	s.tail++
	if s.idx++; s.idx == len(s.slots) {
		s.idx = 0
	}
	// A sequentially consistent store: a release, so the receiver that
	// loads the new tail sees the slot's data, length and tag; and a full
	// barrier before notify reads the receiver's sleeper count.
	s.ctr.tail.Store(s.tail)
	notify(s.peerHdr)
}

func (s *sender) corrupt(format string, args ...any) error {
	if s.ep.closed.Load() {
		return transport.ErrClosed
	}
	return &transport.PeerError{Peer: s.link.rank, Err: fmt.Errorf("shm: ring to rank %d is corrupt: %s", s.link.rank, fmt.Sprintf(format, args...))}
}

// TryNext returns the oldest unreleased message. The fast path, when a
// message is known to be there, touches no shared counter; otherwise it is
// one load of the tail.
func (r *receiver) TryNext() ([]byte, transport.Tag, bool, error) {
	if r.ep.closed.Load() {
		return nil, 0, false, transport.ErrClosed
	}
	if r.head == r.seenTail {
		// Acquire: the sender's writes of the slot precede its tail store.
		r.seenTail = r.ctr.tail.Load()
		if r.head == r.seenTail {
			if err := r.idleErr(); err != nil || r.head == r.seenTail {
				return nil, 0, false, err
			}
		}
	}
	if r.seenTail-r.head > r.count {
		return nil, 0, false, r.corrupt("tail %d more than %d slots ahead of head %d", r.seenTail, r.count, r.head)
	}
	m := &r.metas[r.idx]
	n := m.len
	if n > uint64(r.slotSize) {
		return nil, 0, false, r.corrupt("message of %d bytes in a %d-byte slot", n, r.slotSize)
	}
	return r.slots[r.idx][:n:n], transport.Tag(m.tag), true, nil
}

// idleErr is TryNext's answer on an empty ring: the peer's failure once
// everything it committed has been read.
func (r *receiver) idleErr() error {
	err := r.link.err()
	if err == nil {
		r.ep.idle()
		return nil
	}
	// The peer may have committed after our tail load and before it
	// closed or died: drain that first.
	if t := r.ctr.tail.Load(); t != r.head {
		r.seenTail = t
		return nil
	}
	return err
}

// Release hands the oldest message's slot back to the sender.
func (r *receiver) Release() {
	r.head++
	if r.idx++; r.idx == len(r.slots) {
		r.idx = 0
	}
	// Release store (our reads of the slot are done) and full barrier
	// before notify, as in Commit.
	r.ctr.head.Store(r.head)
	notify(r.peerHdr)
}

func (r *receiver) corrupt(format string, args ...any) error {
	if r.ep.closed.Load() {
		return transport.ErrClosed
	}
	return &transport.PeerError{Peer: r.link.rank, Err: fmt.Errorf("shm: ring from rank %d is corrupt: %s", r.link.rank, fmt.Sprintf(format, args...))}
}
