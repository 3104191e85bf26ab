package shm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gccl/gccl/internal/memops"
	"github.com/gccl/gccl/transport"
)

// Mailbox is a rank's segment: its header, its bell and the rings on which
// it sends to its local peers, made as it first sends to each.
type Mailbox struct {
	path       string
	rank, size int
	peers      []int // local peers, ascending
	cfg        Config
	geo        geometry
	fd         int      // the file, kept open to add rings
	seg        *segment // the header
	hdr        *header
	table      []uint64 // the ring table, in seg
	nRings     int      // rings made; guarded by the endpoint's closeMu
	bell       *bell
	ep         atomic.Pointer[Endpoint] // set by Connect, for the bell's Wait
	connecting atomic.Bool
	unlinked   atomic.Bool
	closeOnce  sync.Once
}

// Create makes rank's mailbox for a job of size ranks whose other ranks on
// this host are localPeers. The segment is <Dir>/gccl-<jobID>-<rank>,
// created exclusively with mode 0600; it holds the header only (a page for
// jobs of up to 384 ranks), and grows by one ring as the rank first sends
// to each peer (Endpoint.Sender; see addRing).
func Create(jobID string, rank, size int, localPeers []int, cfg Config) (*Mailbox, error) {
	if err := checkJobID(jobID); err != nil {
		return nil, err
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("shm: rank %d of %d", rank, size)
	}
	peers := slices.Clone(localPeers)
	slices.Sort(peers)
	for i, p := range peers {
		if p < 0 || p >= size || p == rank {
			return nil, fmt.Errorf("shm: rank %d of %d cannot have local peer %d", rank, size, p)
		}
		if i > 0 && peers[i-1] == p {
			return nil, fmt.Errorf("shm: local peer %d listed twice", p)
		}
	}
	geo, err := newGeometry(cfg.SlotSize, cfg.SlotCount, size)
	if err != nil {
		return nil, err
	}
	path := mailboxPath(cfg.Dir, jobID, rank)
	fd, err := createFile(path, int64(geo.headerSize))
	if err != nil {
		return nil, err
	}
	seg, err := mapSegment(fd, geo.headerSize, true)
	if err != nil {
		unix.Close(fd)
		unix.Unlink(path)
		return nil, fmt.Errorf("shm: mapping %s: %w", path, err)
	}
	mb := &Mailbox{path: path, rank: rank, size: size, peers: peers, cfg: cfg, geo: geo, fd: fd, seg: seg,
		hdr: (*header)(seg.at(0)), table: unsafe.Slice((*uint64)(seg.at(ringTableOff)), size)}
	mb.bell = &bell{mb: mb, hdr: mb.hdr}

	h := mb.hdr
	h.version = layoutVersion
	h.headerSize = uint32(geo.headerSize)
	h.rank = uint32(rank)
	h.worldSize = uint32(size)
	h.ownerPid = uint32(os.Getpid())
	h.slotSize = uint64(cfg.SlotSize)
	h.slotCount = uint64(cfg.SlotCount)
	h.ringStride = uint64(geo.ringStride)
	h.pidNS = pidNamespace()
	for _, p := range peers {
		mb.table[p] = ringLocal
	}
	// Publish: a peer that reads the magic sees everything above.
	atomic.StoreUint64(&h.magic, segmentMagic)
	return mb, nil
}

// addRing adds a ring at the end of the mailbox, for the messages to peer,
// and maps it; it returns the mapping and the ring's offset, which the
// caller publishes in the table once it has set up its side. The ring's
// counters and slot lines (linePages pages) are reserved and prefaulted
// now, so that no message of the ring's first lap takes a page's first
// touch (6-15 µs under a hypervisor, one every 32 lines). The rest is
// reserved at first use: the small data areas at the first message that
// needs one (reserveSmall), and each slot's data area as far as the
// longest message it has carried (reserveSlot). The all-to-all family,
// which connects every pair, holds per pair its lines and what its
// messages need rather than whole rings.
func (mb *Mailbox) addRing(peer int) (*segment, int, error) {
	off := mb.geo.ringOff(mb.nRings)
	wrap := func(err error) error {
		return fmt.Errorf("shm: ring from rank %d to rank %d in %s: %w", mb.rank, peer, mb.path, err)
	}
	if err := growFile(mb.fd, int64(off), int64(mb.geo.smallOff)); err != nil {
		return nil, 0, wrap(err)
	}
	// The file covers the whole ring; the slot data stays a hole.
	if err := unix.Ftruncate(mb.fd, mb.geo.size(mb.nRings+1)); err != nil {
		return nil, 0, wrap(err)
	}
	seg, err := mapSegmentAt(mb.fd, int64(off), mb.geo.ringStride, false)
	if err != nil {
		return nil, 0, wrap(err)
	}
	_ = memops.Prefault(seg.bytes(0, mb.geo.smallOff), true)
	mb.nRings++
	atomic.StoreUint32(&mb.hdr.nRings, uint32(mb.nRings))
	return seg, off, nil
}

