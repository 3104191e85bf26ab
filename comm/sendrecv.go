package comm

import (
	"context"
	"errors"

	"github.com/gccl/gccl/transport"
)

// P2P is one send or receive of a group call. Build it with SendTo,
// RecvFrom, SendBuffer or RecvBuffer.
type P2P struct {
	peer int
	recv bool
	v    view
	err  error
	// tag, when set, is the op's message tag, preset by a variable-size
	// collective (vcoll.go) instead of the next Send/Recv number; such an
	// op exchanges one message even when it is empty, so that a peer
	// expecting another count meets it at once.
	tag transport.Tag
}

// SendTo describes sending s to peer.
func SendTo[T Scalar](peer int, s []T) P2P { return P2P{peer: peer, v: viewOf(s)} }

// RecvFrom describes receiving from peer into s.
func RecvFrom[T Scalar](peer int, s []T) P2P { return P2P{peer: peer, recv: true, v: viewOf(s)} }

// SendBuffer describes sending b to peer.
func SendBuffer(peer int, b Buffer) P2P {
	v, err := viewOfBuffer(b)
	return P2P{peer: peer, v: v, err: err}
}

// RecvBuffer describes receiving from peer into b.
func RecvBuffer(peer int, b Buffer) P2P {
	v, err := viewOfBuffer(b)
	return P2P{peer: peer, recv: true, v: v, err: err}
}

// Group runs several sends and receives as one step: they all progress at
// once, so any pattern (every rank sending to and receiving from its
// neighbours, say) completes without deadlock. Sends to one peer arrive in
// order and match that peer's receives from this rank in order; a send's
// length must equal the matching receive's. Sends to this rank itself are
// matched with receives from itself, in order, and copied. A send buffer may
// overlap a receive buffer of the same group (in place): it is staged first.
func (c *Comm) Group(ctx context.Context, ops ...P2P) error {
	// ops travels as its own parameter, not inside a call, so that escape
	// analysis can see it stays on the caller's stack.
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	if err := c.prepareGroup(ops); err != nil {
		return err
	}
	if groupHasDevice(ops) {
		// Device buffers are staged, and their streams held, by run, which
		// changes the ops' views: it runs on a copy, in space kept for the
		// next call.
		cl := call{isGroup: true, path: pathGroup, group: append(c.groupOps[:0], ops...)}
		c.groupOps = cl.group[:0]
		err := c.holdStreams(&cl)
		if err == nil {
			if c.async.pending() > 0 {
				err = c.waitQueued(ctx, &cl)
			} else {
				err = c.run(ctx, &cl)
			}
		}
		clear(cl.group) // the caller's buffers are not kept alive
		return err
	}
	if c.async.pending() > 0 {
		return c.waitQueued(ctx, &call{isGroup: true, path: pathGroup, group: append([]P2P(nil), ops...)})
	}
	if c.state.Load() != stateOpen {
		return &OpError{Op: "Group", Rank: c.rank, Peer: -1, Err: c.closedErr()}
	}
	c.telBeginGroup(ops)
	err := c.settled("Group", 0, c.runGroup(ctx, "Group", 0, ops, false, false))
	c.telEnd(err != nil)
	if err != nil {
		var oe *OpError
		if !errors.As(err, &oe) {
			err = &OpError{Op: "Group", Rank: c.rank, Peer: -1, Err: err}
		}
		c.fail(err)
	}
	return err
}

// GroupAsync is the async form of Group. ops is copied; the buffers it
// names must stay untouched until the request completes.
func (c *Comm) GroupAsync(ops ...P2P) *Request {
	return c.issueAsync(&call{isGroup: true, group: ops})
}

// Send sends s to peer, which must call Recv (or a Group receive) with a
// buffer of the same length.
func Send[T Scalar](ctx context.Context, c *Comm, s []T, peer int) error {
	return c.Group(ctx, SendTo(peer, s))
}

// Recv receives from peer into s.
func Recv[T Scalar](ctx context.Context, c *Comm, s []T, peer int) error {
	return c.Group(ctx, RecvFrom(peer, s))
}

// Send is the Buffer form of the generic Send.
func (c *Comm) Send(ctx context.Context, b Buffer, peer int) error {
	return c.Group(ctx, SendBuffer(peer, b))
}

