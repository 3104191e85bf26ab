package p2p

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gccl/gccl/internal/verbs"
)

// The RDMA path from this agent to a peer: a channel of RC QPs (Config.
// RDMAQPs) that carries this agent's requests, connected over the peer's
// tcp connection (opRDMAConnect, opRDMAAccept), and, on the peer, the
// responder side of those QPs (rdmaResp), whose only work is to receive
// notifications. Each direction has its own channel.
//
// A post's work requests (built once per request, backend_rdma.go) go out
// on the QPs as the send queues have room; a progress goroutine per
// channel waits for completions, posts more, and sends each part's
// notification once the part's data is in place: a SEND on QP 0, behind
// the part's data on QP 0 and after the completions of its data on the
// other QPs (a READ's after all its data arrived), in posting order across
// requests; the target's responder delivers it to GetNotifs.
//
// Reset: a post that is cancelled, fails, stalls or times out while work
// of it is outstanding moves every QP of the channel to ERR (flushing all
// their work), waits until each outstanding work request has completed or
// been flushed (or destroys the QPs, if the device does not flush within
// rdmaDrainTimeout), then makes new QPs and connects them through the peer,
// which first moves its own QPs to ERR and destroys them, so that nothing
// still in the network lands after the reset. The other posts of the
// channel then go on: their flushed work is posted again (RDMA READ and
// WRITE are idempotent), and notifications the target had already
// delivered (it says up to which sequence number) are not sent twice.

const (
	rdmaDepth        = 512       // send work requests per QP
	rdmaSigEvery     = 16        // a signaled work request at least this often
	rdmaMaxWR        = 4 << 20   // bytes per work request
	rdmaStripeMin    = 256 << 10 // smaller posts go on QP 0 alone
	rdmaMaxSGE       = 16        // scatter/gather entries per work request
	rdmaSlotSize     = 4096      // a notification fragment, header included
	rdmaSlots        = 320       // notification SENDs outstanding per channel (a 1 MiB notification fits)
	rdmaRecvs        = 2 * rdmaSlots
	rdmaNotifHdr     = 16
	maxRDMAQPs       = 64
	rdmaDrainTimeout = 2 * time.Second
	rdmaWaitTick     = 100 * time.Millisecond
)

type chState int

const (
	chUp         chState = iota
	chDraining           // QPs in ERR: waiting for every outstanding work request
	chConnecting         // drained: new QPs being connected through the peer
	chDown               // the peer is gone, or the channel could not reconnect
)

// mark is a signaled work request outstanding on a QP: its completion
// completes every earlier work request of the QP.
type mark struct {
	seq  uint64   // its wr_id
	r    *Request // nil: a notification
	post uint64   // r's post
	idx  int32    // r's work requests on the QP done once it completes
	slot int32    // notification slot (-1: data)
	part int32    // notification: its part
	fin  bool     // notification: its last fragment
}

type markRing struct {
	buf     []mark
	head, n int
}

func (m *markRing) push(x mark) {
	m.buf[(m.head+m.n)%len(m.buf)] = x
	m.n++
}

func (m *markRing) pop() mark {
	x := m.buf[m.head]
	m.buf[m.head] = mark{}
	m.head = (m.head + 1) % len(m.buf)
	m.n--
	return x
}

func (m *markRing) peek() *mark { return &m.buf[m.head] }

// rdmaChan is this agent's RDMA path to one peer.
type rdmaChan struct {
	a   *Agent
	p   *peer
	d   *rdmaDevice
	n   int
	cq  *verbs.CQ
	buf []byte     // notification slots
	bmr *verbs.MR  // their registration
	wcs []verbs.WC // progress goroutine's

	fmu      sync.Mutex  // finishDone
	refinish atomic.Bool // finished posts for the finisher: look again
	mu       sync.Mutex
	cond     *sync.Cond // drains, reconnections, finished posts
	state    chState
	err      error // why down
	qps      []*verbs.QP
	qpn      []uint32
	gen      uint64 // connections made (1: the first)
	posts    []*Request
	marks    []markRing
	nextSeq  []uint64 // per QP: the next wr_id
	doneSeq  []uint64 // per QP: one past the last wr_id completed
	errSeen  []bool   // per QP: a failed or flushed completion came (this connection)
	free     []int32  // free notification slots
	nseq     uint64   // the last notification sequence number given out
	acked    uint64   // the last notification the target acknowledged
	progress int64    // monoNow of the last completion or post
	drainAt  int64    // monoNow the drain started
	stopping bool
	rwg      sync.WaitGroup // reconnections
	done     []*Request     // finished posts, to finish outside mu
	spare    []*Request     // finishDone's scratch, swapped with done
	pmu      sync.Mutex     // posting (pump): one at a time, in reservation order
	kick     atomic.Bool    // work for the poster: look again
	b        batch          // pump's, under pmu
	nwrs     []verbs.SendWR
	nsges    []verbs.SGE
	loopDone chan struct{}
}

// outstanding reports whether work requests of post are on the QPs.
func (rp *rdmaPlan) outstanding() bool {
	for k := range rp.posted {
		if rp.posted[k] != rp.done[k] {
			return true
		}
	}
	return rp.notifOut > 0
}

