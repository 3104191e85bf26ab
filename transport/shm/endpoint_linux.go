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

	"github.com/gccl/gccl/internal/memops"
	"github.com/gccl/gccl/transport"
)

// Endpoint is a rank's shared-memory attachment to its local peers. Try
// calls, Commit, Release and Wait belong to one goroutine at a time (the
// rank's executor); Close and Abort may come from any goroutine, even while
// that goroutine is inside a Try call.
//
// Seq and Wait are the mailbox bell's (Mailbox.Bell); a Mux over this
// endpoint must use that bell. Peers bump Seq only when this rank sleeps: a
// commit or release while it is awake leaves Seq alone, because Wait itself
// re-checks the rings this rank found empty or full before it sleeps. So a
// caller must not read "Seq unchanged" as "nothing happened"; it must Try
// again after every return of Wait, which is what the executor does.
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
	rank    int
	seg     *segment // our mapping of the peer's mailbox header
	hdr     *header
	table   []uint64  // the peer's ring table, in seg
	fd      int       // the peer's mailbox, to map its ring to us; -1 once closed
	send    *sender   // our ring to the peer, in our mailbox; nil until the first Sender
	recv    *receiver // the peer's ring to us; nil until the first Receiver
	sendSeg *segment  // our mapping of our ring to the peer
	recvSeg *segment  // our mapping of the peer's ring to us, once the peer made it
	pid     int       // 0: the peer's process cannot be watched
	pidfd   int       // -1: watch with kill(pid, 0)

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