// Recv is the Buffer form of the generic Recv.
func (c *Comm) Recv(ctx context.Context, b Buffer, peer int) error {
	return c.Group(ctx, RecvBuffer(peer, b))
}

// p2pProgress is the state of one op of a running group.
type p2pProgress struct {
	src   []byte // what a send reads: its buffer, or a staged copy of it
	done  int    // bytes moved
	prev  int    // index of the previous op on the same peer and direction, or -1
	self  int    // for a send to self: index of the matching receive
	tag   transport.Tag
	ended bool
	// Direct Send/Recv of device buffers (sendrecv_device.go).
	dev     uint8 // devNone, devOffer, ...
	answer  byte  // devAnswer's
	descLen int   // devOffer's description, in Comm.dev.p2pDescs
}

// prepareGroup validates a group and numbers its messages.
func (c *Comm) prepareGroup(group []P2P) error {
	for i := range group {
		op := &group[i]
		err := op.err
		switch {
		case err != nil:
		case op.peer < 0 || op.peer >= c.size:
			err = invalid("peer %d out of range [0,%d)", op.peer, c.size)
		case !op.v.ok:
			err = invalid("buffer is nil")
		case !op.v.dt.Valid():
			err = invalid("unknown data type %v", op.v.dt)
		}
		if err != nil {
			return &OpError{Op: "Group", Rank: c.rank, Peer: op.peer, Err: err}
		}
	}
	// Pair sends to self with receives from self, in order.
	var sends, recvs []int
	for i, op := range group {
		if op.peer == c.rank {
			if op.recv {
				recvs = append(recvs, i)
			} else {
				sends = append(sends, i)
			}
		}
	}
	if len(sends) != len(recvs) {
		return &OpError{Op: "Group", Rank: c.rank, Peer: c.rank, Err: invalid("%d sends to self but %d receives from self", len(sends), len(recvs))}
	}
	for k := range sends {
		if len(group[sends[k]].v.b) != len(group[recvs[k]].v.b) {
			return &OpError{Op: "Group", Rank: c.rank, Peer: c.rank, Err: invalid("send to self of %d bytes matched with a receive of %d bytes",
				len(group[sends[k]].v.b), len(group[recvs[k]].v.b))}
		}
	}
	return nil
}