// newRDMAChan makes the channel's CQ, notification slots and unconnected
// QPs; connect finishes it.
func newRDMAChan(a *Agent, p *peer) (*rdmaChan, error) {
	d := a.rdma
	n := a.cfg.RDMAQPs
	ch := &rdmaChan{a: a, p: p, d: d, n: n, wcs: make([]verbs.WC, 64), loopDone: make(chan struct{})}
	ch.cond = sync.NewCond(&ch.mu)
	var err error
	if ch.cq, err = d.ctx.CreateCQ(n*rdmaDepth+rdmaSlots+64, true); err != nil {
		return nil, err
	}
	ch.buf = make([]byte, rdmaSlots*rdmaSlotSize)
	if ch.bmr, err = d.pd.Register(ch.buf, verbs.AccessLocalWrite); err != nil {
		ch.cq.Close()
		return nil, err
	}
	ch.marks = make([]markRing, n)
	for k := range ch.marks {
		ch.marks[k].buf = make([]mark, rdmaDepth+rdmaSlots)
	}
	ch.nextSeq, ch.doneSeq, ch.errSeen = make([]uint64, n), make([]uint64, n), make([]bool, n)
	ch.nwrs, ch.nsges, ch.b.slots = make([]verbs.SendWR, rdmaSlots), make([]verbs.SGE, rdmaSlots), make([]int32, 0, rdmaSlots)
	for i := range rdmaSlots {
		ch.free = append(ch.free, int32(i))
	}
	return ch, nil
}

// makeQPs creates the channel's QPs (INIT) and returns their endpoints.
func (ch *rdmaChan) makeQPs() ([]*verbs.QP, error) {
	qps := make([]*verbs.QP, 0, ch.n)
	for range ch.n {
		q, err := ch.d.pd.CreateQP(verbs.QPOptions{Port: ch.d.port, SendCQ: ch.cq, RecvCQ: ch.cq, MaxSendWR: rdmaDepth + rdmaSlots,
			MaxRecvWR: 1, MaxSendSGE: rdmaMaxSGE, MaxRecvSGE: 1, PostBatch: 64})
		if err != nil {
			closeQPs(qps)
			return nil, err
		}
		qps = append(qps, q)
	}
	return qps, nil
}

func closeQPs(qps []*verbs.QP) {
	for _, q := range qps {
		q.Close()
	}
}

// connect makes new QPs and connects them to new QPs of the peer's
// responder (which replaces the old ones), and returns the last
// notification sequence number the peer delivered.
func (ch *rdmaChan) connect() ([]*verbs.QP, uint64, error) {
	qps, err := ch.makeQPs()
	if err != nil {
		return nil, 0, err
	}
	payload := make([]byte, 8, 8+len(qps)*verbs.EndpointSize)
	binary.LittleEndian.PutUint16(payload, uint16(len(qps)))
	for _, q := range qps {
		payload, _ = q.Endpoint().AppendBinary(payload)
	}
	reply, err := ch.p.rdmaHandshake(payload, ch.a.cfg.RequestTimeout)
	if err == nil {
		var eps []verbs.Endpoint
		var last uint64
		eps, last, err = parseRDMAAccept(reply, len(qps))
		for i := 0; err == nil && i < len(qps); i++ {
			err = qps[i].Connect(eps[i], ch.d.vcfg)
		}
		if err == nil {
			return qps, last, nil
		}
	}
	closeQPs(qps)
	return nil, 0, err
}

// parseRDMAAccept reads the responder's endpoints and last delivered
// notification.
func parseRDMAAccept(b []byte, n int) ([]verbs.Endpoint, uint64, error) {
	if len(b) != 16+n*verbs.EndpointSize || int(binary.LittleEndian.Uint16(b)) != n {
		return nil, 0, fmt.Errorf("p2p: RDMA accept of %d bytes for %d QPs", len(b), n)
	}
	last := binary.LittleEndian.Uint64(b[8:])
	eps := make([]verbs.Endpoint, n)
	for i := range eps {
		if err := eps[i].UnmarshalBinary(b[16+i*verbs.EndpointSize : 16+(i+1)*verbs.EndpointSize]); err != nil {
			return nil, 0, err
		}
	}
	return eps, last, nil
}

// start connects the channel for the first time and starts its progress
// goroutine.
func (ch *rdmaChan) start() error {
	qps, _, err := ch.connect()
	if err != nil {
		ch.bmr.Close()
		ch.cq.Close()
		return err
	}
	ch.setQPs(qps)
	ch.gen = 1
	ch.progress = monoNow()
	ch.a.mu.Lock()
	if ch.a.closed {
		ch.a.mu.Unlock()
		closeQPs(qps)
		ch.bmr.Close()
		ch.cq.Close()
		return ErrClosed
	}
	ch.a.wg.Add(1)
	ch.a.mu.Unlock()
	go ch.loop()
	return nil
}

func (ch *rdmaChan) setQPs(qps []*verbs.QP) {
	clear(ch.errSeen)
	ch.qps = qps
	ch.qpn = ch.qpn[:0]
	for _, q := range qps {
		ch.qpn = append(ch.qpn, q.QPN())
	}
}

func (ch *rdmaChan) String() string {
	return fmt.Sprintf("%s QPs %#x", ch.d.info.Device, ch.qpn)
}

// post starts post r.id of r on the channel (the lane's goroutine): it
// hands the first batches to the device; the progress goroutine the rest.
func (ch *rdmaChan) post(r *Request) error {
	rp := r.rd
	ch.mu.Lock()
	if ch.state == chDown {
		ch.mu.Unlock()
		return ch.err
	}
	if r.stop.why.Load() != 0 { // cancelled before it started
		ch.mu.Unlock()
		return r.halted()
	}
	rp.reset(r.id)
	if len(ch.posts) == 0 {
		ch.progress = monoNow() // a stall is counted from the first post
	}
	ch.posts = append(ch.posts, r)
	ch.mu.Unlock()
	ch.pump(4) // a small post's data and notification go at once
	ch.mu.Lock()
	ch.collectLocked()
	ch.mu.Unlock()
	return nil
}

// reset starts a post's bookkeeping.
func (rp *rdmaPlan) reset(id uint64) {
	rp.post = id
	clear(rp.posted)
	clear(rp.done)
	rp.notified, rp.confirmed, rp.notifOut = 0, 0, 0
	rp.failed, rp.canceled = nil, false
}