// testHookReadingReason, when set, runs between loading an aborted peer's
// reason length and copying its reason.
var testHookReadingReason func()

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
	state := atomic.LoadUint32(&l.hdr.state)
	var reason string
	if state == stateAborted {
		n := min(int(atomic.LoadUint32(&l.hdr.reasonLen)), reasonMax)
		if testHookReadingReason != nil {
			testHookReadingReason()
		}
		reason = string(l.hdr.reason[:n])
	}
	// This rank's own Close, from another goroutine, maps zeros over the
	// peer's header (segment.drop) and may have done so while we read it:
	// the reason may be NULs and the state "open". Such a read says nothing
	// about the peer; this rank is closed.
	if l.seg.dropped.Load() {
		return transport.ErrClosed
	}
	var err error
	switch state {
	case stateAborted:
		err = fmt.Errorf("%w: rank aborted: %s", transport.ErrPeerClosed, reason)
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

// Sender returns the connection to peer. The first call makes the ring in
// this rank's mailbox (reserving its memory: a full /dev/shm fails here,
// naming the pair) and publishes it to the peer without waiting for it;
// later calls allocate nothing.
func (e *Endpoint) Sender(peer int) (transport.Sender, error) {
	l, err := e.link(peer)
	if err != nil {
		return nil, err
	}
	if l.send == nil {
		return e.connectSend(l)
	}
	return l.send, nil
}

func (e *Endpoint) connectSend(l *peerLink) (transport.Sender, error) {
	e.closeMu.Lock()
	defer e.closeMu.Unlock()
	if e.closed.Load() {
		return nil, transport.ErrClosed
	}
	seg, off, err := e.mb.addRing(l.rank)
	if err != nil {
		return nil, &transport.PeerError{Peer: l.rank, Err: err}
	}
	l.sendSeg = seg
	ctr, metas, small, slots := ringParts(seg, 0, e.mb.geo)
	l.send = &sender{ctr: ctr, metas: metas, small: small, slots: slots, count: uint64(e.mb.geo.slotCount), slotSize: e.slotSize,
		smallLimit: e.mb.geo.smallLimit(), peerHdr: l.hdr, link: l, ep: e, off: off,
		limit: make([]int, e.mb.geo.slotCount)}
	// Publish the ring (its zeroed counters are in place), then ring the
	// peer: it may sleep waiting for this ring's first message.
	atomic.StoreUint64(&e.mb.table[l.rank], uint64(off))
	ring(l.hdr)
	return l.send, nil
}

// Receiver returns the connection from peer. The peer's ring is mapped when
// the peer has made it (at its first Sender to this rank); until then the
// receiver finds no message, and maps the ring on the first look after
// the peer published it. Receiving thus never waits on connecting, and a
// rank may send before its peer has asked for anything.
func (e *Endpoint) Receiver(peer int) (transport.Receiver, error) {
	l, err := e.link(peer)
	if err != nil {
		return nil, err
	}
	if l.recv == nil {
		r := &receiver{count: 1, slotSize: e.slotSize, smallLimit: inlineMax, peerHdr: l.hdr, link: l, ep: e}
		r.metas = r.none[:]
		l.recv = r
		if err := r.attach(); err != nil {
			return nil, err
		}
	}
	return l.recv, nil
}

// attach maps the peer's ring to this rank once the peer has published it.
// It reports no error while the ring is not there yet.
func (r *receiver) attach() error {
	e, l := r.ep, r.link
	off := atomic.LoadUint64(&l.table[e.rank])
	if off == ringLocal {
		return nil
	}
	e.closeMu.Lock()
	defer e.closeMu.Unlock()
	if e.closed.Load() {
		return transport.ErrClosed
	}
	g := e.mb.geo
	if off < uint64(g.headerSize) || off%pageSize != 0 || (off-uint64(g.headerSize))%uint64(g.ringStride) != 0 {
		return &transport.PeerError{Peer: l.rank, Err: fmt.Errorf("shm: rank %d published its ring to rank %d at offset %d, not a ring's place", l.rank, e.rank, off)}
	}
	// Not populated: the slot data may still be a hole (addRing).
	seg, err := mapSegmentAt(l.fd, int64(off), g.ringStride, false)
	if err != nil {
		return &transport.PeerError{Peer: l.rank, Err: fmt.Errorf("shm: mapping the ring from rank %d: %w", l.rank, err)}
	}
	l.recvSeg = seg
	// The sender reserved the lines: take their first touches here, not
	// in the messages of the first lap.
	_ = memops.Prefault(seg.bytes(0, g.smallOff), false)
	r.ctr, r.metas, r.small, r.slots = ringParts(seg, 0, g)
	r.count, r.smallLimit = uint64(g.slotCount), g.smallLimit()
	return nil
}

// poll is the bell's look at the connections before it sleeps and after
// each slice. It reports whether a ring the owner found empty now has a
// message, a ring it found full now has a free slot, a peer changed state,
// or a peer was found dead; each such change is reported once.
func (e *Endpoint) poll() bool {
	changed := false
	for _, l := range e.linkList {
		if r := l.recv; r != nil && r.empty && r.metas[r.line].seq.Load() == r.head+1 {
			r.empty, changed = false, true
		}
		if s := l.send; s != nil && s.full && s.ctr.head.Load() != s.seenHead {
			s.full, changed = false, true
		}
		if st := atomic.LoadUint32(&l.hdr.state); st != l.seenState {
			l.seenState, changed = st, true
		}
	}
	return e.checkLiveness() || changed
}

// idle is called by Try calls that found nothing to do. A caller that only
// polls (never sleeps in Wait) still gets its dead peers noticed.
func (e *Endpoint) idle() {
	e.idleTries++
	if e.idleTries%4096 == 0 {
		e.checkLiveness()
	}
}

// checkLiveness looks, at most every LivenessInterval, for peers whose
// process has exited, marks them dead and reports whether it found any. Only
// the owner calls it (from Try calls and Wait).
func (e *Endpoint) checkLiveness() bool {
	now := time.Now()
	if now.Before(e.nextLiveness) {
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
		if l == nil {
			continue
		}
		l.seg.drop()
		for _, s := range []*segment{l.sendSeg, l.recvSeg} {
			if s != nil {
				s.drop()
			}
		}
		if l.fd >= 0 {
			unix.Close(l.fd)
			l.fd = -1
		}
	}
}

// sender is the producing half of the ring from this rank to a peer, which
// lies in the peer's mailbox. Only the slots' lines and the head are
// shared; the count of committed messages and a recent head live here.
type sender struct {
	ctr        *ringCounters
	metas      []slotMeta
	small      [][]byte // smallCount areas of smallSize bytes; nil without
	slots      [][]byte // each slotSize bytes, capacity included
	count      uint64   // data slots
	slotSize   int
	smallLimit int    // the longest message that needs no data slot
	smallReady bool   // the small data areas are reserved
	tail       uint64 // messages committed
	seenHead   uint64 // head as last read: a lower bound of the real one
	line       int    // tail % len(metas)
	sm         int    // tail % len(small): the small data area
	idx        int    // tail % count: the data slot
	n          int    // length of the reserved message
	full       bool   // the last TryReserve found no slot (for poll)
	peerHdr    *header
	link       *peerLink
	ep         *Endpoint
	off        int   // the ring's offset in this rank's mailbox
	limit      []int // per slot, the longest message its reserved pages hold
}

// receiver is the consuming half of the ring from a peer, in the peer's
// mailbox.
type receiver struct {
	none       [1]slotMeta // metas until the ring is mapped: never ready
	ctr        *ringCounters
	metas      []slotMeta
	small      [][]byte
	slots      [][]byte
	count      uint64 // data slots
	slotSize   int
	smallLimit int
	head       uint64 // messages released; this side is the only writer
	line       int    // head % len(metas)
	sm         int    // head % len(small): the small data area
	idx        int    // head % count: the data slot
	empty      bool   // the last TryNext found no message (for poll)
	peerHdr    *header
	link       *peerLink
	ep         *Endpoint
}

func ringParts(seg *segment, off int, g geometry) (*ringCounters, []slotMeta, [][]byte, [][]byte) {
	ctr := (*ringCounters)(seg.at(off))
	metas := unsafe.Slice((*slotMeta)(seg.at(off+metaOff)), g.lineCount)
	var small [][]byte
	if g.smallSize > 0 {
		small = make([][]byte, g.smallCount)
		for i := range small {
			small[i] = seg.bytes(off+g.smallOff+i*g.smallSize, g.smallSize)
		}
	}
	slots := make([][]byte, g.slotCount)
	for i := range slots {
		slots[i] = seg.bytes(off+g.dataOff+i*g.slotStride, g.slotSize)
	}
	return ctr, metas, small, slots
}

// TryReserve returns the next free slot, n bytes long: in the slot's line
// for a small message, else in its data area. The fast path reads only
// this process's cached head; the shared head is loaded when the ring looks
// full.
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
	// A message in its line needs a free line; a longer one its small
	// area or its data slot too, free once the message that many areas or
	// slots back is released.
	lines := uint64(len(s.metas))
	room := lines
	switch {
	case n > s.smallLimit:
		room = s.count
	case n > inlineMax:
		room = uint64(len(s.small))
	}
	if s.tail-s.seenHead >= room {
		// An acquire load: the receiver finished reading the slots it
		// released before it stored head, so we may overwrite them.
		s.seenHead = s.ctr.head.Load()
		if used := s.tail - s.seenHead; used >= room {
			if used > lines {
				return nil, false, s.corrupt("head %d ahead of tail %d", s.seenHead, s.tail)
			}
			s.full = true
			s.ep.idle()
			return nil, false, nil
		}
	}
	s.full = false
	s.n = n
	if n <= inlineMax {
		return s.metas[s.line].inline[:n:n], true, nil
	}
	if n <= s.smallLimit {
		if !s.smallReady {
			if err := s.reserveSmall(); err != nil {
				return nil, false, err
			}
		}
		return s.small[s.sm][:n:n], true, nil
	}
	if n > s.limit[s.idx] {
		if err := s.reserveSlot(n); err != nil {
			return nil, false, err
		}
	}
	return s.slots[s.idx][:n:n], true, nil
}