// runGroup progresses every op of a group until all are done. dev says
// the group has device buffers (prepareDeviceGroup), held that their
// streams were waited for. name and tag name the operation in errors and
// for the watchdog: "Group" and 0 for a group call, a variable-size
// collective's name and the kind and number its ops' tags carry.
func (c *Comm) runGroup(ctx context.Context, name string, tag transport.Tag, ops []P2P, dev, held bool) error {
	if cap(c.p2pState) < len(ops) {
		c.p2pState = make([]p2pProgress, len(ops))
	}
	st := c.p2pState[:len(ops)]
	left := 0
	nextSelfRecv := 0
	for i := range ops {
		op := &ops[i]
		st[i] = p2pProgress{prev: -1, self: -1}
		for j := i - 1; j >= 0; j-- {
			if ops[j].peer == op.peer && ops[j].recv == op.recv {
				st[i].prev = j
				break
			}
		}
		if op.peer == c.rank {
			if !op.recv {
				for ; ops[nextSelfRecv].peer != c.rank || !ops[nextSelfRecv].recv; nextSelfRecv++ {
				}
				st[i].self = nextSelfRecv
				nextSelfRecv++
			}
			continue
		}
		if op.tag != 0 { // preset, numbered as a collective
			st[i].tag = op.tag
			left++
			continue
		}
		// Message numbers per peer detect mismatched send/receive pairs.
		if op.recv {
			c.recvSeq[op.peer]++
			st[i].tag = transport.MakeTag(tagP2P, c.recvSeq[op.peer]).WithCheck(transport.ArgCheck(uint64(len(op.v.b)), 0))
		} else {
			c.sendSeq[op.peer]++
			st[i].tag = transport.MakeTag(tagP2P, c.sendSeq[op.peer]).WithCheck(transport.ArgCheck(uint64(len(op.v.b)), 0))
		}
		if len(op.v.b) == 0 {
			st[i].ended = true
			continue
		}
		left++
	}
	if dev {
		if err := c.prepareDeviceGroup(ops, st, held); err != nil {
			return err
		}
	}
	// A send whose buffer overlaps a receive of the same group (in-place
	// send/recv, as nccl-tests runs it) is staged first: arriving data may
	// land before every byte has left. (A device send going direct
	// overlaps none: prepareDeviceGroup staged those that did.)
	staged := 0
	for i := range ops {
		st[i].src = ops[i].v.b
		if st[i].dev == devNone && !ops[i].recv && overlapsRecv(ops, ops[i].v.b) {
			staged += len(ops[i].v.b)
		}
	}
	if staged > 0 {
		if cap(c.scratch) < staged {
			c.scratch = make([]byte, staged)
		}
		off := 0
		for i := range ops {
			if st[i].dev == devNone && !ops[i].recv && overlapsRecv(ops, ops[i].v.b) {
				st[i].src = c.scratch[off : off+len(ops[i].v.b)]
				copy(st[i].src, ops[i].v.b)
				off += len(ops[i].v.b)
			}
		}
	}
	// Self copies first: they need no peer.
	for i := range ops {
		if st[i].self >= 0 {
			copy(ops[st[i].self].v.b, st[i].src)
		}
		if ops[i].peer == c.rank {
			st[i].ended = true
		}
	}
	x := &c.exec
	x.begin(ctx, name, tag.Seq(), tag)
	slot := c.ep.SlotSize()
	x.bo.Reset()
	for left > 0 {
		seen := c.ep.Seq()
		progress := false
		for i := range ops {
			s := &st[i]
			if s.ended || (s.prev >= 0 && !st[s.prev].ended) {
				continue
			}
			op := &ops[i]
			if s.dev != devNone {
				x.tag = s.tag
				moved, err := c.stepDevice(ops, st, i, &left)
				if err != nil {
					return x.stepErr(op.peer, s.tag, err)
				}
				progress = progress || moved
				continue
			}
			n := min(slot, len(op.v.b)-s.done)
			if op.recv {
				r, err := c.receiver(op.peer)
				if err != nil {
					return x.p2pErr(op.peer, s.tag, err)
				}
				m, t, ok, err := r.TryNext()
				if err != nil {
					return x.p2pErr(op.peer, s.tag, err)
				}
				if !ok {
					continue
				}
				x.tag = s.tag
				if t.Kind() != tagP2P && op.tag == 0 {
					// A peer's device send (sendrecv_device.go) reaches host
					// receives too (a variable-size collective's receives
					// take none: x.check reports it).
					handled, err := c.p2pControl(ops, st, i, m, t, r, &left)
					if err != nil {
						return x.stepErr(op.peer, s.tag, err)
					}
					if handled {
						progress = true
						continue
					}
				}
				if err := x.check(op.peer, m, n, t, s.tag); err != nil {
					return err
				}
				copy(op.v.b[s.done:], m)
				r.Release()
			} else {
				snd, err := c.sender(op.peer)
				if err != nil {
					return x.p2pErr(op.peer, s.tag, err)
				}
				b, ok, err := snd.TryReserve(n)
				if err != nil {
					return x.p2pErr(op.peer, s.tag, err)
				}
				if !ok {
					continue
				}
				copy(b, s.src[s.done:s.done+n])
				snd.Commit(s.tag)
			}
			progress = true
			s.done += n
			if s.done == len(op.v.b) {
				s.ended = true
				left--
			}
		}
		if progress {
			x.bo.Reset()
		} else if err := x.wait(seen); err != nil {
			return x.p2pErr(-1, 0, err)
		}
	}
	return nil
}

// overlapsRecv reports whether b shares memory with a receive buffer of ops.
func overlapsRecv(ops []P2P, b []byte) bool {
	for j := range ops {
		if ops[j].recv && overlap(ops[j].v.b, b) {
			return true
		}
	}
	return false
}

func (x *executor) p2pErr(peer int, tag transport.Tag, err error) error {
	x.tag, x.seq = tag, tag.Seq()
	return x.linkErr(peer, err)
}

// stepErr is p2pErr for errors that may be a check's *OpError already.
func (x *executor) stepErr(peer int, tag transport.Tag, err error) error {
	if oe, ok := err.(*OpError); ok {
		return oe
	}
	return x.p2pErr(peer, tag, err)
}
