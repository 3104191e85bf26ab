package comm

import (
	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/transport"
)

// directMin is the smallest chunk that a collective moves straight
// between the caller's buffers and a transport that can
// (transport.RefSender, transport.PostReceiver: TCP; directOK says which
// collectives): below it the copy through a slot costs less than the
// bookkeeping.
const directMin = 64 << 10

// direct is the executor's state for moving one operation's chunks without
// slots: each receive from a peer that takes posts, in the order the plan
// consumes that peer's messages, and the senders that read the caller's
// memory until they flush. Its slices live in the executor and are reused.
type direct struct {
	on     bool
	recvq  [][][]byte // by peer: each message's destination, nil if not posted
	used   []int      // by peer: messages of recvq taken so far
	posted []int      // by peer: messages of recvq posted (or passed over)
	flush  []transport.RefSender

	// Counts for tests: chunks sent from the caller's memory, and received
	// chunks that landed where they belong.
	sent, landed uint64
}

// directOK reports whether plan a may move its chunks straight: where a
// message may land in its block of the caller's memory as soon as it
// arrives, before its step, and a chunk may be read from the caller's
// memory until the step that sent it flushes. The collectives that only
// move data qualify, whatever their algorithm: broadcast, all-gather,
// all-to-all (in place, its input is staged first), gather and scatter.
// Every write to an output block writes its final value (the root's or
// the owner's data), and inputs are only read. So does the ring all-reduce, in place too: each Out block
// is written by the rank's own last reduction (through a slot, at its
// step) or by the one message carrying its final value, and that value
// exists only after every rank's contribution to the block was read, this
// rank's included. The tree all-reduce is left out: it keeps partial
// reductions in Out, which no check here proves a message cannot overtake.
// The ring reduce-scatter only sends from the caller's memory (its first
// step, a block of In other than the rank's own, which is the only one it
// writes, in place).
func directOK(a *collArgs, chunkBytes int) bool {
	if chunkBytes < directMin || a.premul {
		return false
	}
	switch a.plan.Coll {
	case algo.Broadcast, algo.AllGather, algo.AllToAll, algo.Gather, algo.Scatter:
		return true
	case algo.AllReduce, algo.ReduceScatter:
		return a.plan.Algo == algo.Ring
	}
	return false
}

// planDirect lists, per peer, the destination of every message the plan
// will take from it, and posts the first ones.
func (x *executor) planDirect(a *collArgs, chunk, iters int) {
	d := &x.direct
	n := x.c.size
	if len(d.recvq) != n {
		d.recvq, d.used, d.posted = make([][][]byte, n), make([]int, n), make([]int, n)
	}
	for p := range d.recvq {
		d.recvq[p], d.used[p], d.posted[p] = d.recvq[p][:0], 0, 0
	}
	d.flush = d.flush[:0]
	d.on = true
	for _, phase := range a.plan.Phases {
		for it := 0; it < iters; it++ {
			off := it * chunk
			for i := range phase {
				s := &phase[i]
				if !s.Prim.Recvs() {
					continue
				}
				blk := s.Src.Block
				if s.Prim == algo.SendRecv || !s.Src.Valid() {
					blk = s.Dst.Block
				}
				m := a.chunkLen(blk, off, chunk)
				if m == 0 {
					continue // no message
				}
				var dst []byte
				switch s.Prim {
				case algo.Recv, algo.RecvCopySend, algo.SendRecv:
					if s.Dst.Buf != algo.Tmp && m*a.esz >= directMin {
						dst = x.ref(a, s.Dst, off, m)
					}
				}
				d.recvq[s.RecvPeer] = append(d.recvq[s.RecvPeer], dst)
			}
		}
	}
	for p := range d.recvq {
		x.postAhead(p)
	}
}

// postAhead posts peer p's messages as far as its receiver's window
// allows. Called before each message's release, it posts the message that
// will take the released slot before a pass can parse its header.
func (x *executor) postAhead(p int) {
	d := &x.direct
	q := d.recvq[p]
	if d.posted[p] == len(q) {
		return
	}
	r, err := x.c.receiver(p)
	if err != nil {
		return // the receive itself reports it
	}
	pr, ok := r.(transport.PostReceiver)
	if !ok {
		d.posted[p] = len(q)
		return
	}
	limit := min(len(q), d.used[p]+pr.PostWindow())
	for ; d.posted[p] < limit; d.posted[p]++ {
		if dst := q[d.posted[p]]; dst != nil {
			pr.Post(d.posted[p]-d.used[p], dst)
		}
	}
}

// took is called when a message from peer p was taken, before its
// release: the receiver's head is still that message, so the post reaches
// the message that will take its slot. Then the release is counted.
func (x *executor) took(p int) {
	d := &x.direct
	if p >= len(d.used) || d.used[p] >= len(d.recvq[p]) {
		return
	}
	x.postAhead(p)
	d.used[p]++
}

