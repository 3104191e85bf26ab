package comm

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/internal/reduce"
	"github.com/gccl/gccl/internal/spin"
	"github.com/gccl/gccl/transport"
)

// collArgs is everything the executor needs for one collective. It lives in
// the Comm and is reused, so running a collective allocates nothing.
type collArgs struct {
	plan    *algo.Plan
	in, out []byte
	esz     int
	count   int  // elements per block, or in total when partitioned
	split   bool // blocks partition count elements (AllReduce, Broadcast, Reduce)
	inAll   bool // In holds every block (else only block rank)
	outAll  bool // Out holds every block (else only block rank)

	red    reduce.Func
	scale  func(dst, src []byte, s float64)
	axpy   func(dst, a, b []byte, s float64)
	div    func(dst, src []byte, n int)
	premul bool // multiply each rank's In by s before reducing
	s      float64
	post   bool // divide the final reduction by n (integer Avg)
}

// executor runs plans for one Comm. Its fields are per-operation state.
type executor struct {
	c        *Comm
	ctx      context.Context
	slept    bool      // the operation has slept: its deadline and watchdog are set
	deadline time.Time // zero until the operation first sleeps, or without a timeout
	watchAt  time.Time // when the watchdog reports laggards; zero if off or done
	tag      transport.Tag
	seq      uint64 // the operation's number (the tag keeps it modulo 2^40)
	op       string
	bo       spin.Backoff
	direct   direct // moving chunks without slots (directexec.go)
}

// begin prepares the executor for an operation.
func (x *executor) begin(ctx context.Context, op string, seq uint64, tag transport.Tag) {
	x.ctx, x.op, x.seq, x.tag, x.slept, x.deadline, x.watchAt = ctx, op, seq, tag, false, time.Time{}, time.Time{}
}

// wait spins, yields and finally sleeps until the endpoint's state changes
// from seen. The operation's timeout starts at its first sleep, so the fast
// path never reads the clock.
func (x *executor) wait(seen uint64) error {
	if x.bo.Spin() {
		return nil
	}
	ep := x.c.ep
	if !x.slept {
		x.slept = true
		now := time.Now()
		if x.c.timeout > 0 {
			x.deadline = now.Add(x.c.timeout)
		}
		if x.c.watchdog > 0 && x.tag.Kind() != tagP2P {
			x.watchAt = now.Add(x.c.watchdog)
		}
	}
	until := x.deadline
	if !x.watchAt.IsZero() && (until.IsZero() || x.watchAt.Before(until)) {
		until = x.watchAt
	}
	if err := ep.Wait(x.ctx, seen, until); err != nil {
		switch {
		case errors.Is(err, transport.ErrTimeout) && until.Equal(x.watchAt):
			// Not the operation's deadline: the watchdog's turn.
			x.c.reportLaggards(x.op, x.seq, x.c.watchdog)
			x.watchAt = time.Time{}
			return nil
		case errors.Is(err, transport.ErrTimeout):
			return fmt.Errorf("%w after waiting %v for peers", ErrTimeout, x.c.timeout)
		case errors.Is(err, transport.ErrClosed):
			return x.c.closedErr()
		}
		return err
	}
	return nil
}

func (x *executor) linkErr(peer int, err error) error {
	if errors.Is(err, transport.ErrPeerClosed) {
		return &OpError{Op: x.op, Rank: x.c.rank, Seq: x.seq, Peer: peer, Err: fmt.Errorf("%w: %w", ErrPeerLost, err)}
	}
	if errors.Is(err, transport.ErrClosed) {
		err = x.c.closedErr()
	}
	return &OpError{Op: x.op, Rank: x.c.rank, Seq: x.seq, Peer: peer, Err: err}
}