// reserveSmall reserves the ring's small data areas, at the first message
// that needs one.
func (s *sender) reserveSmall() error {
	err := s.reserve(func(mb *Mailbox) error { return mb.reserveSmall(s.link.sendSeg, s.off, s.link.rank) })
	if err != nil {
		return err
	}
	s.smallReady = true
	return nil
}

// reserveSlot reserves the current slot's data for a message of n bytes,
// the first that long in this slot (Mailbox.addRing says why it waits
// until then).
func (s *sender) reserveSlot(n int) error {
	err := s.reserve(func(mb *Mailbox) error { return mb.reserveSlot(s.link.sendSeg, s.off, s.idx, n, s.link.rank) })
	if err != nil {
		return err
	}
	// Whole pages are reserved: record what they hold, so that messages
	// growing a little at a time do not each take this path.
	g := &s.ep.mb.geo
	start := g.dataOff + s.idx*g.slotStride
	s.limit[s.idx] = min(roundUp(start+n, pageSize)-start, s.slotSize)
	return nil
}

// reserve runs grow, a reservation in this rank's mailbox file, under
// closeMu so that the file is still open. grow does not escape: the
// closures above stay on the stack.
func (s *sender) reserve(grow func(*Mailbox) error) error {
	e := s.ep
	e.closeMu.Lock()
	defer e.closeMu.Unlock()
	if e.closed.Load() {
		return transport.ErrClosed
	}
	if err := grow(e.mb); err != nil {
		return &transport.PeerError{Peer: s.link.rank, Err: err}
	}
	return nil
}

