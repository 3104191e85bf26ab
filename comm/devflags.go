package comm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/device"
)

// Stream-ordered device collectives: the devices wait for each other, the
// host does not. When a call's device buffers are StreamBuffers inside
// windows that every rank registered (RegisterDevice) and their engine is
// a DeviceStreamEngine, the host takes no part in the call: it queues on
// the buffers' stream
//
//  1. a write of the call's number into this rank's arrival word in every
//     peer's flag page (the write follows the stream's earlier work, so
//     this rank's inputs are final and its outputs free);
//  2. a wait until every peer's arrival word in this rank's page holds it;
//  3. this rank's share of the work, as devexec.go does it, straight
//     between the peers' registered buffers (deviceWork);
//  4. a write of the number into its departure word in every peer's page
//     and a wait for every peer's departure (no peer reads this rank's
//     input or writes its output any more);
//  5. a write of the number into its own page's done word,
//
// and returns: no host round, no wait for the device, as an NCCL kernel
// on its stream. The flag pages are host memory that the ranks of the host
// share (the rendezvous's symmetric memory) and that each rank maps for its
// device (DeviceStreamEngine.MapFlags), so the host can read how far every
// rank's stream got and, when the Comm aborts, release its own stream by
// writing its words (releaseFlags): a stream never waits for a peer that
// is gone. Windows are symmetric (NCCL's symmetric registration): every
// rank registers a buffer of the same size at the same point, and a call
// passes buffers at the same offsets of the same windows on every rank, or
// window buffers on none; a rank that passes window buffers where a peer
// does not waits for it (on the device: the peer's host waits for this
// rank's arrival message, and its watchdog names this rank).

// flagStride is the distance between two flag words: each word on its own
// cache line, so one rank's write does not share a line with another's.
const flagStride = 64

// maxFlagRanks bounds the ranks of a Comm with flag pages (a call queues
// 4(n-1)+1 flag operations on the stream).
const maxFlagRanks = 64

// flagState is a Comm's flag pages: made by its first RegisterDevice.
type flagState struct {
	eng    DeviceStreamEngine
	region *symRegion      // every rank's page, in host memory
	dev    []uintptr       // by rank: the page's device address
	mapped [][]byte        // pages mapped for the device, to unmap
	n, me  int             // ranks, and this rank
	seq    atomic.Uint32   // the number of the last call queued
	last   uintptr         // the stream of the last call queued
	batch  []device.FlagOp // a post's operations: 2(n-1), and the done word
	// broken: a call was queued only in part, so its done word may never
	// be written: Close must not wait for it, nor unmap the pages.
	broken atomic.Bool
	// ops names the last calls queued, by number mod len(ops): the Comm's
	// operation number << 8 | the collective, for the watchdog.
	ops     [64]atomic.Uint64
	monOnce sync.Once
	monStop chan struct{}
	monDone chan struct{}

	releaseOnce sync.Once
	stop        chan struct{} // ends the release loop
	loopDone    chan struct{}
}

func (f *flagState) arriveOff(p int) uintptr { return uintptr(p) * flagStride }
func (f *flagState) departOff(p int) uintptr { return uintptr(f.n+p) * flagStride }
func (f *flagState) doneOff() uintptr        { return uintptr(2*f.n) * flagStride }

// word is rank p's flag word at off, in host memory.
func (f *flagState) word(p int, off uintptr) *uint32 {
	return (*uint32)(unsafe.Pointer(&f.region.peers[p][off]))
}

func flagPageBytes(n int) int { return (2*n*flagStride + flagStride + 4095) &^ 4095 }

// DeviceWindow is a device buffer that every rank of a Comm registered
// (RegisterDevice): each rank maps its peers' windows once, so calls on
// buffers inside windows run stream-ordered, without a host round.
type DeviceWindow struct {
	c   *Comm
	win *devWindow
}

// devWindow is one registration on one rank.
type devWindow struct {
	eng   DeviceStreamEngine
	base  uintptr // this rank's buffer
	size  int     // bytes, the same on every rank
	peers []uintptr
	freed bool
}

// devWinTable is the Comm's live windows; replaced, never changed.
type devWinTable []*devWindow

// findWin returns the window holding n bytes at device address p, and the
// offset of p in it.
func (c *Comm) findWin(p uintptr, n int) (*devWindow, uintptr, bool) {
	t := c.wins.Load()
	if t == nil || n == 0 {
		return nil, 0, false
	}
	for _, w := range *t {
		if p >= w.base && p-w.base+uintptr(n) <= uintptr(w.size) {
			return w, p - w.base, true
		}
	}
	return nil, 0, false
}

