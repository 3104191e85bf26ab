package ibverbs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/gccl/gccl/internal/verbs"
	"github.com/gccl/gccl/transport"
)

// conn is the connection with one peer: qps RC QPs, one registered region
// (receive ring, send ring, control words) and the counters of both rings.
// Everything but the failure is the owner's: the rank's goroutine inside
// Endpoint.enter, or Close once it has taken the endpoint over.
type conn struct {
	e    *Endpoint
	peer int
	g    geometry
	buf  []byte // the registered region
	mr   *verbs.MR
	qps  []*verbs.QP
	lkey uint32
	base uint64 // buf's address
	// The peer's region.
	raddr uint64
	rkey  uint32

	// Sending: messages [credit, tail) are in flight; the peer released
	// the ones before credit.
	tail, credit uint64
	reserved     bool
	n            int   // length of the reserved message
	sqData       []int // per QP: message pieces posted and not completed
	sqCtl        int   // credits and notices posted on QP 0, not completed
	wr           []verbs.SendWR
	sge          []verbs.SGE
	ctlWR        [1]verbs.SendWR
	ctlSGE       [1]verbs.SGE
	inline       bool     // credits go inline
	pieces       []uint64 // per QP: message pieces posted (tests, logs)

	// Receiving: messages [head, ready) are complete and not released;
	// got and need count the pieces of those after ready, by slot.
	head, ready uint64
	got, need   []uint8
	repost      []int            // per QP: receives consumed, to post again
	rwr         [][]verbs.RecvWR // per QP: receives to post, their IDs set
	creditSent  uint64           // the head last credited to the peer
	creditOwed  bool             // head > creditSent
	dirty       bool             // on the endpoint's list of connections to finish

	// The peer's state, from its notices.
	peerState peerState
	closeAt   uint64 // with peerClosed: the messages it sent in all
	reason    string // with peerAborted

	err error // the connection failed; every call returns it

	// Setting up (pair.go): up once the QPs are connected and the outcome
	// applied; until then Commit only queues. A pair whose RDMA failed
	// goes through the TCP fallback's sender and receiver.
	up      bool
	setup   atomic.Pointer[setupResult] // the set-up's outcome, once it ended
	applied atomic.Bool                 // the outcome was applied
	tcpS    transport.Sender
	tcpR    transport.Receiver
}

type peerState uint8

const (
	peerOpen peerState = iota
	peerClosed
	peerAborted
)

// newConn makes the connection with peer, memory only: its region is
// registered, and its QPs made, by open (the pair's set-up goroutine).
func (e *Endpoint) newConn(peer int, g geometry) *conn {
	return &conn{e: e, peer: peer, g: g, buf: make([]byte, g.bytes()),
		sqData: make([]int, g.qps), repost: make([]int, g.qps), pieces: make([]uint64, g.qps),
		got: make([]uint8, g.count), need: make([]uint8, g.count),
		wr: make([]verbs.SendWR, g.qps), sge: make([]verbs.SGE, g.qps)}
}

// open sets up this side of the connection: registers its memory, creates
// its QPs (in INIT) and posts their receives. The owner does not touch the
// connection's verbs objects until the set-up's outcome is applied.
func (c *conn) open() (err error) {
	e, g, peer := c.e, c.g, c.peer
	defer func() {
		if err != nil {
			c.release()
		}
	}()
	if c.mr, err = e.pd.Register(c.buf, verbs.AccessAll); err != nil {
		return err
	}
	e.registered.Add(int64(len(c.buf)))
	c.lkey, c.base = c.mr.LKey(), c.mr.Addr()
	for range g.qps {
		q, err := e.pd.CreateQP(verbs.QPOptions{Port: e.port, SendCQ: e.cq, RecvCQ: e.cq,
			MaxSendWR: g.sendDepth(), MaxRecvWR: g.recvDepth(), MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: 64})
		if err != nil {
			return err
		}
		c.qps = append(c.qps, q)
	}
	c.inline = c.qps[0].Caps().MaxInline >= 8
	c.rwr = make([][]verbs.RecvWR, g.qps)
	for j, q := range c.qps {
		c.rwr[j] = make([]verbs.RecvWR, g.recvDepth())
		for i := range c.rwr[j] {
			c.rwr[j][i] = verbs.RecvWR{ID: makeWRID(wrRecv, j, peer)}
		}
		if err := q.PostRecv(c.rwr[j]); err != nil {
			return err
		}
	}
	for j := range c.wr {
		c.wr[j] = verbs.SendWR{Op: verbs.OpWriteWithImm, Flags: verbs.SendSignaled, ID: makeWRID(wrData, j, peer), SGEs: c.sge[j : j+1]}
	}
	c.ctlWR[0] = verbs.SendWR{Op: verbs.OpWriteWithImm, Flags: verbs.SendSignaled, ID: makeWRID(wrCtl, 0, peer), SGEs: c.ctlSGE[:]}
	return nil
}