// batch is work requests reserved under mu for one PostSend, which runs
// under pmu only: completions, cancels and the watchdog go on while a
// device that does the work inside the posting call (Soft-RoCE runs a user
// QP's requester in the caller's system call) is busy.
type batch struct {
	qp    *verbs.QP
	k     int
	wrs   []verbs.SendWR
	r     *Request
	post  uint64
	from  int    // data: index of the first in r.rd.wrs[k]
	seq   uint64 // the first wr_id
	notif bool
	part  int
	slots []int32 // notification: the slots of its fragments
}

const (
	rdmaPostBatch = 32      // work requests per PostSend at most
	rdmaPostBytes = 4 << 20 // and bytes
)

// pump posts what the send queues have room for, at most limit batches
// (<0: no limit): data of the posts in order, and the notifications whose
// data is in place. One goroutine posts at a time; another that finds it
// busy leaves its work to it.
func (ch *rdmaChan) pump(limit int) {
	for {
		if !ch.pmu.TryLock() {
			ch.kick.Store(true) // the poster looks again once it is done
			return
		}
		ch.kick.Store(false)
		for n := 0; limit < 0 || n < limit; n++ {
			ch.mu.Lock()
			ok := ch.reserveLocked(&ch.b)
			ch.mu.Unlock()
			if !ok {
				break
			}
			if err := ch.b.qp.PostSend(ch.b.wrs); err != nil {
				ch.mu.Lock()
				ch.unreserveLocked(&ch.b, err)
				ch.mu.Unlock()
			}
		}
		ch.b.r = nil
		ch.pmu.Unlock()
		if !ch.kick.Load() {
			return
		}
	}
}

// reserveLocked reserves the next batch to post into b: wr_ids, marks of
// its signaled work requests, counters. False when there is none.
func (ch *rdmaChan) reserveLocked(b *batch) bool {
	if ch.state != chUp || len(ch.qps) != ch.n {
		return false
	}
	now := monoNow()
	for _, r := range ch.posts {
		rp := r.rd
		if rp.failed != nil {
			continue
		}
		for k := range ch.n {
			from := int(rp.posted[k])
			left := len(rp.wrs[k]) - from
			room := rdmaDepth - int(ch.nextSeq[k]-min(ch.doneSeq[k], ch.nextSeq[k]))
			if left == 0 || room <= 0 {
				continue
			}
			wrs := rp.wrs[k][from : from+min(left, room, rdmaPostBatch)]
			n, bytes := 0, 0
			for n < len(wrs) && (n == 0 || bytes < rdmaPostBytes) {
				for _, s := range wrs[n].SGEs {
					bytes += int(s.Length)
				}
				n++
			}
			wrs = wrs[:n]
			seq := ch.nextSeq[k]
			wrs[n-1].Flags |= verbs.SendSignaled
			for i := range wrs {
				wrs[i].ID = seq + uint64(i)
				if wrs[i].Flags&verbs.SendSignaled != 0 {
					ch.marks[k].push(mark{seq: wrs[i].ID, r: r, post: rp.post, idx: int32(from + i + 1), slot: -1})
				}
			}
			ch.nextSeq[k] += uint64(n)
			rp.posted[k] += int32(n)
			ch.progress = now
			*b = batch{qp: ch.qps[k], k: k, wrs: wrs, r: r, post: rp.post, from: from, seq: seq, slots: b.slots[:0]}
			return true
		}
	}
	// Notifications, in posting order: the first post whose parts are not
	// all notified holds back the later ones.
	for _, r := range ch.posts {
		rp := r.rd
		if rp.failed != nil {
			continue
		}
		for rp.notified < len(r.parts) && ch.partReady(r, rp.notified) {
			if !r.parts[rp.notified].flag {
				rp.notified++
				continue
			}
			if !ch.reserveNotif(b, r, rp.notified) {
				return false // no slot or room: later
			}
			rp.notified++
			return true
		}
		if rp.notified < len(r.parts) {
			return false
		}
	}
	return false
}

// unreserveLocked takes back what of batch b the device did not take (its
// PostSend failed with err) and fails its post.
func (ch *rdmaChan) unreserveLocked(b *batch, err error) {
	posted := 0
	var pe *verbs.PostError
	if errors.As(err, &pe) {
		posted = pe.Posted // those went to the device and complete
	}
	unposted := len(b.wrs) - posted
	first := b.seq + uint64(posted)
	if ch.nextSeq[b.k] == b.seq+uint64(len(b.wrs)) {
		ch.nextSeq[b.k] -= uint64(unposted)
	}
	ring := &ch.marks[b.k]
	for ring.n > 0 {
		tail := &ring.buf[(ring.head+ring.n-1)%len(ring.buf)]
		if tail.seq < first {
			break
		}
		*tail = mark{}
		ring.n--
	}
	rp := b.r.rd
	if b.notif {
		for _, sl := range b.slots[posted:] {
			ch.free = append(ch.free, sl)
		}
		if rp.post == b.post {
			rp.notifOut -= unposted
			rp.notified = min(rp.notified, b.part) // sent again, whole, after the reset
		}
	} else if rp.post == b.post && int(rp.posted[b.k]) == b.from+len(b.wrs) {
		rp.posted[b.k] = int32(b.from + posted)
	}
	ch.failLocked(b.r, fmt.Errorf("p2p: RDMA to %s: %w", ch.p.name, err))
}

// partReady: part i of r may be notified: a WRITE's data is on the wire
// behind which the notification goes (all posted on QP 0, complete on the
// others); a READ's data has all arrived.
func (ch *rdmaChan) partReady(r *Request, i int) bool {
	rp := r.rd
	for k := range ch.n {
		end := rp.partEnd[i][k]
		if r.op == Write && k == 0 {
			if rp.posted[0] < end {
				return false
			}
		} else if rp.done[k] < end {
			return false
		}
	}
	return true
}