// RegisterDevice registers buf, a device buffer of this rank, as a window:
// every rank maps every peer's window once, here, so that collectives on
// StreamBuffers inside windows (buf bound to a stream with gpu's OnStream,
// or views of it) queue all their work on the stream, where the devices
// wait for each other through flags in host memory, and return at once,
// with no host round per call. RegisterDevice is collective: every rank
// calls it, in the same order relative to its other operations, with a
// buffer of the same size in bytes, and then passes buffers at the same
// offsets of the same windows in each call (or window buffers on no rank).
// It needs one host, a PeerDeviceBuffer whose engine is a
// DeviceStreamEngine (package gpu's), and at most 64 ranks; otherwise it
// fails on every rank, and calls on the buffer run as they would
// unregistered. A failure on one rank fails it everywhere. It is slow
// (rounds through the rendezvous, a mapping per peer): register once and
// reuse, as with NCCL's ncclCommWindowRegister. Close waits for the
// stream's last stream-ordered call (at most 10 s, then releases it).
func (c *Comm) RegisterDevice(ctx context.Context, buf DeviceBuffer) (*DeviceWindow, error) {
	if err := c.enter(); err != nil {
		return nil, err
	}
	defer c.leave()
	c.async.drain()
	c.winSeq++
	id := c.winSeq
	var (
		bad  error
		eng  DeviceStreamEngine
		base uintptr
		size int
		desc []byte
	)
	pb, ok := buf.(PeerDeviceBuffer)
	switch {
	case buf == nil:
		bad = invalid("RegisterDevice of a nil buffer")
	case !ok || pb.Ptr() == 0:
		bad = fmt.Errorf("%w: RegisterDevice of a %T, not a device buffer peers can map (PeerDeviceBuffer)", ErrNotSupported, buf)
	case !buf.DataType().Valid() || buf.Len() <= 0:
		bad = invalid("RegisterDevice of %d elements of %v", buf.Len(), buf.DataType())
	case c.multiHost:
		bad = fmt.Errorf("%w: device windows need every rank on one host", ErrNotSupported)
	case c.size > maxFlagRanks:
		bad = fmt.Errorf("%w: device windows on %d ranks, more than %d", ErrNotSupported, c.size, maxFlagRanks)
	default:
		if eng, ok = pb.Engine().(DeviceStreamEngine); !ok {
			bad = fmt.Errorf("%w: %s cannot queue work on streams", ErrNotSupported, pb.Engine().Name())
		} else if f := c.flags.Load(); f != nil && f.eng != eng {
			bad = fmt.Errorf("%w: a window on %s, the communicator's first on %s", ErrNotSupported, eng.Name(), f.eng.Name())
		}
	}
	if bad == nil {
		base, size = pb.Ptr(), buf.Len()*buf.DataType().Size()
		if desc, bad = eng.AppendExport(nil, base, size); bad == nil && len(desc) > MaxDeviceDescLen {
			bad = fmt.Errorf("gccl: internal error: %s exported a description longer than %d bytes", eng.Name(), MaxDeviceDescLen)
		}
	}
	w, err := c.registerWindow(ctx, eng, base, size, desc, bad)
	if err != nil {
		var oe *OpError
		if errors.As(err, &oe) {
			oe.Op, oe.Seq = "RegisterDevice", uint64(id)
			return nil, oe
		}
		return nil, &OpError{Op: "RegisterDevice", Rank: c.rank, Seq: uint64(id), Peer: -1, Err: err}
	}
	c.winMu.Lock()
	var t devWinTable
	if old := c.wins.Load(); old != nil {
		t = append(t, *old...)
	}
	t = append(t, w)
	c.wins.Store(&t)
	c.winMu.Unlock()
	c.log.Debug("device window registered", "subsys", "INIT", "bytes", size, "id", id)
	return &DeviceWindow{c: c, win: w}, nil
}