// info is what the peer needs to connect to this side.
func (c *conn) info() pairInfo {
	p := pairInfo{SlotSize: c.g.slotSize, Count: c.g.count, Addr: c.base, RKey: c.mr.RKey()}
	for _, q := range c.qps {
		p.Endpoints = append(p.Endpoints, q.Endpoint())
	}
	return p
}

// breakConnect, when set (tests), fails connect for the pairs it returns
// an error for.
var breakConnect func(rank, peer int) error

// connect moves the QPs to RTS, each connected to the peer's QP of the
// same index.
func (c *conn) connect(p pairInfo, cfg verbs.Config) error {
	if p.SlotSize != c.g.slotSize || p.Count != c.g.count || len(p.Endpoints) != c.g.qps {
		return fmt.Errorf("the peer uses %d slots of %d bytes over %d QPs, this rank %d of %d over %d (GCCL_SLOT_SIZE, GCCL_SLOT_COUNT and GCCL_IB_QPS_PER_CONNECTION must agree)",
			p.Count, p.SlotSize, len(p.Endpoints), c.g.count, c.g.slotSize, c.g.qps)
	}
	c.raddr, c.rkey = p.Addr, p.RKey
	if breakConnect != nil {
		if err := breakConnect(c.e.rank, c.peer); err != nil {
			return fmt.Errorf("QP failed to reach RTR/RTS: %w", err)
		}
	}
	for j, q := range c.qps {
		if err := q.Connect(p.Endpoints[j], cfg); err != nil {
			return fmt.Errorf("QP failed to reach RTR/RTS: %w", err)
		}
	}
	return nil
}

// release destroys the QPs and deregisters the memory.
func (c *conn) release() error {
	var errs []error
	for _, q := range c.qps {
		errs = append(errs, q.Close())
	}
	c.qps = nil
	if c.mr != nil {
		errs = append(errs, c.mr.Close())
		c.mr = nil
		c.e.registered.Add(-int64(len(c.buf)))
	}
	return errors.Join(errs...)
}

// fail records the connection's first failure and flushes its QPs, so that
// nothing more goes out and everything outstanding completes.
func (c *conn) fail(err error) {
	if c.err != nil {
		return
	}
	c.err = &transport.PeerError{Peer: c.peer, Err: err}
	for _, q := range c.qps {
		q.Flush()
	}
}

// failWC fails the connection with a work completion's error: the HCA, the
// QP, the pair and the status. A peer that stopped answering (retries
// exceeded) or a flush counts as a lost peer.
func (c *conn) failWC(k wrKind, wc *verbs.WC) {
	if c.err != nil {
		return
	}
	what := map[wrKind]string{wrRecv: "receive", wrData: "RDMA write of a message", wrCtl: "RDMA write of a credit or notice"}[k]
	err := fmt.Errorf("ibverbs: NET/IB/%s QP %#x, rank %d -> %d: %s failed: %s (status %d, vendor error %#x)",
		c.e.port.Device+":"+fmt.Sprint(c.e.port.Num), wc.QPNum, c.e.rank, c.peer, what, wc.Status, uint32(wc.Status), wc.VendorErr)
	switch wc.Status {
	case verbs.WCRetryExcErr, verbs.WCRNRRetryExErr, verbs.WCFlushErr:
		err = fmt.Errorf("%w: %w", transport.ErrPeerClosed, err)
	}
	c.fail(err)
}

func (c *conn) protocolError(format string, args ...any) {
	c.fail(fmt.Errorf("ibverbs: rank %d -> %d: %s", c.e.rank, c.peer, fmt.Sprintf(format, args...)))
}