// reserve returns an outgoing slot of n bytes to peer.
func (x *executor) reserve(peer, n int) ([]byte, transport.Sender, error) {
	s, err := x.c.sender(peer)
	if err != nil {
		return nil, nil, x.linkErr(peer, err)
	}
	x.bo.Reset()
	for {
		seen := x.c.ep.Seq()
		b, ok, err := s.TryReserve(n)
		if ok {
			return b, s, nil
		}
		if err == nil {
			err = x.wait(seen)
		}
		if err != nil {
			return nil, nil, x.linkErr(peer, err)
		}
	}
}

// next returns the next incoming message from peer, checking that it belongs
// to this operation and is n bytes long.
func (x *executor) next(peer, n int, tag transport.Tag) ([]byte, transport.Receiver, error) {
	r, err := x.c.receiver(peer)
	if err != nil {
		return nil, nil, x.linkErr(peer, err)
	}
	x.bo.Reset()
	for {
		seen := x.c.ep.Seq()
		m, t, ok, err := r.TryNext()
		if ok {
			if err := x.check(peer, m, n, t, tag); err != nil {
				return nil, nil, err
			}
			if x.direct.on {
				x.took(peer)
			}
			return m, r, nil
		}
		if err == nil {
			err = x.wait(seen)
		}
		if err != nil {
			return nil, nil, x.linkErr(peer, err)
		}
	}
}

func (x *executor) check(peer int, m []byte, n int, got, want transport.Tag) error {
	if got != want && got.WithCheck(0) == want.WithCheck(0) {
		what := "count, data type, op or root"
		switch want.Kind() {
		case tagP2P:
			what = "length: a send's length must equal its receive's"
		case tagAllToAllV, tagAllGatherV:
			what = "count or data type: the count a rank sends a peer must equal the count that peer expects from it"
		}
		return &OpError{Op: x.op, Rank: x.c.rank, Seq: want.Seq(), Peer: peer, Err: fmt.Errorf(
			"%w: peer runs %s #%d with other arguments than this rank (%s)",
			ErrMismatch, tagKindName(got.Kind()), got.Seq(), what)}
	}
	if got != want {
		return &OpError{Op: x.op, Rank: x.c.rank, Seq: want.Seq(), Peer: peer, Err: fmt.Errorf(
			"%w: peer sent data of %s #%d while this rank runs %s #%d (operations must be issued in the same order on every rank)",
			ErrMismatch, tagKindName(got.Kind()), got.Seq(), tagKindName(want.Kind()), want.Seq())}
	}
	if len(m) != n {
		return &OpError{Op: x.op, Rank: x.c.rank, Seq: want.Seq(), Peer: peer, Err: fmt.Errorf(
			"%w: peer sent a %d-byte piece where %d bytes were expected (counts differ between ranks)", ErrMismatch, len(m), n)}
	}
	return nil
}

// blockSpan returns the first element and length of block b.
func (a *collArgs) blockSpan(b int) (start, n int) {
	if !a.split {
		return b * a.count, a.count
	}
	nb := a.plan.NBlocks
	start = int(int64(a.count) * int64(b) / int64(nb))
	end := int(int64(a.count) * int64(b+1) / int64(nb))
	return start, end - start
}

// ref returns the bytes of chunk [off, off+n) (elements) of the block r names.
func (x *executor) ref(a *collArgs, r algo.Ref, off, n int) []byte {
	var buf []byte
	var base int
	switch r.Buf {
	case algo.In:
		buf = a.in
		if a.inAll {
			base, _ = a.blockSpan(r.Block)
		}
	case algo.Out:
		buf = a.out
		if a.outAll {
			base, _ = a.blockSpan(r.Block)
		}
	case algo.Tmp:
		// Tmp holds one chunk per block, valid within one step sequence.
		buf, base, off = x.c.tmp, r.Block*x.c.chunkElems(a.esz), 0
	}
	lo := (base + off) * a.esz
	return buf[lo : lo+n*a.esz : lo+n*a.esz]
}

