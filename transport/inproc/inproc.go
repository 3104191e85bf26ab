// Package inproc connects ranks that are goroutines of one process. Each
// directed pair of ranks gets a single-producer single-consumer ring of slots
// in ordinary memory, created on first use; each rank has one doorbell that
// its peers ring when they publish a message to it or free one of its slots.
// It serves tests, simulation, and one process driving many devices (like
// ncclCommInitAll).
package inproc

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gccl/gccl/transport"
)

// Defaults sized for many ranks in one process: 64 KiB slots, 4 per ring.
const (
	DefaultSlotSize  = 64 << 10
	DefaultSlotCount = 4
)

// World is a set of in-process endpoints that can reach each other.
type World struct {
	slotSize, slotCount int
	mu                  sync.Mutex // guards ring creation only
	rings               map[[2]int]*ring
	eps                 []*Endpoint
}

// NewWorld returns n connected endpoints. slotSize and slotCount of 0 take
// the defaults.
func NewWorld(n, slotSize, slotCount int) (*World, error) {
	if n < 1 {
		return nil, fmt.Errorf("inproc: world of %d ranks", n)
	}
	if slotSize == 0 {
		slotSize = DefaultSlotSize
	}
	if slotCount == 0 {
		slotCount = DefaultSlotCount
	}
	// Two slots at least: a fused receive-and-send holds one slot while it
	// waits for the next (see algo.Plan).
	if slotSize < 64 || slotCount < 2 {
		return nil, fmt.Errorf("inproc: slot size %d and count %d too small", slotSize, slotCount)
	}
	w := &World{slotSize: slotSize, slotCount: slotCount, rings: map[[2]int]*ring{}}
	w.eps = make([]*Endpoint, n)
	for r := range w.eps {
		w.eps[r] = &Endpoint{
			w: w, rank: r, bell: transport.NewDoorbell(),
			send: make([]atomic.Pointer[ring], n),
			recv: make([]atomic.Pointer[ring], n),
		}
	}
	return w, nil
}

// Closed reports whether every endpoint of the world is closed.
func (w *World) Closed() bool {
	for _, e := range w.eps {
		if !e.closed.Load() {
			return false
		}
	}
	return true
}

// Endpoint returns rank r's endpoint.
func (w *World) Endpoint(r int) *Endpoint { return w.eps[r] }

// getRing returns the ring from src to dst, creating it on first use.
func (w *World) getRing(src, dst int) (*ring, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	key := [2]int{src, dst}
	r := w.rings[key]
	// A ring to a closed receiver could never be drained, and a new one
	// from a closed sender never filled; but what a sender committed
	// before it closed is still the receiver's to read.
	if w.eps[dst].closed.Load() || (r == nil && w.eps[src].closed.Load()) {
		closedRank := dst
		if w.eps[src].closed.Load() {
			closedRank = src
		}
		return nil, &transport.PeerError{Peer: closedRank, Err: transport.ErrPeerClosed}
	}
	if r == nil {
		r = &ring{
			slotSize: w.slotSize,
			data:     make([]byte, w.slotSize*w.slotCount),
			lens:     make([]int, w.slotCount),
			tags:     make([]transport.Tag, w.slotCount),
			src:      w.eps[src],
			dst:      w.eps[dst],
		}
		w.rings[key] = r
	}
	return r, nil
}

// ring is one direction of one pair. The sender owns tail, the receiver owns
// head; they sit on separate cache lines so the two sides don't contend.
type ring struct {
	_        [64]byte
	tail     atomic.Uint64 // slots ever committed
	_        [56]byte
	head     atomic.Uint64 // slots ever released
	_        [56]byte
	slotSize int
	data     []byte
	lens     []int
	tags     []transport.Tag
	src, dst *Endpoint
}

func (r *ring) slot(i uint64) int { return int(i % uint64(len(r.lens))) }

// sender and receiver are the two halves of a ring; pointer conversions, so
// returning them as interfaces allocates nothing.
type sender ring
type receiver ring

func (s *sender) TryReserve(n int) ([]byte, bool, error) {
	r := (*ring)(s)
	if n > r.slotSize || n < 0 {
		return nil, false, fmt.Errorf("inproc: message of %d bytes exceeds slot size %d", n, r.slotSize)
	}
	// Nothing sent to a closed peer could ever be read: fail now rather
	// than report success for data that is lost.
	if err := r.dst.peerErr(); err != nil {
		return nil, false, err
	}
	t := r.tail.Load()
	if t-r.head.Load() == uint64(len(r.lens)) {
		return nil, false, nil
	}
	i := r.slot(t)
	r.lens[i] = n
	off := i * r.slotSize
	return r.data[off : off+n : off+n], true, nil
}