// registerWindow is RegisterDevice's rendezvous: the flag pages first (the
// Comm's first window), then a round that swaps the buffers' descriptions,
// each rank's mapping of its peers' buffers (and pages), and a round that
// agrees on the outcome. Every rank fails if one does.
func (c *Comm) registerWindow(ctx context.Context, eng DeviceStreamEngine, base uintptr, size int,
	desc []byte, bad error) (_ *devWindow, err error) {
	newFlags := c.flags.Load() == nil
	var f *flagState
	if newFlags {
		var reg *symRegion
		if reg, err = c.allocRegion(ctx, 0, flagPageBytes(c.size), bad); err != nil {
			return nil, err
		}
		f = &flagState{eng: eng, region: reg, n: c.size, me: c.rank, dev: make([]uintptr, c.size),
			batch: make([]device.FlagOp, 0, 2*c.size-1)}
		defer func() {
			if err != nil { // the result: any failure from here on
				f.unmap()
				for _, m := range reg.maps {
					m.Close()
				}
			}
		}()
		if !reg.all && bad == nil {
			bad = fmt.Errorf("%w: a peer's flag page is not in shared memory", ErrNotSupported)
		}
	}
	sent := size
	if bad != nil {
		sent, desc = 0, nil
	}
	sizes, descs, err := c.allocRound(ctx, "RegisterDevice", allocInfo{sent, string(desc), bad}, size, nil)
	if err != nil {
		return nil, err
	}
	w := &devWindow{eng: eng, base: base, size: size, peers: make([]uintptr, c.size)}
	var mapErr error
	for p := range c.size {
		if p == c.rank {
			w.peers[p] = base
			continue
		}
		if w.peers[p], mapErr = eng.Import([]byte(descs[p]), size); mapErr != nil {
			mapErr = &OpError{Op: "RegisterDevice", Rank: c.rank, Peer: p, Err: fmt.Errorf("mapping the peer's device window: %w", mapErr)}
			break
		}
	}
	c.noteContention(eng)
	if newFlags && mapErr == nil {
		for p := range c.size {
			page := f.region.peers[p]
			if f.dev[p], mapErr = eng.MapFlags(page); mapErr != nil {
				mapErr = fmt.Errorf("mapping rank %d's flag page for the device: %w", p, mapErr)
				break
			}
			f.mapped = append(f.mapped, page)
		}
	}
	if _, _, err = c.allocRound(ctx, "RegisterDevice", allocInfo{size: size, err: mapErr}, size, sizes); err != nil {
		return nil, err
	}
	if newFlags {
		c.flags.Store(f)
	}
	return w, nil
}

// Deregister removes the window from this rank's Comm: later calls on its
// buffers run as unregistered ones. Like RegisterDevice it must happen at
// the same point on every rank (a rank that passes a window buffer where a
// peer passes an unregistered one waits for that peer), and before the
// buffer is freed. It waits for this rank's async calls issued before it.
func (w *DeviceWindow) Deregister() error {
	c := w.c
	c.async.drain()
	c.winMu.Lock()
	defer c.winMu.Unlock()
	if w.win.freed {
		return nil
	}
	w.win.freed = true
	var t devWinTable
	if old := c.wins.Load(); old != nil {
		for _, o := range *old {
			if o != w.win {
				t = append(t, o)
			}
		}
	}
	c.wins.Store(&t)
	return nil
}

// flagCall reports whether cl runs stream-ordered: a collective the
// devices do, every buffer this rank uses a StreamBuffer of one stream in
// a window of the Comm, and nothing that needs the ranks to compare notes
// first (pre-multipliers, which may differ by rank, go through devexec.go's
// arrival round; so do more ranks than a device reduction reads). Every
// rank must decide alike, which the windows' contract makes so.
func (c *Comm) flagCall(cl *call) bool {
	if c.flags.Load() == nil || cl.isGroup || cl.barrier || c.algoPref != 0 || cl.op.Kind == OpPreMulSum {
		return false
	}
	switch cl.coll {
	case algo.AllReduce, algo.ReduceScatter, algo.Reduce:
		if c.size > maxDeviceRanks {
			return false
		}
	case algo.AllGather, algo.Broadcast, algo.Gather, algo.Scatter:
	case algo.AllToAll:
		if addrOf(cl.in.b) == addrOf(cl.out.b) {
			return false
		}
	default:
		return false
	}
	_, _, _, ok := c.flagBuffers(cl)
	return ok
}

// flagBuffers returns the stream of cl's buffers, and the window that holds
// each (in, out; nil where the rank does not use the buffer) with the
// buffer's offset in it, or false.
func (c *Comm) flagBuffers(cl *call) (s uintptr, wins [2]*devWindow, offs [2]uintptr, ok bool) {
	needIn, needOut := cl.deviceUses(c.rank)
	bufs := [2]*view{&cl.in, &cl.out}
	need := [2]bool{needIn, needOut}
	for i, v := range bufs {
		if !need[i] {
			continue
		}
		sb, isStream := v.dev.(StreamBuffer)
		if !v.addr || !isStream || (s != 0 && sb.Stream() != s) {
			return 0, wins, offs, false
		}
		s = sb.Stream()
		w, off, found := c.findWin(addrOf(v.b), len(v.b))
		if !found || w.eng != c.flags.Load().eng {
			return 0, wins, offs, false
		}
		wins[i], offs[i] = w, off
	}
	return s, wins, offs, need[0] || need[1]
}