// sendFrom sends b to peer straight from the caller's memory where the
// transport can, and reports false where it cannot (the caller copies
// through a slot).
func (x *executor) sendFrom(peer int, b []byte) (bool, error) {
	s, err := x.c.sender(peer)
	if err != nil {
		return false, x.linkErr(peer, err)
	}
	if _, ok := s.(transport.RefSender); !ok {
		return false, nil
	}
	x.bo.Reset()
	for {
		seen := x.c.ep.Seq()
		ok, err := x.trySendFrom(s, b)
		if ok {
			return true, nil
		}
		if err == nil {
			err = x.wait(seen)
		}
		if err != nil {
			return false, x.linkErr(peer, err)
		}
	}
}

// trySendFrom queues b on s straight from the caller's memory, and reports
// false where s cannot or has no free slot now. A queued send is waited
// for at the operation's end (endDirect).
func (x *executor) trySendFrom(s transport.Sender, b []byte) (bool, error) {
	rs, ok := s.(transport.RefSender)
	if !ok {
		return false, nil
	}
	if ok, err := rs.TrySendRef(b, x.tag); !ok {
		return false, err
	}
	x.direct.sent++
	for _, f := range x.direct.flush {
		if f == rs {
			return true, nil
		}
	}
	x.direct.flush = append(x.direct.flush, rs)
	return true, nil
}

// land puts a received message m into dst, where it is unless a post did
// not take (the header came first, or the length differs).
func (x *executor) land(dst, m []byte) {
	if sameMem(dst, m) {
		x.direct.landed++
		return
	}
	copy(dst, m)
}

// endDirect waits until the transports no longer read the caller's memory.
// (After a failure the Comm aborts, which stops them before the operation
// returns.)
func (x *executor) endDirect() error {
	d := &x.direct
	d.on = false
	x.bo.Reset()
	for _, rs := range d.flush {
		for {
			seen := x.c.ep.Seq()
			ok, err := rs.Flushed()
			if ok {
				break
			}
			if err == nil {
				err = x.wait(seen)
			}
			if err != nil {
				return x.linkErr(-1, err)
			}
		}
	}
	d.flush = d.flush[:0]
	return nil
}

// directChunk reports whether step s's chunk of nb bytes moves straight
// between the caller's memory and the transports.
func (x *executor) directChunk(a *collArgs, s *algo.Step, nb int) bool {
	if nb < directMin {
		return false
	}
	mem := s.Src
	if s.Prim == algo.RecvCopySend {
		mem = s.Dst
	}
	return mem.Buf != algo.Tmp && !a.scaled(mem)
}

// directStep runs a copy-only step whose chunk goes out from the caller's
// memory: the output is written (or landed by a post) first, then sent
// from there. It reports false, having done nothing, where the sending
// transport cannot (the step then runs through slots).
func (x *executor) directStep(a *collArgs, s *algo.Step, off, n int) (bool, error) {
	switch s.Prim {
	case algo.Send:
		return x.sendFrom(s.SendPeer, x.ref(a, s.Src, off, n))
	case algo.CopySend:
		src := x.ref(a, s.Src, off, n)
		ok, err := x.sendFrom(s.SendPeer, src)
		if ok {
			if dst := x.ref(a, s.Dst, off, n); !sameMem(dst, src) {
				copy(dst, src)
			}
		}
		return ok, err
	case algo.RecvCopySend:
		if !x.canSendFrom(s.SendPeer) {
			return false, nil
		}
		m, rcv, err := x.next(s.RecvPeer, n*a.esz, x.tag)
		if err != nil {
			return true, err
		}
		dst := x.ref(a, s.Dst, off, n)
		x.land(dst, m)
		rcv.Release()
		return x.sendFrom(s.SendPeer, dst)
	case algo.RecvReduceCopySend:
		// The reduction lands in the output, which is then sent from
		// there: the slot and the copy out of it are skipped.
		if s.Dst.Buf == algo.Tmp || !x.canSendFrom(s.SendPeer) {
			return false, nil
		}
		m, rcv, err := x.next(s.RecvPeer, n*a.esz, x.tag)
		if err != nil {
			return true, err
		}
		dst := x.ref(a, s.Dst, off, n)
		a.combine(dst, m, x.ref(a, s.Src, off, n), s)
		rcv.Release()
		a.finish(dst, s.Final)
		return x.sendFrom(s.SendPeer, dst)
	}
	return false, nil
}

// canSendFrom reports whether the transport to peer sends from the
// caller's memory.
func (x *executor) canSendFrom(peer int) bool {
	s, err := x.c.sender(peer)
	if err != nil {
		return false // the step's own send reports it
	}
	_, ok := s.(transport.RefSender)
	return ok
}