// reserveSmall reserves the small data areas of the ring at off (mapped at
// seg). The caller holds the endpoint's closeMu, so the file is still open.
func (mb *Mailbox) reserveSmall(seg *segment, off, peer int) error {
	g := mb.geo
	if err := growFile(mb.fd, int64(off+g.smallOff), int64(g.dataOff-g.smallOff)); err != nil {
		return fmt.Errorf("shm: small messages of the ring from rank %d to rank %d in %s: %w", mb.rank, peer, mb.path, err)
	}
	_ = unix.Madvise(seg.bytes(g.smallOff, g.dataOff-g.smallOff), unix.MADV_POPULATE_WRITE)
	return nil
}

// reserveSlot reserves the pages of slot i of the ring at off (mapped at
// seg) that a message of n bytes covers. The caller holds the endpoint's
// closeMu, so the file is still open.
func (mb *Mailbox) reserveSlot(seg *segment, off, i, n, peer int) error {
	start := mb.geo.dataOff + i*mb.geo.slotStride
	from, to := start/pageSize*pageSize, roundUp(start+n, pageSize)
	if err := growFile(mb.fd, int64(off+from), int64(to-from)); err != nil {
		return fmt.Errorf("shm: slot %d of the ring from rank %d to rank %d in %s: %w", i, mb.rank, peer, mb.path, err)
	}
	// Map the pages now rather than fault them in during the message; a
	// kernel without MADV_POPULATE_WRITE (before 5.14) faults.
	_ = unix.Madvise(seg.bytes(from, to-from), unix.MADV_POPULATE_WRITE)
	return nil
}

// Bytes is the shared memory the mailbox holds: its header, the counters
// and slot lines of each ring it made (one per peer it sent to), and of
// each slot's data the pages its longest message used. It reads the
// file's size on /dev/shm, so it is valid until Close.
func (mb *Mailbox) Bytes() int64 {
	var st unix.Stat_t
	if unix.Fstat(mb.fd, &st) != nil {
		return 0
	}
	return st.Blocks * 512
}

// growFile reserves n bytes of the file from off, growing it; a /dev/shm
// too small fails here, not with a SIGBUS on the first message.
func growFile(fd int, off, n int64) error {
	err := unix.Fallocate(fd, 0, off, n)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		// Not tmpfs: a file system without fallocate backs pages on demand.
		var st unix.Stat_t
		if err = unix.Fstat(fd, &st); err == nil && st.Size < off+n {
			err = unix.Ftruncate(fd, off+n)
		}
	}
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EFBIG) {
		return fmt.Errorf("not enough space for %d more bytes: enlarge /dev/shm (docker run --shm-size, or a bigger tmpfs) or lower the slot size or count: %w", n, err)
	}
	return err
}

// Name is what a peer passes to Connect (as Peer.Name) to map this mailbox:
// its path.
func (mb *Mailbox) Name() string { return mb.path }

// Bell returns the rank's bell. It is the one bell of the rank for every
// transport in the process: use it as the Mux's bell, and ring it from other
// transports. Its Wait also notices state changes of the shared-memory
// connections and dead peers.
func (mb *Mailbox) Bell() transport.Bell { return mb.bell }

// Unlink removes the mailbox's name. Call it once every local peer has
// mapped it (after a bootstrap barrier that follows Connect): the memory
// lives on while mapped, and nothing is left in /dev/shm if a rank crashes
// afterwards. It is idempotent, and Close unlinks too.
func (mb *Mailbox) Unlink() error {
	if mb.unlinked.Swap(true) {
		return nil
	}
	if err := unix.Unlink(mb.path); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("shm: unlinking %s: %w", mb.path, err)
	}
	return nil
}

// Close unlinks the mailbox, closes its bell and releases its memory. The
// endpoint made by Connect closes its mailbox; call Close yourself only when
// Connect was not called or failed. Close is idempotent.
func (mb *Mailbox) Close() error {
	err := mb.Unlink()
	mb.closeOnce.Do(func() {
		mb.bell.Close()
		mb.seg.drop()
		unix.Close(mb.fd)
	})
	return err
}