// runDeviceFlags queues cl on its buffers' stream (the file comment's
// steps).
func (c *Comm) runDeviceFlags(cl *call) error {
	f := c.flags.Load()
	s, wins, offs, ok := c.flagBuffers(cl)
	if !ok {
		// Deregistered between its issue and its turn (async).
		return &OpError{Op: cl.name(), Rank: c.rank, Seq: cl.seq, Peer: -1,
			Err: errors.New("a window of the call's buffers was deregistered before the call ran")}
	}
	d := &c.dev
	if !d.flagLogged {
		d.flagLogged = true
		c.log.Info("device windows: collectives queued on the stream, the devices wait on flags in host memory", "subsys", "COLL")
	}
	for p := range d.peers {
		d.peers[p] = devPeer{}
	}
	for p := range d.peers {
		if w := wins[0]; w != nil {
			d.peers[p].in = w.peers[p] + offs[0]
		}
		if w := wins[1]; w != nil {
			d.peers[p].out = w.peers[p] + offs[1]
		}
	}
	eng := f.eng
	// The number is taken before queueing (the watchdog reads it) and
	// spent even when queueing fails part way: the Comm then aborts, and
	// releaseFlags lets every wait queued so far pass.
	seq := f.seq.Load() + 1
	f.ops[seq%uint32(len(f.ops))].Store(cl.seq<<8 | uint64(cl.coll))
	f.seq.Store(seq)
	f.monOnce.Do(func() {
		f.monStop, f.monDone = make(chan struct{}), make(chan struct{})
		go c.watchFlags(f)
	})
	err := c.queueFlagged(eng, cl, s, seq)
	f.last = s
	if err != nil {
		f.broken.Store(true)
		return &OpError{Op: cl.name(), Rank: c.rank, Seq: cl.seq, Peer: -1, Err: fmt.Errorf("queueing on the stream: %w", err)}
	}
	return nil
}

// watchFlags is the watchdog and the deadline of stream-ordered calls,
// which no host call waits for: it reads how far this rank's stream got
// (its arrival written into a peer's page, its done word) and, while the
// stream sits inside a call, which peers have not arrived (or departed).
// After the Comm's watchdog period it logs them; after its timeout it
// aborts the Comm with ErrTimeout naming the first, which releases the
// stream.
func (c *Comm) watchFlags(f *flagState) {
	defer close(f.monDone)
	tick := time.NewTicker(min(max(min(c.watchdog, c.timeout)/10, 10*time.Millisecond), time.Second))
	defer tick.Stop()
	var (
		k      uint32
		since  time.Time
		warned bool
	)
	for {
		select {
		case <-f.monStop:
			return
		case <-tick.C:
		}
		cur, inside := f.inside()
		if !inside {
			k = 0
			continue
		}
		now := time.Now()
		if cur != k {
			k, since, warned = cur, now, false
			continue
		}
		waited := now.Sub(since)
		if waited < c.watchdog && waited < c.timeout {
			continue
		}
		late, what := f.late(k)
		packed := f.ops[k%uint32(len(f.ops))].Load()
		op, seq := algo.Collective(packed&0xff).String(), packed>>8
		if !warned {
			warned = true
			c.log.Warn(fmt.Sprintf("watchdog: %s #%d has waited %v on the device; ranks %v have not %s", op, seq, waited, late, what), "subsys", "COLL")
		}
		if waited >= c.timeout {
			peer := -1
			if len(late) > 0 {
				peer = late[0]
			}
			c.fail(&OpError{Op: op, Rank: c.rank, Seq: seq, Peer: peer,
				Err: fmt.Errorf("%w: waited %v on the device; ranks %v have not %s", ErrTimeout, waited, late, what)})
			return
		}
	}
}