// complete takes one successful completion of the connection.
func (c *conn) complete(k wrKind, j int, wc *verbs.WC) {
	switch k {
	case wrData:
		c.sqData[j]--
		return
	case wrCtl:
		c.sqCtl--
		return
	}
	c.repost[j]++
	c.markDirty()
	kind, v := splitImm(wc.Imm)
	switch kind {
	case immData:
		parts, low := splitData(v)
		d := advance(c.ready, low, seqBits)
		if d >= uint64(c.g.count) || c.ready+d >= c.head+uint64(c.g.count) || parts > c.g.qps {
			c.protocolError("piece %d/%d of message %d while messages %d to %d may arrive", j, parts, c.ready+d, c.ready, c.head+uint64(c.g.count)-1)
			return
		}
		i := (c.ready + d) % uint64(c.g.count)
		if c.need[i] != 0 && int(c.need[i]) != parts || int(c.got[i]) >= parts {
			c.protocolError("piece %d of message %d does not add up (%d of %d pieces)", j, c.ready+d, c.got[i], parts)
			return
		}
		c.need[i] = uint8(parts)
		c.got[i]++
		if j == 0 {
			// The header came with piece 0: its piggybacked credit.
			if cr := hdrCredit(c.buf[c.g.recvOff(int(i)):]); cr > c.credit {
				if cr > c.tail {
					c.protocolError("message %d credits %d messages, %d were sent", c.ready+d, cr, c.tail)
					return
				}
				c.credit = cr
			}
		}
		for c.ready < c.head+uint64(c.g.count) {
			i := c.ready % uint64(c.g.count)
			if c.need[i] == 0 || c.got[i] < c.need[i] {
				break
			}
			c.got[i], c.need[i] = 0, 0
			c.ready++
		}
	case immCredit:
		// Credits ride in headers too, so this one may be behind.
		if d := advance(c.credit, v, valBits); d <= c.tail-c.credit {
			c.credit += d
		} else if d < 1<<(valBits-1) {
			c.protocolError("credit for %d messages, %d are in flight", d, c.tail-c.credit)
			return
		}
	case immClose:
		c.peerState = peerClosed
		c.closeAt = c.ready + advance(c.ready, v, valBits)
	case immAbort:
		n := min(int(v), reasonMax)
		off := c.g.ctrlOff() + ctrlReason
		c.reason = string(c.buf[off : off+n])
		c.peerState = peerAborted
	}
}

func (c *conn) markDirty() {
	if !c.dirty {
		c.dirty = true
		c.e.dirty = append(c.e.dirty, c)
	}
}

// finish posts the receives the last polls consumed, repostBatch or more
// at a time (all with force), and a credit that waited for room.
func (c *conn) finish(force bool) {
	c.dirty = false
	if c.err != nil || !c.up {
		return
	}
	for j, n := range c.repost {
		if n == 0 || n < repostBatch && !force {
			continue
		}
		c.repost[j] = 0
		if err := c.qps[j].PostRecv(c.rwr[j][:n]); err != nil {
			c.fail(fmt.Errorf("ibverbs: rank %d -> %d: %w", c.e.rank, c.peer, err))
			return
		}
	}
	if c.creditOwed && (force || c.head-c.creditSent >= c.g.creditBatch()) {
		c.sendCredit()
	}
}

// postCtl writes n bytes at offset src of this side's control area into
// offset dst of the peer's, with immediate imm, on QP 0.
func (c *conn) postCtl(src, dst, n int, imm uint32, inline bool) error {
	ctrl := c.g.ctrlOff()
	c.ctlSGE[0] = c.mr.SGE(ctrl+src, n)
	w := &c.ctlWR[0]
	w.Imm = imm
	w.RemoteAddr = c.raddr + uint64(ctrl+dst)
	w.RKey = c.rkey
	w.Flags = verbs.SendSignaled
	if inline {
		w.Flags |= verbs.SendInline
	}
	if err := c.qps[0].PostSend(c.ctlWR[:]); err != nil {
		return err
	}
	c.sqCtl++
	return nil
}

// sendCredit tells the peer how many of its messages this side released:
// an RDMA WRITE of the head into the peer's credit word, with immediate.
func (c *conn) sendCredit() {
	if c.err != nil || c.peerState != peerOpen {
		c.creditOwed = false
		return
	}
	if !c.up {
		// Messages can land before this side applied the set-up (the
		// peer's came first): the credit waits for it (settle forces it).
		return
	}
	if c.sqCtl >= c.g.ctlMax() {
		c.markDirty() // finish tries again after the next poll
		return
	}
	c.creditOwed = false
	c.creditSent = c.head
	binary.LittleEndian.PutUint64(c.buf[c.g.ctrlOff()+ctrlCreditSrc:], c.head)
	if err := c.postCtl(ctrlCreditSrc, ctrlCredit, 8, makeImm(immCredit, c.head), c.inline); err != nil {
		c.fail(fmt.Errorf("ibverbs: rank %d -> %d: posting a credit: %w", c.e.rank, c.peer, err))
	}
}