// Connect maps the header of every local peer's mailbox (peers holds
// exactly the localPeers given to Create) and returns this rank's endpoint;
// the rings between two ranks come later, when they first send (see
// Endpoint.Sender). It checks each header (magic, version, rank, pid, slot
// geometry, that the peer counts this rank as local) and fails with an
// error naming the peer on any mismatch. A mailbox that does not exist
// yet, or is still being initialised, is retried until ctx ends. On error
// the mailbox stays open (Close it, or Connect again).
func (mb *Mailbox) Connect(ctx context.Context, peers map[int]Peer) (*Endpoint, error) {
	if mb.seg.dropped.Load() {
		return nil, transport.ErrClosed
	}
	for _, p := range mb.peers {
		if _, ok := peers[p]; !ok {
			return nil, fmt.Errorf("shm: no mailbox name for local peer %d", p)
		}
	}
	for p := range peers {
		if _, found := slices.BinarySearch(mb.peers, p); !found {
			return nil, fmt.Errorf("shm: rank %d is not one of the local peers %v given to Create", p, mb.peers)
		}
	}
	if mb.connecting.Swap(true) {
		return nil, errors.New("shm: Connect called twice")
	}
	ep := &Endpoint{
		mb: mb, rank: mb.rank, size: mb.size, slotSize: mb.cfg.SlotSize,
		links: make([]*peerLink, mb.size),
	}
	fail := func(err error) (*Endpoint, error) {
		ep.dropLinks()
		mb.connecting.Store(false)
		return nil, err
	}
	myNS := mb.hdr.pidNS
	for _, p := range mb.peers {
		l, err := mb.mapPeer(ctx, p, peers[p])
		if err != nil {
			return fail(err)
		}
		ep.links[p] = l
		ep.linkList = append(ep.linkList, l)
		if atomic.LoadUint64(&l.table[mb.rank]) == ringNone {
			return fail(fmt.Errorf("shm: mailbox %s of rank %d has no ring for rank %d: the ranks disagree on which ranks share this host", peers[p].Name, p, mb.rank))
		}
		if err := l.watch(int(l.hdr.ownerPid), l.hdr.pidNS, myNS); err != nil {
			return fail(err)
		}
	}
	ep.pollFds = make([]unix.PollFd, 0, len(ep.linkList))
	ep.nextLiveness = time.Now().Add(LivenessInterval)
	mb.ep.Store(ep)
	return ep, nil
}

// mapPeer maps and validates the mailbox of local peer rank.
func (mb *Mailbox) mapPeer(ctx context.Context, rank int, p Peer) (*peerLink, error) {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("shm: mailbox %s of rank %d: %s", p.Name, rank, fmt.Sprintf(format, args...))
	}
	for {
		l, retry, err := mb.tryMapPeer(rank, p)
		if err != nil && !retry {
			return nil, fail("%v", err)
		}
		if err == nil {
			return l, nil
		}
		select {
		case <-ctx.Done():
			return nil, fail("%v (waited until: %v)", err, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// tryMapPeer makes one attempt; retry reports that the peer may still be
// creating its mailbox. The link keeps the file open, to map the peer's
// ring to this rank once the peer makes it.
func (mb *Mailbox) tryMapPeer(rank int, p Peer) (l *peerLink, retry bool, err error) {
	fd, size, err := openShared(p.Name)
	if err != nil {
		return nil, errors.Is(err, unix.ENOENT), err
	}
	keep := false
	defer func() {
		if !keep {
			unix.Close(fd)
		}
	}()
	if size < int64(mb.geo.headerSize) {
		// Created but not yet reserved, or a job of another size (told
		// apart once the header is readable).
		if size < ringTableOff {
			return nil, true, fmt.Errorf("not initialised (%d bytes)", size)
		}
	}
	hsize := min(int(size), mb.geo.headerSize)
	seg, err := mapSegment(fd, hsize, true)
	if err != nil {
		return nil, false, err
	}
	hdr := (*header)(seg.at(0))
	bad := func(format string, args ...any) (*peerLink, bool, error) {
		seg.drop()
		return nil, false, fmt.Errorf(format, args...)
	}
	switch m := atomic.LoadUint64(&hdr.magic); {
	case m == 0:
		seg.drop()
		return nil, true, errors.New("not initialised")
	case m != segmentMagic:
		return bad("not a gccl mailbox (magic %#x)", m)
	}
	if hdr.version != layoutVersion {
		return bad("layout version %d, this rank speaks %d (mixed gccl versions on one host?)", hdr.version, layoutVersion)
	}
	if int(hdr.rank) != rank || int(hdr.worldSize) != mb.size {
		return bad("belongs to rank %d of %d, want rank %d of %d", hdr.rank, hdr.worldSize, rank, mb.size)
	}
	if p.Pid != 0 && int(hdr.ownerPid) != p.Pid {
		return bad("owned by pid %d, but rank %d is pid %d (a stale segment?)", hdr.ownerPid, rank, p.Pid)
	}
	if int(hdr.slotSize) != mb.cfg.SlotSize || int(hdr.slotCount) != mb.cfg.SlotCount {
		return bad("slot geometry %d slots x %d bytes, this rank uses %d x %d (every rank on a host needs the same shm Config)",
			hdr.slotCount, hdr.slotSize, mb.cfg.SlotCount, mb.cfg.SlotSize)
	}
	if int(hdr.headerSize) != mb.geo.headerSize || int(hdr.ringStride) != mb.geo.ringStride || hsize != mb.geo.headerSize {
		return bad("inconsistent layout (header %d, ring stride %d, file of %d bytes)", hdr.headerSize, hdr.ringStride, size)
	}
	if st := atomic.LoadUint32(&hdr.state); st != stateOpen {
		return bad("rank %d already closed its mailbox", rank)
	}
	keep = true
	return &peerLink{rank: rank, seg: seg, hdr: hdr, fd: fd, pidfd: -1,
		table: unsafe.Slice((*uint64)(seg.at(ringTableOff)), mb.size)}, false, nil
}