// Commit publishes the reserved slot.
func (s *sender) Commit(tag transport.Tag) {
	m := &s.metas[s.line]
	m.len = uint32(s.n)
	m.tag = uint64(tag)
	s.tail++
	if s.line++; s.line == len(s.metas) {
		s.line = 0
	}
	if s.sm++; s.sm >= len(s.small) {
		s.sm = 0
	}
	if s.idx++; s.idx == len(s.slots) {
		s.idx = 0
	}
	// A sequentially consistent store, last: a release, so the receiver
	// that loads the new seq sees the data, length and tag; and a full
	// barrier before notify reads the receiver's sleeper count (see
	// bell.Wait).
	m.seq.Store(s.tail)
	notify(s.peerHdr)
}

func (s *sender) corrupt(format string, args ...any) error {
	if s.ep.closed.Load() {
		return transport.ErrClosed
	}
	return &transport.PeerError{Peer: s.link.rank, Err: fmt.Errorf("shm: ring to rank %d is corrupt: %s", s.link.rank, fmt.Sprintf(format, args...))}
}

// TryNext returns the oldest unreleased message. It loads one word, the
// sequence number in the slot's line, which the data of a small message
// shares.
func (r *receiver) TryNext() ([]byte, transport.Tag, bool, error) {
	if r.ep.closed.Load() {
		return nil, 0, false, transport.ErrClosed
	}
	m := &r.metas[r.line]
	// An acquire load: the sender wrote the message before its seq.
	if seq := m.seq.Load(); seq != r.head+1 {
		err := r.notReady(seq)
		// Look once more, in the ring notReady may just have mapped: a
		// peer that closed or died right after our load may have committed
		// first, and what it sent is drained before its failure is
		// reported.
		if m = &r.metas[r.line]; m.seq.Load() != r.head+1 {
			return nil, 0, false, err
		}
	}
	r.empty = false
	n := m.len
	switch {
	case n <= inlineMax:
		return m.inline[:n:n], transport.Tag(m.tag), true, nil
	case n <= uint32(r.smallLimit):
		return r.small[r.sm][:n:n], transport.Tag(m.tag), true, nil
	case n <= uint32(r.slotSize):
		return r.slots[r.idx][:n:n], transport.Tag(m.tag), true, nil
	}
	return nil, 0, false, r.corrupt("message of %d bytes in a %d-byte slot", n, r.slotSize)
}

// testHookNotReady, set by tests, runs in notReady between its look at
// the peer's state and its look for the peer's ring.
var testHookNotReady func()

// notReady is TryNext's slow path, when the slot holds no new message: the
// peer's failure once everything it committed has been read.
func (r *receiver) notReady(seq uint64) error {
	// The slot holds the message of the previous lap, or none yet.
	if seq != r.head+1-uint64(len(r.metas)) && seq != 0 {
		return r.corrupt("slot line %d holds message %d while message %d is expected", r.line, seq, r.head+1)
	}
	// The peer's state before its ring: a peer publishes its ring and
	// commits its messages before it closes, so once its closing is seen,
	// so is everything it sent. (Looked at the other way round, a peer
	// could publish, send and close in between, and its last messages
	// would be lost behind its closing.)
	err := r.link.err()
	if testHookNotReady != nil {
		testHookNotReady()
	}
	if r.ctr == nil {
		// Not mapped yet. A peer that sent and then closed left its ring
		// behind: map it first, so that what it sent is read before its
		// closing is reported.
		if aerr := r.attach(); aerr != nil || r.ctr != nil {
			return aerr
		}
	}
	if err != nil {
		return err
	}
	r.empty = true
	r.ep.idle()
	return nil
}

// Release hands the oldest message's slot back to the sender.
func (r *receiver) Release() {
	r.head++
	if r.line++; r.line == len(r.metas) {
		r.line = 0
	}
	if r.sm++; r.sm >= len(r.small) {
		r.sm = 0
	}
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