// sendNotice tells the peer this side closes (reason nil: after the
// messages it sent) or aborts (with the reason). Best effort. A peer that
// closed first still gets it: its Close waits for this notice (drain). One
// that aborted waits for nothing, and may have destroyed its QP already.
func (c *conn) sendNotice(reason error) {
	if c.err != nil || !c.up || c.peerState == peerAborted || c.sqCtl >= c.g.ctlMax()+2 {
		return
	}
	ctrl := c.g.ctrlOff()
	if reason == nil {
		binary.LittleEndian.PutUint64(c.buf[ctrl+ctrlCloseSrc:], c.tail)
		c.postCtl(ctrlCloseSrc, ctrlClose, 8, makeImm(immClose, c.tail), false)
		return
	}
	n := copy(c.buf[ctrl+ctrlReasonSrc:ctrl+ctrlReasonSrc+reasonMax], reason.Error())
	c.postCtl(ctrlReasonSrc, ctrlReason, max(n, 1), makeImm(immAbort, uint64(n)), false)
}

// rxErr is why nothing more will come from the peer, once everything it
// sent is taken; nil while more may come.
func (c *conn) rxErr() error {
	switch {
	case c.err != nil:
		return c.err
	case c.peerState == peerAborted:
		return &transport.PeerError{Peer: c.peer, Err: fmt.Errorf("%w: rank aborted: %s", transport.ErrPeerClosed, c.reason)}
	case c.peerState == peerClosed && c.ready >= c.closeAt:
		return &transport.PeerError{Peer: c.peer, Err: transport.ErrPeerClosed}
	}
	return nil
}

// txErr is why nothing more can go to the peer; nil while it can.
func (c *conn) txErr() error {
	switch {
	case c.err != nil:
		return c.err
	case c.peerState == peerAborted:
		return &transport.PeerError{Peer: c.peer, Err: fmt.Errorf("%w: rank aborted: %s", transport.ErrPeerClosed, c.reason)}
	case c.peerState == peerClosed:
		return &transport.PeerError{Peer: c.peer, Err: transport.ErrPeerClosed}
	}
	return nil
}

// canSend reports whether an n-byte message may be reserved: a credit for
// it, and room on each of its QPs.
func (c *conn) canSend(n int) bool {
	if c.tail-c.credit >= uint64(c.g.count) {
		return false
	}
	for j := range c.g.pieces(n) {
		if c.sqData[j] >= c.g.count {
			return false
		}
	}
	return true
}

// idle reports whether nothing this side posted is still outstanding.
func (c *conn) idle() bool {
	if c.sqCtl != 0 {
		return false
	}
	for _, n := range c.sqData {
		if n != 0 {
			return false
		}
	}
	return true
}

// sender and receiver are the connection's two halves.
type sender conn
type receiver conn

// TryReserve returns slot tail of the send ring, when the peer has
// released enough of the ring and the QPs have room.
func (s *sender) TryReserve(n int) ([]byte, bool, error) {
	c := (*conn)(s)
	if n < 0 || n > c.g.slotSize {
		return nil, false, fmt.Errorf("ibverbs: message of %d bytes exceeds slot size %d", n, c.g.slotSize)
	}
	e := c.e
	if !e.enter() {
		return nil, false, transport.ErrClosed
	}
	if c.tcpS != nil {
		b, ok, err := c.tcpReserve(n)
		e.leave()
		return b, ok, err
	}
	if err := c.txErr(); err != nil {
		e.leave()
		return nil, false, err
	}
	if !c.canSend(n) {
		e.progress()
		if c.tcpS != nil {
			b, ok, err := c.tcpReserve(n)
			e.leave()
			return b, ok, err
		}
		if err := c.txErr(); err != nil || !c.canSend(n) {
			e.leave()
			return nil, false, err
		}
	}
	c.reserved, c.n = true, n
	off := c.g.sendOff(int(c.tail%uint64(c.g.count))) + hdrSize
	e.leave()
	return c.buf[off : off+n : off+n], true, nil
}