// reserveNotif reserves part i's notification as SENDs of at most a slot
// each, on QP 0, into b; false (reserving nothing) without enough free
// slots or room.
func (ch *rdmaChan) reserveNotif(b *batch, r *Request, i int) bool {
	msg := r.parts[i].notif
	frags := max(1, (len(msg)+rdmaSlotSize-rdmaNotifHdr-1)/(rdmaSlotSize-rdmaNotifHdr))
	if len(ch.free) < frags || rdmaDepth+rdmaSlots-int(ch.nextSeq[0]-min(ch.doneSeq[0], ch.nextSeq[0])) < frags {
		return false
	}
	ch.nseq++
	seq := ch.nseq
	r.rd.partSeq[i] = seq
	*b = batch{qp: ch.qps[0], wrs: ch.nwrs[:frags], r: r, post: r.rd.post, seq: ch.nextSeq[0], notif: true, part: i, slots: b.slots[:0]}
	for f := range frags {
		slot := ch.free[len(ch.free)-1]
		ch.free = ch.free[:len(ch.free)-1]
		b.slots = append(b.slots, slot)
		buf := ch.buf[int(slot)*rdmaSlotSize : int(slot+1)*rdmaSlotSize]
		chunk := msg[min(len(msg), f*(rdmaSlotSize-rdmaNotifHdr)):min(len(msg), (f+1)*(rdmaSlotSize-rdmaNotifHdr))]
		binary.LittleEndian.PutUint16(buf, notifMagic)
		buf[2] = 0
		if f == frags-1 {
			buf[2] = 1 // the last fragment
		}
		buf[3] = 0
		binary.LittleEndian.PutUint32(buf[4:], uint32(len(msg)))
		binary.LittleEndian.PutUint64(buf[8:], seq)
		copy(buf[rdmaNotifHdr:], chunk)
		id := ch.nextSeq[0]
		ch.nsges[f] = ch.bmr.SGE(int(slot)*rdmaSlotSize, rdmaNotifHdr+len(chunk))
		ch.nwrs[f] = verbs.SendWR{ID: id, Op: verbs.OpSend, Flags: verbs.SendSignaled, SGEs: ch.nsges[f : f+1 : f+1]}
		ch.marks[0].push(mark{seq: id, r: r, post: r.rd.post, idx: -1, slot: slot, part: int32(i), fin: f == frags-1})
		ch.nextSeq[0]++
		r.rd.notifOut++
	}
	return true
}

const notifMagic = 0x4e52 // "RN"

// loop is the channel's progress goroutine.
func (ch *rdmaChan) loop() {
	defer ch.a.wg.Done()
	defer close(ch.loopDone)
	// Idle (nothing outstanding, connected) it sleeps until a completion:
	// shutdown wakes it with a flushed receive, and the agent's watchdog
	// looks for stalls and drains that never complete (watch). Otherwise it
	// wakes at least every rdmaWaitTick. (A wake by the deadline costs an
	// allocation, CQ.Wait's error: none while idle.)
	var deadline time.Time
	for {
		n, err := ch.cq.Wait(ch.wcs, deadline)
		if err != nil && !errors.Is(err, verbs.ErrTimeout) {
			ch.mu.Lock()
			if !ch.stopping {
				ch.downLocked(fmt.Errorf("%w: %s: RDMA completion queue: %v", ErrRemoteDisconnect, ch.p.name, err))
			}
			ch.mu.Unlock()
			ch.finishDone()
			return
		}
		ch.mu.Lock()
		for i := range n {
			ch.completion(&ch.wcs[i])
		}
		ch.tickLocked()
		ch.mu.Unlock()
		// A few batches, then the completions again: a device that works
		// inside the posting call (Soft-RoCE) would otherwise hold the
		// completions back until the whole post went out.
		ch.pump(4)
		ch.mu.Lock()
		ch.collectLocked()
		stop := (ch.stopping || ch.state == chDown) && ch.drained() && ch.rwgIdle()
		deadline = time.Time{}
		if ch.state != chUp || !ch.drained() {
			deadline = time.Now().Add(rdmaWaitTick)
		}
		ch.cond.Broadcast()
		ch.mu.Unlock()
		ch.finishDone()
		if stop {
			return
		}
	}
}

// watch runs the stall and drain checks from the agent's watchdog: the
// progress goroutine sleeps while it sees nothing outstanding, and a post
// on a stalled device brings it no completion.
func (ch *rdmaChan) watch() {
	ch.mu.Lock()
	ch.tickLocked()
	ch.collectLocked()
	ch.cond.Broadcast()
	ch.mu.Unlock()
	ch.finishDone()
}

// rwgIdle: no reconnection runs (under mu: reconnect sets connecting).
func (ch *rdmaChan) rwgIdle() bool { return ch.state != chConnecting }

// wakeID is the wr_id of the work request shutdown posts to a QP in ERR,
// whose flushed completion wakes an idle progress goroutine.
const wakeID = 1 << 63

// wake posts a zero-length signaled WRITE to q, in ERR: it completes
// flushed.
func wake(q *verbs.QP) {
	q.PostSend([]verbs.SendWR{{ID: wakeID, Op: verbs.OpWrite, Flags: verbs.SendSignaled}})
}

// qpIndex is the index of the QP numbered qpn, -1 for a QP of an earlier
// connection.
func (ch *rdmaChan) qpIndex(qpn uint32) int {
	for k, q := range ch.qpn {
		if q == qpn {
			return k
		}
	}
	return -1
}