// runPlan executes a plan chunk by chunk, phase by phase.
func (x *executor) runPlan(a *collArgs) error {
	p := a.plan
	chunk := x.c.chunkElems(a.esz)
	longest := 0
	for b := 0; b < p.NBlocks; b++ {
		if _, n := a.blockSpan(b); n > longest {
			longest = n
		}
	}
	iters := (longest + chunk - 1) / chunk
	if directOK(a, min(chunk, longest)*a.esz) {
		x.planDirect(a, chunk, iters)
	}
	for _, phase := range p.Phases {
		for it := 0; it < iters; it++ {
			off := it * chunk
			for i := range phase {
				if err := x.step(a, &phase[i], off, chunk); err != nil {
					x.direct.on = false
					return err
				}
			}
		}
	}
	if x.direct.on {
		return x.endDirect()
	}
	return nil
}

// chunkLen is the length of the chunk at element off of block b.
func (a *collArgs) chunkLen(b, off, chunk int) int {
	_, n := a.blockSpan(b)
	n -= off
	if n > chunk {
		n = chunk
	}
	if n < 0 {
		n = 0
	}
	return n
}

// scaled reports whether a local operand is a rank's own input in a reducing
// collective, which is where PreMulSum's scaling applies.
func (a *collArgs) scaled(r algo.Ref) bool { return a.premul && r.Buf == algo.In }

// load copies src into dst, scaling it if it is a rank's input.
func (a *collArgs) load(dst, src []byte, r algo.Ref) {
	if a.scaled(r) {
		a.scale(dst, src, a.s)
	} else if !sameMem(dst, src) {
		copy(dst, src)
	}
}

// combine writes msg op local into dst for step s, or local op msg when s
// puts its Src first (never pre-scaled: see algo.Prim).
func (a *collArgs) combine(dst, msg, local []byte, s *algo.Step) {
	switch {
	case s.SrcFirst:
		a.red(dst, local, msg)
	case a.scaled(s.Src):
		a.axpy(dst, msg, local, a.s)
	default:
		a.red(dst, msg, local)
	}
}

func (a *collArgs) finish(dst []byte, final bool) {
	if final && a.post {
		a.div(dst, dst, a.plan.NRanks)
	}
}

func (x *executor) step(a *collArgs, s *algo.Step, off, chunk int) error {
	block := s.Src.Block
	if !s.Src.Valid() {
		block = s.Dst.Block
	}
	n := a.chunkLen(block, off, chunk)
	if n == 0 && s.Prim != algo.SendRecv {
		return nil
	}
	nb := n * a.esz
	if x.direct.on && x.directChunk(a, s, nb) {
		if done, err := x.directStep(a, s, off, n); done || err != nil {
			return err
		}
	}
	switch s.Prim {
	case algo.Send:
		slot, snd, err := x.reserve(s.SendPeer, nb)
		if err != nil {
			return err
		}
		a.load(slot, x.ref(a, s.Src, off, n), s.Src)
		snd.Commit(x.tag)

	case algo.Recv:
		m, rcv, err := x.next(s.RecvPeer, nb, x.tag)
		if err != nil {
			return err
		}
		x.land(x.ref(a, s.Dst, off, n), m)
		rcv.Release()

	case algo.CopySend:
		slot, snd, err := x.reserve(s.SendPeer, nb)
		if err != nil {
			return err
		}
		src := x.ref(a, s.Src, off, n)
		a.load(slot, src, s.Src)
		snd.Commit(x.tag)
		if dst := x.ref(a, s.Dst, off, n); !sameMem(dst, src) {
			copy(dst, slot)
		}

	case algo.RecvCopySend:
		m, rcv, err := x.next(s.RecvPeer, nb, x.tag)
		if err != nil {
			return err
		}
		slot, snd, err := x.reserve(s.SendPeer, nb)
		if err != nil {
			return err
		}
		copy(slot, m)
		snd.Commit(x.tag)
		copy(x.ref(a, s.Dst, off, n), m)
		rcv.Release()

	case algo.RecvReduceSend:
		m, rcv, err := x.next(s.RecvPeer, nb, x.tag)
		if err != nil {
			return err
		}
		slot, snd, err := x.reserve(s.SendPeer, nb)
		if err != nil {
			return err
		}
		a.combine(slot, m, x.ref(a, s.Src, off, n), s)
		a.finish(slot, s.Final)
		snd.Commit(x.tag)
		rcv.Release()

	case algo.RecvReduceCopy:
		m, rcv, err := x.next(s.RecvPeer, nb, x.tag)
		if err != nil {
			return err
		}
		dst := x.ref(a, s.Dst, off, n)
		a.combine(dst, m, x.ref(a, s.Src, off, n), s)
		rcv.Release()
		a.finish(dst, s.Final)

	case algo.RecvReduceCopySend:
		m, rcv, err := x.next(s.RecvPeer, nb, x.tag)
		if err != nil {
			return err
		}
		slot, snd, err := x.reserve(s.SendPeer, nb)
		if err != nil {
			return err
		}
		// Reduce into the slot (hot in cache), publish it, then copy it out.
		a.combine(slot, m, x.ref(a, s.Src, off, n), s)
		rcv.Release()
		a.finish(slot, s.Final)
		snd.Commit(x.tag)
		copy(x.ref(a, s.Dst, off, n), slot)

	case algo.Copy:
		dst := x.ref(a, s.Dst, off, n)
		a.load(dst, x.ref(a, s.Src, off, n), s.Src)
		a.finish(dst, s.Final)

	case algo.SendRecv:
		return x.sendRecv(a, s, off, chunk)

	case algo.LocalReduce:
		// Never pre-scaled (see algo.Prim).
		dst := x.ref(a, s.Dst, off, n)
		a.red(dst, x.ref(a, s.Src, off, n), dst)
		a.finish(dst, s.Final)

	default:
		return fmt.Errorf("gccl: internal error: plan step %v", s)
	}
	return nil
}