func (c *conn) tcpReserve(n int) ([]byte, bool, error) {
	if c.err != nil {
		return nil, false, c.err
	}
	return c.tcpS.TryReserve(n)
}

// Commit writes the header and posts the message: one RDMA WRITE with
// immediate per piece, each into the same slot of the peer's receive ring.
// Before the pair is up it only queues the message.
func (s *sender) Commit(tag transport.Tag) {
	c := (*conn)(s)
	e := c.e
	if !e.enter() {
		return
	}
	defer e.leave()
	if c.tcpS != nil {
		switch {
		case c.reserved: // in the send ring, before the pair moved
			c.reserved = false
			c.handOver(tag)
		case c.err == nil:
			c.tcpS.Commit(tag)
		}
		return
	}
	if !c.reserved {
		return
	}
	c.reserved = false
	if c.err != nil {
		return
	}
	off := c.g.sendOff(int(c.tail % uint64(c.g.count)))
	putHeader(c.buf[off:], c.n, c.tail, uint64(tag), c.head)
	c.creditSent, c.creditOwed = c.head, false
	if c.up && !c.post(c.tail, c.n) {
		return
	}
	c.tail++
}

// post posts message seq (n bytes, its header written) as one RDMA WRITE
// with immediate per piece. It reports false when the connection failed.
func (c *conn) post(seq uint64, n int) bool {
	i := int(seq % uint64(c.g.count))
	off := c.g.sendOff(i)
	parts := c.g.pieces(n)
	imm := dataImm(seq, parts)
	raddr := c.raddr + uint64(c.g.recvOff(i))
	for j := range parts {
		po, pn := c.g.piece(n, parts, j)
		c.sge[j] = verbs.SGE{Addr: c.base + uint64(off+po), Length: uint32(pn), LKey: c.lkey}
		w := &c.wr[j]
		w.Imm, w.RemoteAddr, w.RKey = imm, raddr+uint64(po), c.rkey
		if err := c.qps[j].PostSend(c.wr[j : j+1]); err != nil {
			c.fail(fmt.Errorf("ibverbs: rank %d -> %d: posting message %d: %w", c.e.rank, c.peer, seq, err))
			return false
		}
		c.sqData[j]++
		c.pieces[j]++
	}
	return true
}

// TryNext returns the oldest complete message of the receive ring.
func (r *receiver) TryNext() ([]byte, transport.Tag, bool, error) {
	c := (*conn)(r)
	e := c.e
	if !e.enter() {
		return nil, 0, false, transport.ErrClosed
	}
	if c.tcpR != nil {
		m, tag, ok, err := c.tcpNext()
		e.leave()
		return m, tag, ok, err
	}
	if c.head == c.ready {
		e.progress()
		if c.tcpR != nil { // moved to TCP just now
			m, tag, ok, err := c.tcpNext()
			e.leave()
			return m, tag, ok, err
		}
		if c.head == c.ready {
			// Waiting for the peer: let it have every slot.
			if c.creditOwed {
				c.sendCredit()
			}
			err := c.rxErr()
			e.leave()
			return nil, 0, false, err
		}
	}
	off := c.g.recvOff(int(c.head % uint64(c.g.count)))
	n, seq, tag := header(c.buf[off:])
	if seq != uint32(c.head) || n > c.g.slotSize {
		c.protocolError("slot %d holds message %d of %d bytes where message %d is due", c.head%uint64(c.g.count), seq, n, uint32(c.head))
		err := c.err
		e.leave()
		return nil, 0, false, err
	}
	off += hdrSize
	e.leave()
	return c.buf[off : off+n : off+n], transport.Tag(tag), true, nil
}

func (c *conn) tcpNext() ([]byte, transport.Tag, bool, error) {
	if c.err != nil {
		return nil, 0, false, c.err
	}
	return c.tcpR.TryNext()
}

// Release frees the oldest message's slot and credits it to the peer.
func (r *receiver) Release() {
	c := (*conn)(r)
	e := c.e
	if !e.enter() {
		return
	}
	switch {
	case c.tcpR != nil:
		c.tcpR.Release()
	case c.head != c.ready:
		c.head++
		c.creditOwed = true
		if c.head-c.creditSent >= c.g.creditBatch() {
			c.sendCredit()
		}
	}
	e.leave()
}