// inside returns the number of the call this rank's stream is in (arrived,
// not done), if it is in one.
func (f *flagState) inside() (uint32, bool) {
	if f.n < 2 {
		return 0, false
	}
	// This rank's arrival, as its stream wrote it into the peers' pages;
	// a peer that aborted has written its own words ahead of every call
	// (releaseFlags), so the latest arrival not ahead of the last call.
	seq := f.seq.Load()
	var arrived uint32
	found := false
	for q := range f.n {
		if q == f.me {
			continue
		}
		v := atomic.LoadUint32(f.word(q, f.arriveOff(f.me)))
		if int32(v-seq) <= 0 && (!found || int32(v-arrived) > 0) {
			arrived, found = v, true
		}
	}
	done := atomic.LoadUint32(f.word(f.me, f.doneOff()))
	return arrived, found && int32(arrived-done) > 0
}

// late lists the peers that have not arrived at call k, or if all have,
// those that have not departed.
func (f *flagState) late(k uint32) ([]int, string) {
	var late []int
	for _, w := range []struct {
		off  func(int) uintptr
		what string
	}{{f.arriveOff, "reached it"}, {f.departOff, "finished it"}} {
		for p := range f.n {
			if p != f.me && int32(atomic.LoadUint32(f.word(f.me, w.off(p)))-k) < 0 {
				late = append(late, p)
			}
		}
		if len(late) > 0 {
			return late, w.what
		}
	}
	return nil, "finished it (the device is slow)"
}

// queueFlagged queues steps 1 to 5 of the file comment.
func (c *Comm) queueFlagged(eng DeviceStreamEngine, cl *call, s uintptr, seq uint32) error {
	f := c.flags.Load()
	if f.last != 0 && f.last != s {
		// The Comm's calls run in issue order whatever their streams.
		if err := eng.Follow(s, f.last); err != nil {
			return err
		}
	}
	// Arrive: post this rank's word in every peer's page, wait for every
	// peer's in this rank's.
	if err := f.post(eng, s, f.arriveOff, seq, false); err != nil {
		return err
	}
	c.dev.sq = streamQueue{eng, s} // in the Comm: a pointer to it does not allocate
	if err := c.flagWork(&c.dev.sq, cl); err != nil {
		return err
	}
	return f.post(eng, s, f.departOff, seq, true)
}

// flagWork queues this rank's share of cl. A rank knows where its peers'
// buffers are only for the buffers it passes itself (the windows'
// symmetry), so the collectives with a root run where the root's buffers
// are known: the root of a broadcast or scatter writes into every rank's
// output, the root of a gather or reduce reads every rank's input. The
// others share the work as devexec.go does.
func (c *Comm) flagWork(q devQueue, cl *call) error {
	d := &c.dev
	n, r := c.size, c.rank
	if cl.root != r {
		switch cl.coll {
		case algo.Broadcast, algo.Scatter, algo.Gather, algo.Reduce:
			return nil
		}
	}
	switch cl.coll {
	case algo.Broadcast:
		src := addrOf(cl.in.b)
		for i := range n {
			p := (r + i) % n
			if err := copyIfApart(q, d.peers[p].out, src, len(cl.out.b)); err != nil {
				return err
			}
		}
		return nil
	case algo.Scatter:
		blk := len(cl.out.b)
		src := addrOf(cl.in.b)
		for p := range n {
			if err := copyIfApart(q, d.peers[p].out, src+uintptr(p*blk), blk); err != nil {
				return err
			}
		}
		return nil
	case algo.Gather:
		blk := len(cl.in.b)
		dst := addrOf(cl.out.b)
		for p := range n {
			if err := copyIfApart(q, dst+uintptr(p*blk), d.peers[p].in, blk); err != nil {
				return err
			}
		}
		return nil
	case algo.Reduce:
		red := &d.red
		*red = DeviceReduce{DataType: cl.dtype(), Op: cl.op, Ranks: n, Count: len(cl.in.b) / cl.dtype().Size()}
		d.ins, d.outs = d.ins[:0], append(d.outs[:0], addrOf(cl.out.b))
		for p := range n {
			d.ins = append(d.ins, d.peers[p].in)
		}
		red.In, red.Out = d.ins, d.outs
		return q.Reduce(red)
	}
	return c.deviceWork(q, cl, cl.dtype().Size())
}