// sendRecv progresses a send and a receive together, so that any exchange
// pattern completes whatever order peers run in.
func (x *executor) sendRecv(a *collArgs, s *algo.Step, off, chunk int) error {
	ns := a.chunkLen(s.Src.Block, off, chunk)
	nr := a.chunkLen(s.Dst.Block, off, chunk)
	sent, recvd := ns == 0, nr == 0
	snd, err := x.c.sender(s.SendPeer)
	if err != nil {
		return x.linkErr(s.SendPeer, err)
	}
	rcv, err := x.c.receiver(s.RecvPeer)
	if err != nil {
		return x.linkErr(s.RecvPeer, err)
	}
	x.bo.Reset()
	for !sent || !recvd {
		seen := x.c.ep.Seq()
		progress := false
		if !sent && x.direct.on && x.directChunk(a, s, ns*a.esz) {
			// Not sent: not a RefSender, or every slot is taken (then the
			// reserve below fails too).
			ok, err := x.trySendFrom(snd, x.ref(a, s.Src, off, ns))
			if err != nil {
				return x.linkErr(s.SendPeer, err)
			}
			sent, progress = ok, ok
		}
		if !sent {
			slot, ok, err := snd.TryReserve(ns * a.esz)
			if err != nil {
				return x.linkErr(s.SendPeer, err)
			}
			if ok {
				copy(slot, x.ref(a, s.Src, off, ns))
				snd.Commit(x.tag)
				sent, progress = true, true
			}
		}
		if !recvd {
			m, t, ok, err := rcv.TryNext()
			if err != nil {
				return x.linkErr(s.RecvPeer, err)
			}
			if ok {
				if err := x.check(s.RecvPeer, m, nr*a.esz, t, x.tag); err != nil {
					return err
				}
				if x.direct.on {
					x.took(s.RecvPeer)
				}
				x.land(x.ref(a, s.Dst, off, nr), m)
				rcv.Release()
				recvd, progress = true, true
			}
		}
		if progress {
			x.bo.Reset()
		} else if err := x.wait(seen); err != nil {
			return x.linkErr(-1, err)
		}
	}
	return nil
}

// sameMem reports whether two slices start at the same address.
func sameMem(a, b []byte) bool {
	return len(a) > 0 && len(b) > 0 && &a[0] == &b[0]
}