// completion accounts one work completion (under mu).
func (ch *rdmaChan) completion(wc *verbs.WC) {
	k := ch.qpIndex(wc.QPNum)
	if k < 0 || wc.WRID == wakeID {
		return // a QP destroyed since; shutdown's wake-up
	}
	ch.progress = monoNow()
	seq := wc.WRID
	ring := &ch.marks[k]
	var owner mark // the mark of the completion's own work request, if signaled
	found := false
	for ring.n > 0 && ring.peek().seq <= seq {
		m := ring.pop()
		if m.seq == seq {
			owner, found = m, true
			ch.applyMark(k, &m, wc.Status == verbs.WCSuccess)
			break
		}
		ch.applyMark(k, &m, true)
	}
	ch.doneSeq[k] = max(ch.doneSeq[k], seq+1) // one past the last completed wr_id
	if wc.Status == verbs.WCSuccess {
		return
	}
	if !found && ring.n > 0 {
		owner = *ring.peek() // an unsignaled work request's: its batch's mark
	}
	if !ch.errSeen[k] {
		// The QP's first error or flush: its earlier work requests
		// completed, the unsignaled ones of this batch included.
		ch.errSeen[k] = true
		if m := &owner; m.r != nil && m.slot < 0 && m.r.rd.post == m.post {
			m.r.rd.done[k] = max(m.r.rd.done[k], m.idx-1-int32(m.seq-seq))
		}
	}
	if ch.state != chUp {
		return // flushed by our own reset
	}
	err := wcErr(ch, wc)
	if owner.r != nil && owner.r.rd.post == owner.post {
		ch.failLocked(owner.r, err)
	} else {
		ch.resetLocked()
	}
}

// applyMark applies a completed signaled work request.
func (ch *rdmaChan) applyMark(k int, m *mark, ok bool) {
	if m.slot >= 0 {
		ch.free = append(ch.free, m.slot)
	}
	if m.r == nil || m.r.rd.post != m.post {
		return // a post that ended since
	}
	rp := m.r.rd
	if m.slot >= 0 {
		rp.notifOut--
		if ok && m.fin {
			rp.delivered = max(rp.delivered, rp.partSeq[m.part])
			ch.acked = max(ch.acked, rp.partSeq[m.part])
		}
		return
	}
	if ok {
		rp.done[k] = max(rp.done[k], m.idx)
	}
}

// wcErr is the error of a failed completion: a key the target refused is
// ErrOutOfBounds (it deregistered the region), a peer whose NIC stopped
// answering ErrRemoteDisconnect.
func wcErr(ch *rdmaChan, wc *verbs.WC) error {
	e := ch.cq.Check(wc)
	switch wc.Status {
	case verbs.WCRemAccessErr:
		return fmt.Errorf("%w: %s refused an RDMA access (it deregistered the region, or the key is stale): %v", ErrOutOfBounds, ch.p.name, e)
	case verbs.WCRetryExcErr, verbs.WCRNRRetryExErr:
		return fmt.Errorf("%w: %s: its RDMA device does not answer: %v", ErrRemoteDisconnect, ch.p.name, e)
	}
	return fmt.Errorf("p2p: RDMA to %s: %v", ch.p.name, e)
}

// failLocked fails post r with err: it leaves flight once nothing of it is
// outstanding (at once, or after a reset).
func (ch *rdmaChan) failLocked(r *Request, err error) {
	rp := r.rd
	if rp.failed == nil {
		rp.failed = err
	}
	if rp.outstanding() {
		ch.resetLocked()
	}
}

// resetLocked moves the QPs to ERR, so that every outstanding work
// request completes or flushes; tickLocked reconnects once they have.
func (ch *rdmaChan) resetLocked() {
	if ch.state != chUp {
		return
	}
	ch.state = chDraining
	ch.drainAt = monoNow()
	for _, q := range ch.qps {
		if err := q.Flush(); err != nil {
			ch.a.log.Warn("p2p cannot move an RDMA QP to ERR", "peer", ch.p.name, "err", err)
		}
	}
	ch.a.log.Debug("p2p RDMA channel reset", "peer", ch.p.name, "qps", ch.String())
}

// drained reports whether no work request is outstanding on the QPs.
func (ch *rdmaChan) drained() bool {
	for k := range ch.n {
		if ch.doneSeq[k] < ch.nextSeq[k] {
			return false
		}
	}
	return true
}

// tickLocked drives resets and stalls (progress goroutine, under mu).
func (ch *rdmaChan) tickLocked() {
	now := monoNow()
	switch ch.state {
	case chDraining:
		if !ch.drained() {
			if time.Duration(now-ch.drainAt) < rdmaDrainTimeout {
				return
			}
			// The device does not flush: destroying the QPs stops it
			// touching their memory all the same.
			ch.a.log.Warn("p2p RDMA QPs did not flush; destroying them", "peer", ch.p.name, "qps", ch.String())
			closeQPs(ch.qps)
			ch.qps = nil
			for k := range ch.n {
				for ch.marks[k].n > 0 {
					m := ch.marks[k].pop()
					ch.applyMark(k, &m, false)
				}
				ch.doneSeq[k] = ch.nextSeq[k]
			}
		}
		for _, r := range ch.posts { // nothing of them is outstanding now
			rp := r.rd
			clear(rp.posted)
			copy(rp.posted, rp.done)
			rp.notifOut = 0
		}
		old := ch.qps
		ch.qps = nil
		ch.qpn = ch.qpn[:0]
		if ch.stopping {
			closeQPs(old)
			return
		}
		ch.state = chConnecting
		ch.a.mu.Lock()
		closed := ch.a.closed
		if !closed {
			ch.a.wg.Add(1)
		}
		ch.a.mu.Unlock()
		if closed {
			closeQPs(old)
			ch.downLocked(ErrClosed)
			return
		}
		ch.rwg.Add(1)
		go ch.reconnect(old)
	case chUp:
		st := ch.a.cfg.StallTimeout
		if st <= 0 || ch.drained() || time.Duration(now-ch.progress) < st {
			return
		}
		if silent := time.Duration(now - ch.p.lastRecv.Load()); silent > ch.a.cfg.PeerTimeout/2 {
			return // the peer is quiet too: PeerTimeout decides
		}
		err := stalled("no RDMA completion from %s for %v while it answers (%s)", ch.p.name,
			time.Duration(now-ch.progress).Round(time.Millisecond), ch.String())
		ch.a.log.Warn("p2p RDMA transfer stalled", "peer", ch.p.name, "err", err)
		for _, r := range ch.posts {
			if r.rd.outstanding() && r.rd.failed == nil {
				r.rd.failed = err
			}
		}
		ch.resetLocked()
	}
}

