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

	"github.com/gccl/gccl/transport"
)

// Mailbox is a rank's segment: its header, its bell and the rings on which
// its local peers send to it.
type Mailbox struct {
	path       string
	rank, size int
	peers      []int // local peers, ascending; ring i carries peers[i] -> rank
	cfg        Config
	geo        geometry
	seg        *segment
	hdr        *header
	bell       *bell
	ep         atomic.Pointer[Endpoint] // set by Connect, for the bell's Wait
	connecting atomic.Bool
	unlinked   atomic.Bool
	closeOnce  sync.Once
}

// Create makes rank's mailbox for a job of size ranks, with one ring for each
// of localPeers (the other ranks on this host). The segment is
// <Dir>/gccl-<jobID>-<rank>, created exclusively with mode 0600 and fully
// reserved, so that a /dev/shm too small for it fails here.
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
	geo, err := newGeometry(cfg.SlotSize, cfg.SlotCount, len(peers))
	if err != nil {
		return nil, err
	}
	path := mailboxPath(cfg.Dir, jobID, rank)
	fd, err := createFile(path, geo.total)
	if err != nil {
		return nil, err
	}
	seg, err := mapSegment(fd, int(geo.total), true)
	unix.Close(fd) // the mapping keeps the file
	if err != nil {
		unix.Unlink(path)
		return nil, fmt.Errorf("shm: mapping %s: %w", path, err)
	}
	mb := &Mailbox{path: path, rank: rank, size: size, peers: peers, cfg: cfg, geo: geo, seg: seg,
		hdr: (*header)(seg.at(0))}
	mb.bell = &bell{mb: mb, hdr: mb.hdr}

	h := mb.hdr
	h.version = layoutVersion
	h.headerSize = uint32(geo.headerSize)
	h.rank = uint32(rank)
	h.worldSize = uint32(size)
	h.ownerPid = uint32(os.Getpid())
	h.nRings = uint32(len(peers))
	h.slotSize = uint64(cfg.SlotSize)
	h.slotCount = uint64(cfg.SlotCount)
	h.ringStride = uint64(geo.ringStride)
	h.totalSize = uint64(geo.total)
	h.pidNS = pidNamespace()
	table := unsafe.Slice((*uint32)(seg.at(ringTableOff)), len(peers))
	for i, p := range peers {
		table[i] = uint32(p)
	}
	// Publish: a peer that reads the magic sees everything above.
	atomic.StoreUint64(&h.magic, segmentMagic)
	return mb, nil
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
	})
	return err
}

// Connect maps the mailbox of every local peer (peers holds exactly the
// localPeers given to Create) and returns this rank's endpoint. It checks
// each header (magic, version, rank, pid, slot geometry) and fails with an
// error naming the peer on any mismatch. A mailbox that does not exist yet,
// or is still being initialised, is retried until ctx ends. On error the
// mailbox stays open (Close it, or Connect again).
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
	for i, p := range mb.peers {
		seg, hdr, err := mb.mapPeer(ctx, p, peers[p])
		if err != nil {
			return fail(err)
		}
		l := &peerLink{rank: p, seg: seg, hdr: hdr, pidfd: -1}
		ep.links[p] = l
		ep.linkList = append(ep.linkList, l)
		// Our ring in the peer's mailbox.
		table := unsafe.Slice((*uint32)(seg.at(ringTableOff)), hdr.nRings)
		j := slices.Index(table, uint32(mb.rank))
		if j < 0 {
			return fail(fmt.Errorf("shm: mailbox %s of rank %d has no ring for rank %d: the ranks disagree on which ranks share this host", peers[p].Name, p, mb.rank))
		}
		// Its header may be larger than ours (more rings in the table);
		// tryMapPeer checked that the file matches this geometry.
		pg, _ := newGeometry(mb.cfg.SlotSize, mb.cfg.SlotCount, int(hdr.nRings))
		l.send = newSender(ep, l, seg, pg.ringOff(j), pg)
		l.recv = newReceiver(ep, l, mb.seg, mb.geo.ringOff(i), mb.geo)
		if err := l.watch(int(hdr.ownerPid), hdr.pidNS, myNS); err != nil {
			return fail(err)
		}
	}
	ep.pollFds = make([]unix.PollFd, 0, len(ep.linkList))
	ep.nextLiveness = time.Now().Add(LivenessInterval)
	mb.ep.Store(ep)
	return ep, nil
}

// mapPeer maps and validates the mailbox of local peer rank.
func (mb *Mailbox) mapPeer(ctx context.Context, rank int, p Peer) (*segment, *header, error) {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("shm: mailbox %s of rank %d: %s", p.Name, rank, fmt.Sprintf(format, args...))
	}
	for {
		seg, hdr, retry, err := mb.tryMapPeer(rank, p)
		if err != nil && !retry {
			return nil, nil, fail("%v", err)
		}
		if err == nil {
			return seg, hdr, nil
		}
		select {
		case <-ctx.Done():
			return nil, nil, fail("%v (waited until: %v)", err, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// tryMapPeer makes one attempt; retry reports that the peer may still be
// creating its mailbox.
func (mb *Mailbox) tryMapPeer(rank int, p Peer) (seg *segment, hdr *header, retry bool, err error) {
	fd, size, err := openShared(p.Name)
	if err != nil {
		return nil, nil, errors.Is(err, unix.ENOENT), err
	}
	defer unix.Close(fd)
	if size < ringTableOff {
		// Created but not yet reserved.
		return nil, nil, true, fmt.Errorf("not initialised (%d bytes)", size)
	}
	seg, err = mapSegment(fd, int(size), true)
	if err != nil {
		return nil, nil, false, err
	}
	hdr = (*header)(seg.at(0))
	bad := func(format string, args ...any) (*segment, *header, bool, error) {
		seg.drop()
		return nil, nil, false, fmt.Errorf(format, args...)
	}
	switch m := atomic.LoadUint64(&hdr.magic); {
	case m == 0:
		seg.drop()
		return nil, nil, true, errors.New("not initialised")
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
	g, err := newGeometry(int(hdr.slotSize), int(hdr.slotCount), int(hdr.nRings))
	if err != nil || int(hdr.headerSize) != g.headerSize || int(hdr.ringStride) != g.ringStride ||
		int64(hdr.totalSize) != g.total || size != g.total {
		return bad("inconsistent layout (header %d, ring stride %d, size %d of file %d)", hdr.headerSize, hdr.ringStride, hdr.totalSize, size)
	}
	if st := atomic.LoadUint32(&hdr.state); st != stateOpen {
		return bad("rank %d already closed its mailbox", rank)
	}
	return seg, hdr, false, nil
}