func (s *sender) Commit(tag transport.Tag) {
	r := (*ring)(s)
	t := r.tail.Load()
	r.tags[r.slot(t)] = tag
	r.tail.Store(t + 1)
	r.dst.bell.Ring()
}

func (v *receiver) TryNext() ([]byte, transport.Tag, bool, error) {
	r := (*ring)(v)
	h := r.head.Load()
	if h == r.tail.Load() {
		err := r.src.peerErr()
		// Drain what a closed peer sent before reporting it gone. It may
		// have committed after our load of tail and closed before our look
		// at closed: look once more, and the commit shows.
		if err == nil || h == r.tail.Load() {
			return nil, 0, false, err
		}
	}
	i := r.slot(h)
	off := i * r.slotSize
	n := r.lens[i]
	return r.data[off : off+n : off+n], r.tags[i], true, nil
}

func (v *receiver) Release() {
	r := (*ring)(v)
	r.head.Store(r.head.Load() + 1)
	r.src.bell.Ring()
}

// Endpoint is one rank of a World.
type Endpoint struct {
	w          *World
	rank       int
	bell       *transport.Doorbell
	send, recv []atomic.Pointer[ring]
	closed     atomic.Bool
	abortErr   atomic.Pointer[error]
}

func (e *Endpoint) Rank() int     { return e.rank }
func (e *Endpoint) Size() int     { return len(e.w.eps) }
func (e *Endpoint) Name() string  { return "INPROC" }
func (e *Endpoint) SlotSize() int { return e.w.slotSize }
func (e *Endpoint) Seq() uint64   { return e.bell.Seq() }

// peerErr is what a peer of e sees once e is closed.
func (e *Endpoint) peerErr() error {
	if !e.closed.Load() {
		return nil
	}
	err := transport.ErrPeerClosed
	if p := e.abortErr.Load(); p != nil {
		err = fmt.Errorf("%w: %w", transport.ErrPeerClosed, *p)
	}
	return &transport.PeerError{Peer: e.rank, Err: err}
}

func (e *Endpoint) checkPeer(peer int) error {
	if e.closed.Load() {
		return transport.ErrClosed
	}
	if peer < 0 || peer >= len(e.w.eps) || peer == e.rank {
		return fmt.Errorf("inproc: rank %d has no peer %d", e.rank, peer)
	}
	return nil
}

func (e *Endpoint) Sender(peer int) (transport.Sender, error) {
	if err := e.checkPeer(peer); err != nil {
		return nil, err
	}
	r := e.send[peer].Load()
	if r == nil {
		var err error
		if r, err = e.w.getRing(e.rank, peer); err != nil {
			return nil, err
		}
		e.send[peer].Store(r)
	}
	return (*sender)(r), nil
}

func (e *Endpoint) Receiver(peer int) (transport.Receiver, error) {
	if err := e.checkPeer(peer); err != nil {
		return nil, err
	}
	r := e.recv[peer].Load()
	if r == nil {
		var err error
		if r, err = e.w.getRing(peer, e.rank); err != nil {
			return nil, err
		}
		e.recv[peer].Store(r)
	}
	return (*receiver)(r), nil
}

func (e *Endpoint) Wait(ctx context.Context, seen uint64, deadline time.Time) error {
	if e.closed.Load() {
		return transport.ErrClosed
	}
	return e.bell.Wait(ctx, seen, deadline)
}

func (e *Endpoint) Close() error {
	e.shut(nil)
	return nil
}

func (e *Endpoint) Abort(err error) { e.shut(err) }

func (e *Endpoint) shut(err error) {
	e.w.mu.Lock()
	if e.closed.Load() {
		e.w.mu.Unlock()
		return
	}
	if err != nil {
		e.abortErr.Store(&err)
	}
	e.closed.Store(true)
	// Wake every peer that may be waiting on this endpoint, so that it
	// notices the loss instead of sleeping until its deadline.
	for key := range e.w.rings {
		if key[0] == e.rank {
			e.w.eps[key[1]].bell.Ring()
		} else if key[1] == e.rank {
			e.w.eps[key[0]].bell.Ring()
		}
	}
	e.w.mu.Unlock()
	e.bell.Close()
}

var _ transport.Endpoint = (*Endpoint)(nil)