// reconnect connects new QPs after a reset.
func (ch *rdmaChan) reconnect(old []*verbs.QP) {
	defer ch.a.wg.Done()
	defer ch.rwg.Done()
	closeQPs(old)
	qps, last, err := ch.connect()
	ch.mu.Lock()
	up := false
	defer func() {
		ch.cond.Broadcast()
		ch.mu.Unlock()
		if up {
			ch.pump(-1)
			ch.mu.Lock()
			ch.collectLocked()
			ch.mu.Unlock()
			ch.finishDone()
		}
	}()
	if err != nil || ch.stopping {
		if err == nil {
			closeQPs(qps)
			err = ErrClosed
		}
		ch.downLocked(fmt.Errorf("%w: %s: reconnecting RDMA after a reset: %v", ErrRemoteDisconnect, ch.p.name, err))
		return
	}
	ch.setQPs(qps)
	ch.gen++
	ch.state = chUp
	ch.acked = max(ch.acked, last)
	ch.progress = monoNow()
	for _, r := range ch.posts {
		rp := r.rd
		// Notifications the peer delivered stay sent; from the first it did
		// not, they go again (with new sequence numbers).
		for i := rp.confirmed; i < rp.notified; i++ {
			if !r.parts[i].flag {
				continue
			}
			if rp.partSeq[i] <= last {
				rp.delivered = max(rp.delivered, rp.partSeq[i])
			} else if rp.partSeq[i] > rp.delivered {
				rp.notified = i
				break
			}
		}
	}
	ch.a.log.Debug("p2p RDMA channel reconnected", "peer", ch.p.name, "qps", ch.String(), "gen", ch.gen)
	up = true
}

// downLocked ends the channel: posts without outstanding work fail now,
// the others once the drain ends.
func (ch *rdmaChan) downLocked(err error) {
	if ch.state != chDown {
		ch.state, ch.err = chDown, err
	}
	for _, r := range ch.posts {
		if r.rd.failed == nil {
			r.rd.failed = err
		}
	}
	ch.collectLocked()
	ch.cond.Broadcast()
}

// collectLocked moves the posts that are over (all data and notifications
// complete, or failed with nothing outstanding) from posts to done.
func (ch *rdmaChan) collectLocked() {
	j := 0
	for _, r := range ch.posts {
		rp := r.rd
		switch {
		case rp.failed != nil && !rp.outstanding():
		case rp.failed == nil && ch.complete(r):
		default:
			ch.posts[j] = r
			j++
			continue
		}
		ch.done = append(ch.done, r)
	}
	clear(ch.posts[j:])
	ch.posts = ch.posts[:j]
}

// complete reports whether post r is over: every work request and
// notification completed. It counts the parts done.
func (ch *rdmaChan) complete(r *Request) bool {
	rp := r.rd
	for rp.confirmed < rp.notified {
		i := rp.confirmed
		if r.parts[i].flag && rp.delivered < rp.partSeq[i] {
			break
		}
		if !ch.dataDone(r, i) {
			break
		}
		rp.confirmed++
		r.partsDone.Add(1)
	}
	return rp.confirmed == len(r.parts) && rp.notifOut == 0
}

// dataDone: every work request of part i completed.
func (ch *rdmaChan) dataDone(r *Request, i int) bool {
	for k := range ch.n {
		if r.rd.done[k] < r.rd.partEnd[i][k] {
			return false
		}
	}
	return true
}

// finishDone finishes the posts collectLocked set aside (outside mu:
// finishing runs callbacks).
func (ch *rdmaChan) finishDone() {
	for {
		// One finisher at a time (the scratch is shared); one that finds
		// another at work (an OnComplete that posts, say) leaves its posts
		// to it.
		if !ch.fmu.TryLock() {
			ch.refinish.Store(true)
			return
		}
		ch.refinish.Store(false)
		ch.mu.Lock()
		done := ch.done
		ch.done, ch.spare = ch.spare[:0], nil
		ch.mu.Unlock()
		for i, r := range done {
			if ch.p.take(r.rd.post) == r {
				r.finish(r.rd.failed)
			}
			done[i] = nil
		}
		ch.mu.Lock()
		ch.spare = done[:0]
		more := len(ch.done) > 0
		ch.mu.Unlock()
		ch.fmu.Unlock()
		if !more && !ch.refinish.Load() {
			return
		}
	}
}

// retire returns once nothing of post id of r is outstanding on the QPs
// (resetting the channel if need be): the post left flight (it failed, or
// timed out) and its memory is its owner's again. Not on the progress
// goroutine, which never finishes a post with work outstanding.
func (ch *rdmaChan) retire(r *Request, id uint64) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	rp := r.rd
	if rp.post != id {
		return
	}
	if rp.failed == nil {
		rp.failed = ErrCanceled
	}
	for rp.post == id && rp.outstanding() && (ch.state == chUp || ch.state == chDraining) {
		ch.resetLocked()
		ch.cond.Wait()
	}
	// Out of the posts: nothing more of it is posted.
	for i, q := range ch.posts {
		if q == r {
			ch.posts = append(ch.posts[:i], ch.posts[i+1:]...)
			break
		}
	}
	ch.cond.Broadcast()
}

