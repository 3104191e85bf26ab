package p2p

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Op is a transfer's direction, seen from the initiator.
type Op uint8

const (
	// Read copies the remote descriptors into the local ones.
	Read Op = 1
	// Write copies the local descriptors into the remote ones.
	Write Op = 2
)

func (o Op) String() string {
	switch o {
	case Read:
		return "READ"
	case Write:
		return "WRITE"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Status is where a posted request stands.
type Status int

const (
	// StatusDone: the transfer finished (inside Post, for DoneInline).
	StatusDone Status = iota
	// StatusInProgress: the transfer runs; poll Status, Wait or use a callback.
	StatusInProgress
	// StatusFailed: the transfer failed; the error says why.
	StatusFailed
)

func (s Status) String() string {
	return [...]string{"done", "in progress", "failed"}[s]
}

// PreparedList is a descriptor list checked once against the registered
// regions (local) or the peer's metadata (remote), so that requests made
// from it by index cost no lookups. Local regions stay pinned (busy) until
// Release.
type PreparedList struct {
	a      *Agent
	peer   string // "" for a local list
	ra     *remoteAgent
	typ    MemType
	descs  []Desc
	local  []*Region     // per descriptor, local lists and lists on this agent
	remote []regionInfo  // per descriptor, remote lists
	rmem   [][]byte      // per descriptor's region: mapped memory, or nil
	rvm    []vramMapping // per descriptor's VRAM region: where it is mapped here
	rvmOK  []bool        // per descriptor: rvm is set
	rids   []uint32      // the remote regions the list uses, once each
	pinned []*Region
	done   atomic.Bool
}

// PrepareLocal checks list against this agent's regions: the initiator's
// side of requests (DRAM or VRAM).
func (a *Agent) PrepareLocal(list DescList) (*PreparedList, error) {
	if list.Type != DRAM && list.Type != VRAM {
		return nil, fmt.Errorf("p2p: local descriptors of type %v: %w (the initiator's side is DRAM or VRAM)", list.Type, ErrNotSupported)
	}
	return a.prepareOwn(list, "")
}

// prepareOwn resolves descriptors of this agent's own regions.
func (a *Agent) prepareOwn(list DescList, peer string) (*PreparedList, error) {
	pl := &PreparedList{a: a, peer: peer, typ: list.Type, descs: append([]Desc(nil), list.Descs...)}
	pl.local = make([]*Region, len(list.Descs))
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.closed {
		return nil, ErrClosed
	}
	seen := map[*Region]bool{}
	for i, d := range list.Descs {
		info, err := a.local.find(list.Type, d.Addr, d.Len, d.DevID)
		if err != nil {
			for _, r := range pl.pinned {
				r.busy.Add(-1)
			}
			return nil, fmt.Errorf("p2p: descriptor %d: %w", i, err)
		}
		r := a.regions[info.ID]
		pl.local[i] = r
		if !seen[r] {
			seen[r] = true
			r.busy.Add(1)
			pl.pinned = append(pl.pinned, r)
		}
	}
	return pl, nil
}

// PrepareRemote checks list against peer's metadata (or, when peer is this
// agent's name, against its own regions: transfers to its files or between
// its own buffers).
func (a *Agent) PrepareRemote(peer string, list DescList) (*PreparedList, error) {
	if peer == a.name {
		return a.prepareOwn(list, peer)
	}
	ra, err := a.remote(peer)
	if err != nil {
		return nil, err
	}
	pl := &PreparedList{a: a, peer: peer, ra: ra, typ: list.Type, descs: append([]Desc(nil), list.Descs...)}
	pl.remote = make([]regionInfo, len(list.Descs))
	pl.rmem = make([][]byte, len(list.Descs))
	if list.Type == VRAM {
		pl.rvm, pl.rvmOK = make([]vramMapping, len(list.Descs)), make([]bool, len(list.Descs))
	}
	for i, d := range list.Descs {
		r, mem, vm, ok, err := ra.lookup(list.Type, d)
		if err != nil {
			return nil, fmt.Errorf("p2p: descriptor %d at %s: %w", i, peer, err)
		}
		pl.remote[i], pl.rmem[i] = r, mem
		if pl.rvm != nil {
			pl.rvm[i], pl.rvmOK[i] = vm, ok
		}
		if n := len(pl.rids); (n == 0 || pl.rids[n-1] != r.ID) && !slices.Contains(pl.rids, r.ID) {
			pl.rids = append(pl.rids, r.ID)
		}
	}
	return pl, nil
}

// Len is the number of descriptors.
func (pl *PreparedList) Len() int { return len(pl.descs) }

// Release unpins the list's regions. Requests made from it must be released
// first.
func (pl *PreparedList) Release() {
	if pl.done.Swap(true) {
		return
	}
	for _, r := range pl.pinned {
		r.busy.Add(-1)
	}
}

// Part is a piece of a request that notifies the target on its own, so it
// can start on the first layer while later ones are in flight. It covers
// the request's descriptors from the previous part's End to End.
type Part struct {
	End   int
	Notif []byte // nil: no notification for this part
}

// RequestOptions are optional settings of a request.
type RequestOptions struct {
	// Notif is delivered to the target after the whole request's data
	// (ignored when Parts is set).
	Notif []byte
	// Parts split the request, each with its own notification.
	Parts []Part
	// OnComplete runs once per Post when the request finishes, on the
	// goroutine that finished it; it must not block.
	OnComplete func(*Request, error)
	// Backend forces a backend (BackendAuto: choose).
	Backend Backend
}

// segment is a run of merged, contiguous descriptors.
type segment struct {
	local *Region // the initiator's DRAM or VRAM
	loff  uint64  // offset in the local region
	rinfo regionInfo
	raddr uint64 // address or file offset on the target
	rmem  []byte // the target's region memory when mapped or local
	rreg  *Region
	n     uint64
	// The target's VRAM here: the device address of rinfo.Base in this
	// process (its own region, or opened through CUDA IPC; 0: not mapped)
	// and the local device whose stream copies it.
	rdev    uint64
	rctxDev int
}

type partSpec struct {
	end   int // segments [previous end, end)
	notif []byte
	flag  bool // send a notification
	bytes uint64
}

// Request is a transfer made once and posted any number of times.
type Request struct {
	a       *Agent
	op      Op
	peer    string
	self    bool
	ra      *remoteAgent
	local   *PreparedList
	remote  *PreparedList
	owns    bool // release the lists with the request
	segs    []segment
	parts   []partSpec
	bytes   uint64
	backend Backend
	spec    *backendSpec // backend's
	why     string
	cb      func(*Request, error)

	// mu makes a post's state, error and done channel change together, and
	// Post and Release see each other: Wait or Status on one goroutine
	// while another posts the request again reads one post's outcome, not
	// half of two. state is also read without it where a stale value is
	// harmless.
	mu       sync.Mutex
	state    atomic.Int32
	err      error
	done     chan struct{}
	released bool

	finishing    atomic.Bool // the current post is being finished
	postedInline atomic.Bool // the current post runs (ran) on Post's goroutine
	id           uint64
	stop         stopper
	p            *peer
	partsDone    atomic.Int32
	segsDone     int // tcp READ, reader goroutine only
	acks         int // tcp WRITE, reader goroutine only
	logged       bool
	dst, src     [][]byte // the copy backends' scratch, kept between posts
	rd           *rdmaPlan
	rch          *rdmaChan       // the channel of the current rdma post
	tcpLanded    []atomic.Uint64 // tcp: per part, bytes sent live (WRITE) or landed (READ)
	progress     atomic.Int64    // tcp: monoNow of the post's last byte sent or landed, or ack (stalls)
	postedAt     int64           // wall clock of the current Post, ns (telemetry.go)
}

// stopper ends a post's copy or file I/O between blocks once its deadline
// has passed or the agent closes. The goroutines doing the work check it,
// and the post fails only after all of them stopped: the watchdog cannot
// stop a memcpy or a system call, and reporting a failure while one still
// runs would let the owner reuse or deregister memory the agent is still
// writing. A check reads the clock, so the loops make one per block, not
// per piece.
type stopper struct {
	deadline atomic.Int64 // monoNow
	closing  <-chan struct{}
	why      atomic.Int32  // 0: go on; stopTimeout, stopClosed, stopCanceled, stopDeregistered
	landed   atomic.Uint64 // bytes the copy backends copied in this post (Cancel's report)
}

const (
	stopTimeout int32 = 1 + iota
	stopClosed
	stopCanceled
	stopDeregistered
)

// stopped reports whether the work must stop, and from then on always does
// (until the next Post). A nil stopper never stops.
func (s *stopper) stopped() bool {
	if s == nil {
		return false
	}
	if s.why.Load() != 0 {
		return true
	}
	why := int32(0)
	select {
	case <-s.closing:
		why = stopClosed
	default:
		if monoNow() > s.deadline.Load() {
			why = stopTimeout
		}
	}
	if why == 0 {
		return false
	}
	s.why.CompareAndSwap(0, why)
	return true
}

// halted is the error of a post whose stopper stopped its work (which was
// then left unfinished: the checks run only before a block), or nil.
func (r *Request) halted() error {
	switch r.stop.why.Load() {
	case 0:
		return nil
	case stopClosed:
		return ErrClosed
	case stopCanceled:
		return ErrCanceled
	case stopDeregistered:
		return errDeregistered
	}
	return r.timeoutErr()
}

// timeoutErr is the error of a post that did not finish in RequestTimeout.
func (r *Request) timeoutErr() error {
	return fmt.Errorf("%w: %v of %d bytes to %s not finished after %v", ErrTimeout, r.op, r.bytes, r.peer, r.a.cfg.RequestTimeout)
}

const (
	reqIdle int32 = iota
	reqPosted
	reqDone
	reqFailed
)

// MakeRequest makes a request from descriptors of prepared lists, by index
// (nil: all of them, in order). Descriptors that are contiguous on both
// sides merge into one piece.
func (a *Agent) MakeRequest(op Op, local *PreparedList, localIdx []int, remote *PreparedList, remoteIdx []int, opts *RequestOptions) (*Request, error) {
	if op != Read && op != Write {
		return nil, fmt.Errorf("p2p: operation %v: %w", op, ErrInvalidArgument)
	}
	if local == nil || remote == nil || local.a != a || remote.a != a || local.peer != "" || remote.peer == "" {
		return nil, fmt.Errorf("p2p: MakeRequest needs a local list and a remote list of this agent: %w", ErrInvalidArgument)
	}
	if local.done.Load() || remote.done.Load() {
		return nil, fmt.Errorf("p2p: MakeRequest with a released list: %w", ErrInvalidArgument)
	}
	if localIdx == nil {
		localIdx = seq(local.Len())
	}
	if remoteIdx == nil {
		remoteIdx = seq(remote.Len())
	}
	if len(localIdx) != len(remoteIdx) {
		return nil, fmt.Errorf("p2p: %d local descriptors for %d remote ones: %w", len(localIdx), len(remoteIdx), ErrInvalidArgument)
	}
	if opts == nil {
		opts = &RequestOptions{}
	}
	r := &Request{a: a, op: op, peer: remote.peer, self: remote.peer == a.name, ra: remote.ra, local: local, remote: remote, cb: opts.OnComplete}
	r.stop.closing = a.done
	r.segs = make([]segment, 0, len(localIdx))
	parts := opts.Parts
	if len(parts) == 0 {
		parts = []Part{{End: len(localIdx), Notif: opts.Notif}}
	}
	prevEnd := 0
	for pi, part := range parts {
		if part.End <= prevEnd && !(part.End == 0 && len(localIdx) == 0) || part.End > len(localIdx) {
			return nil, fmt.Errorf("p2p: part %d ends at descriptor %d (previous part at %d, %d descriptors): %w", pi, part.End, prevEnd, len(localIdx), ErrInvalidArgument)
		}
		if len(part.Notif) > maxCtrlPayload {
			return nil, fmt.Errorf("p2p: notification of %d bytes (at most %d): %w", len(part.Notif), maxCtrlPayload, ErrInvalidArgument)
		}
		ps := partSpec{notif: part.Notif, flag: part.Notif != nil}
		start := len(r.segs)
		for k := prevEnd; k < part.End; k++ {
			li, ri := localIdx[k], remoteIdx[k]
			if li < 0 || li >= local.Len() || ri < 0 || ri >= remote.Len() {
				return nil, fmt.Errorf("p2p: index pair %d (%d, %d) out of range: %w", k, li, ri, ErrInvalidArgument)
			}
			ld, rd := local.descs[li], remote.descs[ri]
			if ld.Len != rd.Len {
				return nil, fmt.Errorf("p2p: descriptor pair %d: local %d bytes, remote %d: %w", k, ld.Len, rd.Len, ErrInvalidArgument)
			}
			s := segment{local: local.local[li], n: ld.Len, raddr: rd.Addr}
			s.loff = ld.Addr - s.local.info.Base
			if r.self {
				s.rreg = remote.local[ri]
				s.rinfo = s.rreg.info
				s.rmem = s.rreg.mem
				if v := s.rreg.vram; v != nil {
					s.rdev, s.rctxDev = s.rinfo.Base, v.dev
				}
			} else {
				s.rinfo, s.rmem = remote.remote[ri], remote.rmem[ri]
				if remote.rvm != nil && remote.rvmOK[ri] {
					s.rdev, s.rctxDev = remote.rvm[ri].base, remote.rvm[ri].dev
				}
			}
			if n := len(r.segs); n > start && mergeable(&r.segs[n-1], &s) {
				r.segs[n-1].n += s.n
			} else if s.n > 0 {
				r.segs = append(r.segs, s)
			}
			ps.bytes += s.n
		}
		ps.end = len(r.segs)
		r.bytes += ps.bytes
		r.parts = append(r.parts, ps)
		prevEnd = part.End
	}
	if prevEnd != len(localIdx) {
		return nil, fmt.Errorf("p2p: parts cover %d of %d descriptors: %w", prevEnd, len(localIdx), ErrInvalidArgument)
	}
	if r.self && local.typ == remote.typ {
		// Both ends in this address space (DRAM, or VRAM under unified
		// addressing). Large copies run in parallel shares and CUDA copies
		// of overlapping ranges are undefined, so such a request has no
		// defined result: refuse it rather than corrupt the data.
		if l, rm, ok := overlap(r.segs); ok {
			return nil, fmt.Errorf("p2p: source and destination overlap on this agent: local [%#x, +%d), remote [%#x, +%d): %w",
				l.lo, l.hi-l.lo, rm.lo, rm.hi-rm.lo, ErrInvalidArgument)
		}
	}
	b, why, err := a.chooseBackend(r, opts.Backend)
	if err != nil {
		return nil, err
	}
	r.backend, r.why, r.spec = b, why, specOf(b)
	if err := r.spec.prepare(r); err != nil {
		return nil, err
	}
	if b == BackendTCP {
		r.tcpLanded = make([]atomic.Uint64, len(r.parts))
	}
	return r, nil
}

// span is a piece's address range [lo, hi).
type span struct{ lo, hi uint64 }

// overlap finds a local range of segs that overlaps a remote one (the
// remote addresses being this agent's own, for a request to itself): both
// sides sorted, then one merge-like sweep, O(n log n) for requests of
// 100,000 pieces.
func overlap(segs []segment) (local, remote span, ok bool) {
	ls, rs := make([]span, len(segs)), make([]span, len(segs))
	for i := range segs {
		s := &segs[i]
		lo := s.local.info.Base + s.loff
		ls[i], rs[i] = span{lo, lo + s.n}, span{s.raddr, s.raddr + s.n}
	}
	return overlapSpans(ls, rs)
}

// overlapSpans returns a span of ls and one of rs that share a byte. It
// sorts both. Spans within one list may overlap each other: a span passed
// over ends before every later span of the other list starts.
func overlapSpans(ls, rs []span) (span, span, bool) {
	byLo := func(a, b span) int { return cmp.Compare(a.lo, b.lo) }
	slices.SortFunc(ls, byLo)
	slices.SortFunc(rs, byLo)
	for i, j := 0, 0; i < len(ls) && j < len(rs); {
		switch l, r := ls[i], rs[j]; {
		case l.hi <= r.lo:
			i++
		case r.hi <= l.lo:
			j++
		default:
			return l, r, true
		}
	}
	return span{}, span{}, false
}

func mergeable(prev, s *segment) bool {
	return prev.local == s.local && prev.loff+prev.n == s.loff &&
		prev.rinfo.ID == s.rinfo.ID && prev.raddr+prev.n == s.raddr
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// CreateRequest prepares both lists and makes a request of all their
// descriptors; Release releases the lists too.
func (a *Agent) CreateRequest(op Op, local DescList, peer string, remote DescList, opts *RequestOptions) (*Request, error) {
	ll, err := a.PrepareLocal(local)
	if err != nil {
		return nil, err
	}
	rl, err := a.PrepareRemote(peer, remote)
	if err != nil {
		ll.Release()
		return nil, err
	}
	r, err := a.MakeRequest(op, ll, nil, rl, nil, opts)
	if err != nil {
		ll.Release()
		rl.Release()
		return nil, err
	}
	r.owns = true
	return r, nil
}

// Backend is the chosen backend.
func (r *Request) Backend() Backend { return r.backend }

// BackendReason is why the backend was chosen (as logged).
func (r *Request) BackendReason() string { return r.why }

// Bytes is the request's size.
func (r *Request) Bytes() uint64 { return r.bytes }

// Pieces is the number of pieces after merging contiguous descriptors.
func (r *Request) Pieces() int { return len(r.segs) }

// PartsDone is how many parts have finished in the current post.
func (r *Request) PartsDone() int { return int(r.partsDone.Load()) }

// EstimateCost is the cost model's time for the request on its backend.
func (r *Request) EstimateCost() time.Duration {
	return r.spec.cost.estimate(len(r.segs), r.bytes, len(r.parts))
}

// Post starts the request. It returns StatusDone when the transfer finished
// inside Post (small transfers to a peer on this host with nothing queued
// before them), StatusInProgress otherwise. Over tcp, a post of at most
// 64 KiB, or a WRITE of at most 1 MiB of host memory, is written into the
// socket by Post itself when nothing is queued before it; Post never waits
// for the peer to read (what the socket does not take is sent later).
// A request may be posted again
// once it is no longer in progress; before that Post returns
// ErrRequestActive, whichever goroutine calls it.
func (r *Request) Post() (Status, error) {
	r.mu.Lock()
	switch {
	case r.released:
		r.mu.Unlock()
		return StatusFailed, errors.New("p2p: Post of a released request")
	case r.state.Load() == reqPosted:
		r.mu.Unlock()
		return StatusInProgress, ErrRequestActive
	}
	a := r.a
	r.state.Store(reqPosted)
	r.err, r.done = nil, make(chan struct{})
	// Under mu: Cancel reads the post's ID and stops it through stop.
	r.id = a.nextReq.Add(1)
	r.postedAt = time.Now().UnixNano()
	r.stop.deadline.Store(monoNow() + int64(a.cfg.RequestTimeout))
	r.stop.why.Store(0)
	r.stop.landed.Store(0)
	r.mu.Unlock()
	// The rest is read only by the goroutines that run this post, which
	// get it through the lane (or this goroutine, inline).
	r.p, r.segsDone, r.acks = nil, 0, 0
	if r.postedInline.Load() { // a store is a locked instruction: only when set
		r.postedInline.Store(false)
	}
	r.finishing.Store(false)
	r.partsDone.Store(0)
	for i := range r.tcpLanded {
		r.tcpLanded[i].Store(0)
	}
	a.postMu.Lock()
	a.posts[r] = struct{}{}
	a.postMu.Unlock()
	select {
	case <-a.done: // Close invalidated the peers too: say why
		r.complete(ErrClosed, false)
		return StatusFailed, ErrClosed
	default:
	}
	if r.ra != nil && !r.ra.acquire() {
		err := fmt.Errorf("%w: %s (its metadata was invalidated or replaced; prepare again)", ErrRemoteDisconnect, r.peer)
		r.complete(err, false)
		return StatusFailed, err
	}
	if r.ra != nil && r.spec.initiatorChecks {
		// Nothing on the target checks a copy it does not run: refuse here
		// what the peer has deregistered since (tcp: the target refuses).
		if id, ok := r.ra.droppedAny(r.remote.rids); ok {
			err := fmt.Errorf("%w: %s deregistered region %d; prepare again", ErrOutOfBounds, r.peer, id)
			r.complete(err, true)
			return StatusFailed, err
		}
	}
	if !r.self {
		a.mu.RLock()
		r.p = a.peers[r.peer]
		a.mu.RUnlock()
		if r.p == nil {
			err := fmt.Errorf("%w: %s (no connection)", ErrRemoteDisconnect, r.peer)
			r.complete(err, true)
			return StatusFailed, err
		}
	}
	l := a.lane(r.peer)
	if l == nil {
		r.complete(ErrClosed, true)
		return StatusFailed, ErrClosed
	}
	if r.spec.postInline && a.cfg.InlineLimit >= 0 && (r.spec.postInlineIf == nil || r.spec.postInlineIf(r)) {
		// Posting costs the same whatever the size: on this goroutine when
		// nothing is queued before it (no lane goroutine to start).
		r.postedInline.Store(true)
		if ran, err := l.runInline(r); ran {
			if err != nil {
				return StatusFailed, err
			}
			return StatusInProgress, nil
		}
		r.postedInline.Store(false)
	}
	inline := r.spec.inline && a.cfg.InlineLimit > 0 && r.bytes <= uint64(a.cfg.InlineLimit)
	if inline {
		// The outcome comes back from execute: once finished, the request
		// may already be posted again by another goroutine.
		if ran, err := l.runInline(r); ran {
			if err != nil {
				return StatusFailed, err
			}
			return StatusDone, nil
		}
	}
	if !l.push(r) {
		r.complete(ErrClosed, true)
		return StatusFailed, ErrClosed
	}
	return StatusInProgress, nil
}

// outcome is the last post's state, error and done channel, together.
func (r *Request) outcome() (int32, error, chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state.Load(), r.err, r.done
}

// Status reports where the last Post stands, without blocking.
func (r *Request) Status() (Status, error) {
	st, err, _ := r.outcome()
	switch st {
	case reqDone:
		return StatusDone, nil
	case reqFailed:
		return StatusFailed, err
	case reqIdle:
		return StatusFailed, errors.New("p2p: request not posted")
	}
	return StatusInProgress, nil
}

// Wait blocks until the last Post finishes, or ctx ends (the request then
// goes on). If another goroutine posts the request again meanwhile, Wait
// reports on that post, the last one.
func (r *Request) Wait(ctx context.Context) error {
	var since int64 // for the tcp spin budget only: other backends skip the clock
	if r.waitsOnTCP() {
		since = monoNow()
	}
	for {
		st, err, done := r.outcome()
		switch st {
		case reqDone:
			return nil
		case reqFailed:
			return err
		case reqIdle:
			return errors.New("p2p: request not posted")
		}
		if r.progressWait() {
			continue
		}
		select {
		case <-done: // read the outcome under mu: it may be a newer post's
			if since != 0 {
				r.sleptTCP(since)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Release frees the request (and the lists CreateRequest made). It fails
// with ErrRequestActive while the request is in progress.
func (r *Request) Release() error {
	r.mu.Lock()
	if r.state.Load() == reqPosted {
		r.mu.Unlock()
		return ErrRequestActive
	}
	if r.released {
		r.mu.Unlock()
		return nil
	}
	r.released = true
	r.mu.Unlock()
	if r.owns {
		r.local.Release()
		r.remote.Release()
	}
	return nil
}

// finish ends the current post with err (nil: success), once.
func (r *Request) finish(err error) { r.complete(err, true) }

func (r *Request) complete(err error, releaseRemote bool) {
	st := reqDone
	if err != nil {
		st = reqFailed
	}
	if r.state.Load() != reqPosted || !r.finishing.CompareAndSwap(false, true) {
		return
	}
	if p := r.p; p != nil {
		p.mu.Lock()
		if p.inflight[r.id] == r {
			delete(p.inflight, r.id)
		}
		p.mu.Unlock()
		if rt := r.spec.retirer; rt != nil {
			rt.retire(r)
		}
	}
	if releaseRemote && r.ra != nil {
		r.ra.release()
	}
	a := r.a
	a.postMu.Lock()
	delete(a.posts, r)
	a.postMu.Unlock()
	if err != nil {
		r.reportFailure(err)
	}
	a.telRecord(r, err)
	if r.cb != nil {
		r.cb(r, err) // before done: Wait returns after the callback ran
	}
	// Once the state says done the request may be posted again, with a
	// new channel: close this post's.
	r.mu.Lock()
	r.err = err
	done := r.done
	r.state.Store(st)
	r.mu.Unlock()
	close(done)
}

// notifyPart tells the target part i is done (after its data is visible)
// and counts it.
func (r *Request) notifyPart(i int) error {
	ps := &r.parts[i]
	if ps.flag {
		var err error
		if r.self {
			err = r.a.deliverNotif(r.a.name, append([]byte(nil), ps.notif...))
		} else {
			err = r.sendNotif(ps.notif)
		}
		if err != nil {
			return err
		}
	}
	r.partsDone.Add(1)
	return nil
}

// sendNotif sends a part's notification to the peer. It reads r.p once: a
// post that timed out may be posted again while this one still runs, which
// resets r.p.
func (r *Request) sendNotif(notif []byte) error {
	p := r.p
	if p == nil {
		return fmt.Errorf("%w: %s: notification: the post has no connection", ErrRemoteDisconnect, r.peer)
	}
	err := p.control(header{op: opNotif, length: uint64(len(notif))}, nonNil(notif))
	if err == nil {
		return nil
	}
	select {
	case <-r.a.done: // Close shut the connection
		return ErrClosed
	default:
	}
	err = fmt.Errorf("%w: %s: notification: %v", ErrRemoteDisconnect, r.peer, err)
	// The connection is broken (its writes fail from now on): drop the peer
	// now, as its writer and reader do, so that a lost peer is reaped even
	// if the application closes the agent before the reader sees the end
	// of the stream.
	p.fail(err, true)
	return err
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// lane runs the requests to one peer in posting order, so that their
// notifications arrive in that order. Its goroutine runs only while
// requests are queued, so peers that come and go leave none behind.
type lane struct {
	a       *Agent
	mu      sync.Mutex
	cond    *sync.Cond
	q       []*Request
	busy    bool
	running bool // a run goroutine drains q
	closed  bool
	path    notifPath // the last post's (read and written by the one running posts)
}

func (a *Agent) lane(peer string) *lane {
	a.mu.RLock()
	l := a.lanes[peer]
	a.mu.RUnlock()
	if l != nil {
		return l
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	if l = a.lanes[peer]; l == nil {
		l = &lane{a: a}
		l.cond = sync.NewCond(&l.mu)
		a.lanes[peer] = l
	}
	return l
}

// runInline runs r on the caller's goroutine if nothing is queued or
// running before it, and returns the error the post finished with.
func (l *lane) runInline(r *Request) (bool, error) {
	l.mu.Lock()
	if l.busy || len(l.q) > 0 || l.closed {
		l.mu.Unlock()
		return false, nil
	}
	l.busy = true
	l.mu.Unlock()
	err := l.execute(r)
	l.mu.Lock()
	l.busy = false
	if len(l.q) > 0 {
		l.cond.Broadcast()
	}
	l.mu.Unlock()
	return true, err
}

func (l *lane) push(r *Request) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.q = append(l.q, r)
	if !l.running {
		// Close closes the lane before it waits for a.wg: this Add
		// comes before that.
		l.running = true
		l.a.wg.Add(1)
		go l.run()
	}
	l.cond.Broadcast()
	return true
}

func (l *lane) run() {
	defer l.a.wg.Done()
	for {
		l.mu.Lock()
		for len(l.q) > 0 && l.busy && !l.closed {
			l.cond.Wait()
		}
		if l.closed || len(l.q) == 0 {
			q := l.q
			l.q, l.running = nil, false
			l.mu.Unlock()
			for _, r := range q {
				r.finish(ErrClosed)
			}
			return
		}
		r := l.q[0]
		l.q[0] = nil
		l.q = l.q[1:]
		l.busy = true
		l.mu.Unlock()
		l.execute(r)
		l.mu.Lock()
		l.busy = false
		l.mu.Unlock()
	}
}

func (l *lane) close() {
	l.mu.Lock()
	l.closed = true
	l.cond.Broadcast()
	l.mu.Unlock()
}

// execute runs one posted request on its backend and returns the error it
// finished it with (nil for an async backend, which finishes it later).
func (a *Agent) execute(r *Request) error {
	if monoNow() > r.stop.deadline.Load() {
		err := fmt.Errorf("%w: queued for %v behind earlier requests to %s", ErrTimeout, a.cfg.RequestTimeout, r.peer)
		r.finish(err)
		return err
	}
	if r.stop.why.Load() != 0 { // cancelled while queued
		err := r.halted()
		r.finish(err)
		return err
	}
	if r.p != nil {
		if err := r.p.err(); err != nil {
			r.finish(err)
			return err
		}
	}
	if !r.logged { // once per request: the key costs allocations
		r.logged = true
		a.logBackend(r.peer, r.backend, r.why)
	}
	err := r.spec.run(r)
	if r.spec.async {
		return nil // finished by the backend
	}
	r.finish(err)
	return err
}