// post queues, in one Flags call, a write of seq into this rank's word at
// off in every peer's page, then waits until every peer's word at off in
// this rank's page holds it, and with done then a write of seq into this
// rank's done word.
func (f *flagState) post(eng DeviceStreamEngine, s uintptr, off func(int) uintptr, seq uint32, done bool) error {
	ops := f.batch[:0]
	for p := range f.n {
		if p != f.me {
			ops = append(ops, device.FlagOp{Addr: f.dev[p] + off(f.me), Value: seq})
		}
	}
	for p := range f.n {
		if p != f.me {
			ops = append(ops, device.FlagOp{Addr: f.dev[f.me] + off(p), Value: seq, Wait: true})
		}
	}
	if done {
		ops = append(ops, device.FlagOp{Addr: f.dev[f.me] + f.doneOff(), Value: seq})
	}
	return eng.Flags(s, ops)
}

// streamQueue queues device work on a caller's stream.
type streamQueue struct {
	eng DeviceStreamEngine
	s   uintptr
}

func (q *streamQueue) Reduce(r *DeviceReduce) error       { return q.eng.ReduceOn(q.s, r) }
func (q *streamQueue) Copy(dst, src uintptr, n int) error { return q.eng.CopyOn(q.s, dst, src, n) }

// releaseFlags lets this rank's stream pass every flag wait it has queued:
// after an abort, peers may never arrive or depart (and no call is queued
// any more). The words of this rank's page get the last call's number plus
// 2^30 (ahead of it in the wrapping order), again and again until the
// stream has done its last call, since a peer's stream still running may
// write a lower number over them.
func (c *Comm) releaseFlags() {
	f := c.flags.Load()
	if f == nil {
		return
	}
	f.releaseOnce.Do(func() {
		f.stop, f.loopDone = make(chan struct{}), make(chan struct{})
		go func() {
			defer close(f.loopDone)
			t := time.NewTicker(200 * time.Microsecond)
			defer t.Stop()
			for {
				f.release()
				if f.done() {
					return // nothing left to wait for
				}
				select {
				case <-f.stop:
					return
				case <-t.C:
				}
			}
		}()
	})
}

func (f *flagState) release() {
	v := f.seq.Load() + 1<<30
	for p := range f.n {
		atomic.StoreUint32(f.word(f.me, f.arriveOff(p)), v)
		atomic.StoreUint32(f.word(f.me, f.departOff(p)), v)
	}
}

// done reports whether this rank's stream has done its last call.
func (f *flagState) done() bool {
	return int32(atomic.LoadUint32(f.word(f.me, f.doneOff()))-f.seq.Load()) >= 0
}

// flagsCloseWait bounds how long Close waits for this rank's stream to do
// its last call before releasing it, and then again before leaving the
// flag pages mapped for good.
const flagsCloseWait = 10 * time.Second

// closeFlags waits until this rank's stream has done its last call (its
// pages must stay mapped until then), releasing it at once after an abort
// or when peers never come, then unmaps the pages.
func (c *Comm) closeFlags() {
	f := c.flags.Load()
	if f == nil {
		return
	}
	if f.broken.Load() {
		c.log.Warn("closing: a device call was queued only in part; its flag pages stay mapped", "subsys", "COLL", "rank", c.rank)
		c.releaseFlags()
		close(f.stop)
		<-f.loopDone
		f.stopWatch()
		return
	}
	if f.seq.Load() != 0 {
		if c.failure.Load() != nil {
			c.releaseFlags()
		}
		if !waitFor(f.done, flagsCloseWait) {
			c.log.Warn("closing: this rank's stream has not done its last device call; releasing it", "subsys", "COLL",
				"rank", c.rank)
			c.releaseFlags()
			if !waitFor(f.done, flagsCloseWait) {
				c.log.Warn("closing: the stream's device calls still wait; their flag pages stay mapped", "subsys", "COLL",
					"rank", c.rank)
				close(f.stop)
				<-f.loopDone
				f.stopWatch()
				return
			}
		}
	}
	// From here an abort starts no release loop (the stream is done), and
	// one started before is seen (f.stop: the Once orders it).
	f.releaseOnce.Do(func() {})
	if f.stop != nil {
		close(f.stop)
		<-f.loopDone
	}
	f.stopWatch()
	f.unmap()
	for _, m := range f.region.maps {
		m.Close()
	}
}

// stopWatch ends watchFlags, if it runs.
func (f *flagState) stopWatch() {
	f.monOnce.Do(func() {}) // none may start from now on
	if f.monStop != nil {
		close(f.monStop)
		<-f.monDone
	}
}

func (f *flagState) unmap() {
	for _, b := range f.mapped {
		f.eng.UnmapFlags(b)
	}
	f.mapped = nil
}

// waitFor polls cond until it holds or d passes.
func waitFor(cond func() bool, d time.Duration) bool {
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(100 * time.Microsecond)
	}
	return true
}