// cancel fails post id of r with err once nothing of it can land: its
// outstanding work flushed and, if there was any, the peer's QPs replaced
// (they may have had packets of it in flight). It returns when the
// channel is connected again or down, or ctx ends.
func (ch *rdmaChan) cancel(r *Request, id uint64, err error, deadline <-chan struct{}) error {
	ch.mu.Lock()
	rp := r.rd
	if rp.post != id {
		ch.mu.Unlock()
		return nil
	}
	gen := ch.gen
	reset := rp.outstanding()
	if rp.failed == nil {
		rp.failed = err
		rp.canceled = true
	}
	if reset {
		ch.resetLocked()
	}
	ch.collectLocked()
	ch.mu.Unlock()
	ch.finishDone()
	if !reset {
		return nil
	}
	// Woken by every progress round (at least every rdmaWaitTick).
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-deadline:
			ch.mu.Lock()
			ch.cond.Broadcast()
			ch.mu.Unlock()
		case <-stop:
		}
	}()
	ch.mu.Lock()
	defer ch.mu.Unlock()
	for ch.gen == gen && ch.state != chDown {
		select {
		case <-deadline:
			return errors.New("the peer did not confirm that its QPs were replaced")
		default:
		}
		ch.cond.Wait()
	}
	if ch.state == chDown && ch.gen == gen {
		return ch.err
	}
	return nil
}

// landed is how many bytes of each part of the current post of r landed
// (their work requests completed): cancellation's report.
func (ch *rdmaChan) landed(r *Request, out []uint64) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	rp := r.rd
	for k := range ch.n {
		for i := range int(rp.done[k]) {
			w := &rp.wrs[k][i]
			for _, s := range w.SGEs {
				out[rp.wrPart[k][i]] += uint64(s.Length)
			}
		}
	}
}

// shutdown ends the channel (the connection failed, or the agent closes):
// its posts fail with err once drained, and its QPs, CQ and buffers go.
func (ch *rdmaChan) shutdown(err error) {
	ch.mu.Lock()
	ch.stopping = true
	if ch.state == chUp {
		ch.resetLocked()
		if len(ch.qps) > 0 {
			// A completion for the progress goroutine, asleep if idle: work
			// posted to a QP in ERR is flushed.
			wake(ch.qps[0])
		}
	}
	ch.downLocked(err)
	ch.mu.Unlock()
	select {
	case <-ch.loopDone:
	case <-time.After(rdmaDrainTimeout + rdmaWaitTick):
		// No completion woke it: closing the CQ ends its wait.
		ch.mu.Lock()
		closeQPs(ch.qps)
		ch.qps = nil
		ch.mu.Unlock()
		ch.cq.Close()
		<-ch.loopDone
	}
	ch.rwg.Wait()
	ch.mu.Lock()
	for _, r := range ch.posts {
		ch.done = append(ch.done, r)
	}
	ch.posts = nil
	closeQPs(ch.qps)
	ch.qps = nil
	ch.cond.Broadcast()
	ch.mu.Unlock()
	ch.finishDone()
	ch.bmr.Close()
	ch.cq.Close()
}

// The responder: this agent's side of a peer's channel. It receives the
// peer's notifications on QP 0 and delivers them in order, once each.

type rdmaResp struct {
	a    *Agent
	p    *peer
	cq   *verbs.CQ
	qps  []*verbs.QP
	buf  []byte
	mr   *verbs.MR
	wcs  []verbs.WC
	rwr  [1]verbs.RecvWR
	rsge [1]verbs.SGE

	mu      sync.Mutex
	cond    *sync.Cond // last advanced
	last    uint64     // the last notification delivered
	asm     []byte     // a notification being reassembled
	asmSeq  uint64
	stop    chan struct{}
	stopped chan struct{}
}

// acceptRDMA replaces the responder of this connection with one connected
// to the peer's endpoints in payload, and returns the accept payload
// (serveRDMAConnect's goroutine).
func (p *peer) acceptRDMA(payload []byte) ([]byte, error) {
	a := p.a
	if a.rdma == nil {
		return nil, a.rdmaErr
	}
	if len(payload) < 8 {
		return nil, errors.New("short RDMA connect")
	}
	n := int(binary.LittleEndian.Uint16(payload))
	if n < 1 || n > maxRDMAQPs || len(payload) != 8+n*verbs.EndpointSize {
		return nil, fmt.Errorf("RDMA connect of %d bytes for %d QPs", len(payload), n)
	}
	eps := make([]verbs.Endpoint, n)
	for i := range eps {
		if err := eps[i].UnmarshalBinary(payload[8+i*verbs.EndpointSize : 8+(i+1)*verbs.EndpointSize]); err != nil {
			return nil, err
		}
	}
	p.rmu.Lock()
	defer p.rmu.Unlock()
	var last uint64
	if old := p.rsp; old != nil {
		// Its QPs go to ERR first: nothing still in flight to them lands.
		last = old.close()
		p.rsp = nil
	}
	rs, err := newRDMAResp(p, eps, last)
	if err != nil {
		return nil, err
	}
	p.rsp = rs
	out := make([]byte, 16, 16+n*verbs.EndpointSize)
	binary.LittleEndian.PutUint16(out, uint16(n))
	binary.LittleEndian.PutUint64(out[8:], last)
	for _, q := range rs.qps {
		out, _ = q.Endpoint().AppendBinary(out)
	}
	return out, nil
}

func newRDMAResp(p *peer, eps []verbs.Endpoint, last uint64) (*rdmaResp, error) {
	a, d := p.a, p.a.rdma
	rs := &rdmaResp{a: a, p: p, last: last, wcs: make([]verbs.WC, 32), stop: make(chan struct{}), stopped: make(chan struct{})}
	rs.cond = sync.NewCond(&rs.mu)
	var err error
	if rs.cq, err = d.ctx.CreateCQ(rdmaRecvs+len(eps)+16, true); err != nil {
		return nil, err
	}
	rs.buf = make([]byte, rdmaRecvs*rdmaSlotSize)
	if rs.mr, err = d.pd.Register(rs.buf, verbs.AccessLocalWrite); err != nil {
		rs.cq.Close()
		return nil, err
	}
	for i := range eps {
		o := verbs.QPOptions{Port: d.port, SendCQ: rs.cq, RecvCQ: rs.cq, MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}
		if i == 0 {
			o.MaxRecvWR = rdmaRecvs
		}
		q, err := d.pd.CreateQP(o)
		if err == nil {
			rs.qps = append(rs.qps, q)
			err = q.Connect(eps[i], d.vcfg)
		}
		if err != nil {
			rs.release()
			return nil, err
		}
	}
	for i := range rdmaRecvs {
		if err := rs.repost(i); err != nil {
			rs.release()
			return nil, err
		}
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		rs.release()
		return nil, ErrClosed
	}
	a.wg.Add(1)
	a.mu.Unlock()
	go rs.loop()
	return rs, nil
}

func (rs *rdmaResp) repost(slot int) error {
	rs.rsge[0] = rs.mr.SGE(slot*rdmaSlotSize, rdmaSlotSize)
	rs.rwr[0] = verbs.RecvWR{ID: uint64(slot), SGEs: rs.rsge[:]}
	return rs.qps[0].PostRecv(rs.rwr[:])
}

func (rs *rdmaResp) release() {
	closeQPs(rs.qps)
	rs.mr.Close()
	rs.cq.Close()
}

func (rs *rdmaResp) loop() {
	defer rs.a.wg.Done()
	defer close(rs.stopped)
	for {
		select {
		case <-rs.stop:
			return
		default:
		}
		// No deadline: close flushes the receives, which wakes it.
		n, err := rs.cq.Wait(rs.wcs, time.Time{})
		if err != nil {
			return
		}
		for i := range n {
			wc := &rs.wcs[i]
			if wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecv {
				continue // flushed: the QP is being replaced
			}
			slot := int(wc.WRID)
			rs.receive(rs.buf[slot*rdmaSlotSize : slot*rdmaSlotSize+int(wc.ByteLen)])
			if err := rs.repost(slot); err != nil {
				rs.a.log.Warn("p2p cannot post an RDMA receive", "peer", rs.p.name, "err", err)
			}
		}
	}
}

// receive takes one notification fragment.
func (rs *rdmaResp) receive(b []byte) {
	if len(b) < rdmaNotifHdr || binary.LittleEndian.Uint16(b) != notifMagic {
		rs.a.log.Warn("p2p dropped a malformed RDMA notification", "peer", rs.p.name, "bytes", len(b))
		return
	}
	total := int(binary.LittleEndian.Uint32(b[4:]))
	seq := binary.LittleEndian.Uint64(b[8:])
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if seq <= rs.last || total > maxCtrlPayload {
		return // delivered before a reset, sent again
	}
	if seq != rs.asmSeq {
		rs.asm, rs.asmSeq = make([]byte, 0, total), seq
	}
	rs.asm = append(rs.asm, b[rdmaNotifHdr:]...)
	if b[2] == 1 {
		msg := rs.asm
		rs.asm, rs.last = nil, seq
		if len(msg) == total {
			if err := rs.a.deliverNotif(rs.p.name, msg); err != nil {
				// Dropping the peer stops this loop: not from inside it.
				go rs.p.fail(fmt.Errorf("%w: %v", ErrRemoteDisconnect, err), true)
			}
		}
		rs.cond.Broadcast()
	}
}

// waitDelivered waits (the connection's reader, at a barrier) until the
// notification numbered seq is delivered, or timeout.
func (rs *rdmaResp) waitDelivered(seq uint64, timeout time.Duration) {
	t := time.AfterFunc(timeout, func() {
		rs.mu.Lock()
		rs.cond.Broadcast()
		rs.mu.Unlock()
	})
	defer t.Stop()
	start := time.Now()
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for rs.last < seq && time.Since(start) < timeout {
		select {
		case <-rs.stopped:
			return
		default:
		}
		rs.cond.Wait()
	}
}

// close moves the QPs to ERR, stops the goroutine, frees everything and
// returns the last notification delivered.
func (rs *rdmaResp) close() uint64 {
	close(rs.stop) // before the flush, whose completions wake the goroutine
	for _, q := range rs.qps {
		q.Flush()
	}
	if len(rs.qps) > 0 {
		wake(rs.qps[0]) // a device may flush no receives (Soft-RoCE in Linux 6.1)
	}
	select {
	case <-rs.stopped:
	case <-time.After(rdmaDrainTimeout):
		closeQPs(rs.qps) // no completion woke it: closing the CQ ends its wait
		rs.qps = nil
		rs.cq.Close()
		<-rs.stopped
	}
	rs.mu.Lock()
	rs.cond.Broadcast() // a barrier waiting on it
	rs.mu.Unlock()
	// Receives that completed before the flush are delivered: the peer saw
	// their SENDs acknowledged.
	for {
		n, err := rs.cq.Poll(rs.wcs)
		if n == 0 || err != nil {
			break
		}
		for i := range n {
			if wc := &rs.wcs[i]; wc.Status == verbs.WCSuccess && wc.Opcode == verbs.WCRecv {
				slot := int(wc.WRID)
				rs.receive(rs.buf[slot*rdmaSlotSize : slot*rdmaSlotSize+int(wc.ByteLen)])
			}
		}
	}
	rs.release()
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.last
}
