// Package sim checks schedules symbolically, independent of any transport: it
// runs one plan per rank against bounded FIFO connections, tracking for every
// chunk of every block which ranks' inputs it was computed from, and reports
// schedules that deadlock, leave messages behind, reduce a contribution twice,
// misplace the Final flag, read data a buffer does not hold, end with a
// result other than the collective's, or, in an all-reduce, leave ranks with
// results reduced in different orders (which floating point tells apart).
//
// The model follows the plan format of package algo exactly: each phase runs
// once per chunk index, all its steps in order, before the next phase starts
// (a local barrier, not a global one); a step needs its incoming message and
// room for its outgoing one at the same time, except SendRecv, whose two
// halves progress independently. Messages carry no tags, so a schedule whose
// sends and receives do not match in order shows up as a receive of the wrong
// data or of a message of another length.
//
// Where the block table of package algo is silent the simulator is strict:
// only the root has In in Broadcast and Scatter, and Out in Reduce and
// Gather; and the blocks of AllReduce, Reduce and Broadcast split one vector
// into parts of possibly different lengths, so there a message must be
// received into the block it was sent from.
package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/gccl/gccl/algo"
)

// Order is the order in which the simulator picks the next rank to run. With
// blocking steps the outcome does not depend on it, but checking more than one
// order guards the simulator itself.
type Order uint8

const (
	// RoundRobin visits ranks 0..n-1 in turn and runs one step of each
	// rank that can run.
	RoundRobin Order = iota
	// Random runs one step of a rank drawn from those that can run, using
	// Options.Seed.
	Random
)

// Options sets up one simulation.
type Options struct {
	QueueCap int   // messages each directed connection holds (at least 1; 0 means 1)
	Chunks   int   // chunk indices each phase runs for (at least 1; 0 means 1)
	Order    Order // how the next rank to run is picked
	Seed     uint64
}

// Plans returns the plans of ranks 0..n-1 from a generator.
func Plans(n int, gen func(rank int) *algo.Plan) []*algo.Plan {
	plans := make([]*algo.Plan, n)
	for r := range plans {
		plans[r] = gen(r)
	}
	return plans
}

// Run simulates plans, the plan of every rank in rank order, and returns an
// error describing the first thing that goes wrong, or nil if the plans
// together perform their collective.
func Run(plans []*algo.Plan, opts Options) error {
	if opts.QueueCap == 0 {
		opts.QueueCap = 1
	}
	if opts.Chunks == 0 {
		opts.Chunks = 1
	}
	if opts.QueueCap < 1 || opts.Chunks < 1 {
		return fmt.Errorf("sim: bad options %+v", opts)
	}
	if err := checkPlans(plans); err != nil {
		return err
	}
	s := newSim(plans, opts)
	if err := s.run(); err != nil {
		return err
	}
	if err := s.checkQueuesEmpty(); err != nil {
		return err
	}
	return s.checkResult()
}

// checkPlans checks that plans are valid and describe the same collective on
// the same ranks.
func checkPlans(plans []*algo.Plan) error {
	if len(plans) == 0 {
		return errors.New("sim: no plans")
	}
	first := plans[0]
	if first == nil {
		return errors.New("sim: rank 0 has no plan")
	}
	if first.Coll < algo.AllReduce || first.Coll > algo.Scatter {
		return fmt.Errorf("sim: unknown collective %v", first.Coll)
	}
	n := len(plans)
	if first.Root < 0 || first.Root >= n || (!rooted(first.Coll) && first.Root != 0) {
		return fmt.Errorf("sim: %v with root %d on %d ranks", first.Coll, first.Root, n)
	}
	for r, p := range plans {
		if p == nil {
			return fmt.Errorf("sim: rank %d has no plan", r)
		}
		if err := p.Validate(); err != nil {
			return fmt.Errorf("sim: rank %d: %w", r, err)
		}
		if p.Rank != r || p.NRanks != n {
			return fmt.Errorf("sim: plan %d is for rank %d of %d, want rank %d of %d", r, p.Rank, p.NRanks, r, n)
		}
		if p.Coll != first.Coll || p.Algo != first.Algo || p.Root != first.Root || p.NBlocks != first.NBlocks || p.Unscaled != first.Unscaled {
			return fmt.Errorf("sim: rank %d plan %s %s root=%d blocks=%d differs from rank 0's %s %s root=%d blocks=%d",
				r, p.Coll, p.Algo, p.Root, p.NBlocks, first.Coll, first.Algo, first.Root, first.NBlocks)
		}
		for ph, steps := range p.Phases {
			for i, st := range steps {
				if err := checkShape(st); err != nil {
					return fmt.Errorf("sim: rank %d phase %d step %d %q: %w", r, ph, i, st, err)
				}
			}
		}
	}
	return nil
}

func rooted(c algo.Collective) bool {
	return c == algo.Broadcast || c == algo.Reduce || c == algo.Gather || c == algo.Scatter
}

// checkShape checks that a step sets exactly the fields its primitive uses.
func checkShape(st algo.Step) error {
	var usesSrc, usesDst bool
	switch st.Prim {
	case algo.Send, algo.RecvReduceSend:
		usesSrc = true
	case algo.Recv, algo.RecvCopySend:
		usesDst = true
	case algo.CopySend, algo.RecvReduceCopy, algo.RecvReduceCopySend, algo.Copy, algo.SendRecv, algo.LocalReduce:
		usesSrc, usesDst = true, true
	default:
		return errors.New("unknown primitive")
	}
	for _, f := range []struct {
		name      string
		uses, set bool
	}{
		{"source", usesSrc, st.Src.Valid()},
		{"destination", usesDst, st.Dst.Valid()},
		{"send peer", st.Prim.Sends(), st.SendPeer != -1},
		{"receive peer", st.Prim.Recvs(), st.RecvPeer != -1},
	} {
		if f.uses && !f.set {
			return fmt.Errorf("no %s", f.name)
		}
		if !f.uses && f.set {
			return fmt.Errorf("%s set but not used", f.name)
		}
	}
	for _, ref := range []algo.Ref{st.Src, st.Dst} {
		if ref.Valid() && ref.Buf != algo.In && ref.Buf != algo.Out && ref.Buf != algo.Tmp {
			return fmt.Errorf("unknown buffer in %v", ref)
		}
	}
	return nil
}

// message is one transfer in flight. Messages carry no tag; block and chunk
// give its length (the sender's block and chunk), which the receiver must
// expect.
type message struct {
	val          *value
	block, chunk int
}

// rankState is one rank's progress and buffers.
type rankState struct {
	rank  int
	plan  *algo.Plan
	phase int // position of the next step: phase, chunk index, step
	chunk int
	step  int
	done  bool
	// sendDone and recvDone record the halves of a SendRecv already done.
	sendDone, recvDone bool

	out    [][]*value // [block][chunk]; nil until written
	tmp    []*value   // [block] for the current phase run only
	inRead [][]bool   // [block][chunk]: In already read (reducing collectives)
}

type sim struct {
	n    int
	coll algo.Collective
	// unscaled plans may read In more than once (see algo.Plan.Unscaled);
	// contributions are still counted, so a double count is still caught.
	unscaled bool
	root     int
	nblocks  int
	opts     Options
	ranks    []*rankState
	queues   []fifo // by sender*n + receiver
}

// fifo is one directed connection's messages in flight, oldest first.
type fifo struct {
	msgs []message
	head int
}

func (q *fifo) len() int { return len(q.msgs) - q.head }

func (q *fifo) push(m message) {
	if q.head > 0 && q.head*2 >= len(q.msgs) {
		// Drop what was popped, so the slice does not grow forever.
		q.msgs = q.msgs[:copy(q.msgs, q.msgs[q.head:])]
		q.head = 0
	}
	q.msgs = append(q.msgs, m)
}

func (q *fifo) pop() message {
	m := q.msgs[q.head]
	q.head++
	return m
}

func (s *sim) queue(from, to int) *fifo { return &s.queues[from*s.n+to] }

func newSim(plans []*algo.Plan, opts Options) *sim {
	p0 := plans[0]
	s := &sim{n: len(plans), coll: p0.Coll, unscaled: p0.Unscaled, root: p0.Root, nblocks: p0.NBlocks, opts: opts, queues: make([]fifo, len(plans)*len(plans))}
	for r, p := range plans {
		rs := &rankState{rank: r, plan: p, tmp: make([]*value, p.NBlocks)}
		rs.out = make([][]*value, p.NBlocks)
		rs.inRead = make([][]bool, p.NBlocks)
		for b := range rs.out {
			rs.out[b] = make([]*value, opts.Chunks)
			rs.inRead[b] = make([]bool, opts.Chunks)
		}
		s.skipEmpty(rs)
		s.ranks = append(s.ranks, rs)
	}
	return s
}

// skipEmpty moves rs past the end of phases with no steps, and marks it done
// after the last phase.
func (s *sim) skipEmpty(rs *rankState) {
	for rs.phase < len(rs.plan.Phases) && len(rs.plan.Phases[rs.phase]) == 0 {
		rs.phase++
	}
	rs.done = rs.phase == len(rs.plan.Phases)
}

// advance moves rs to its next step.
func (s *sim) advance(rs *rankState) {
	rs.sendDone, rs.recvDone = false, false
	rs.step++
	if rs.step < len(rs.plan.Phases[rs.phase]) {
		return
	}
	// A phase run on one chunk is over: Tmp is no longer valid.
	rs.step = 0
	clear(rs.tmp)
	rs.chunk++
	if rs.chunk < s.opts.Chunks {
		return
	}
	rs.chunk = 0
	rs.phase++
	s.skipEmpty(rs)
}

func (rs *rankState) current() algo.Step { return rs.plan.Phases[rs.phase][rs.step] }

func (rs *rankState) where() string {
	return fmt.Sprintf("rank %d phase %d chunk %d step %d %q", rs.rank, rs.phase, rs.chunk, rs.step, rs.current())
}

func (s *sim) run() error {
	var rng *rand.Rand
	if s.opts.Order == Random {
		rng = rand.New(rand.NewPCG(s.opts.Seed, s.opts.Seed^0x9e3779b97f4a7c15))
	}
	ready := make([]*rankState, 0, s.n)
	for progressed := true; progressed; {
		progressed = false
		if rng == nil {
			for _, rs := range s.ranks {
				if !rs.done && s.canRun(rs) {
					if err := s.exec(rs); err != nil {
						return fmt.Errorf("sim: %s: %w", rs.where(), err)
					}
					progressed = true
				}
			}
			continue
		}
		ready = ready[:0]
		for _, rs := range s.ranks {
			if !rs.done && s.canRun(rs) {
				ready = append(ready, rs)
			}
		}
		if len(ready) > 0 {
			rs := ready[rng.IntN(len(ready))]
			if err := s.exec(rs); err != nil {
				return fmt.Errorf("sim: %s: %w", rs.where(), err)
			}
			progressed = true
		}
	}
	var blocked []string
	for _, rs := range s.ranks {
		if !rs.done {
			blocked = append(blocked, fmt.Sprintf("%s waits for %s", rs.where(), s.blockedOn(rs)))
		}
	}
	if blocked != nil {
		return fmt.Errorf("sim: deadlock:\n\t%s", strings.Join(blocked, "\n\t"))
	}
	return nil
}

// canRun reports whether rs can run its next step, or part of a SendRecv.
func (s *sim) canRun(rs *rankState) bool {
	st := rs.current()
	needRecv := st.Prim.Recvs() && !rs.recvDone
	needSend := st.Prim.Sends() && !rs.sendDone
	canRecv := needRecv && s.queue(st.RecvPeer, rs.rank).len() > 0
	canSend := needSend && s.queue(rs.rank, st.SendPeer).len() < s.opts.QueueCap
	if st.Prim == algo.SendRecv {
		return canRecv || canSend
	}
	return needRecv == canRecv && needSend == canSend
}

// blockedOn describes what keeps rs from running its next step.
func (s *sim) blockedOn(rs *rankState) string {
	st := rs.current()
	var missing []string
	if st.Prim.Recvs() && !rs.recvDone && s.queue(st.RecvPeer, rs.rank).len() == 0 {
		missing = append(missing, fmt.Sprintf("a message from rank %d", st.RecvPeer))
	}
	if st.Prim.Sends() && !rs.sendDone && s.queue(rs.rank, st.SendPeer).len() >= s.opts.QueueCap {
		missing = append(missing, fmt.Sprintf("room on the full connection to rank %d", st.SendPeer))
	}
	return strings.Join(missing, " and ")
}

// exec runs rs's next step, or the halves of a SendRecv that can run.
func (s *sim) exec(rs *rankState) error {
	st := rs.current()
	if st.Prim == algo.SendRecv {
		return s.execSendRecv(rs, st)
	}
	if st.Src.Valid() && st.Dst.Valid() && !s.sameLength(st.Src.Block, st.Dst.Block) {
		return fmt.Errorf("source and destination blocks differ in length")
	}
	var in *value
	if st.Prim.Recvs() {
		var err error
		if in, err = s.recv(rs, st.RecvPeer, blockOf(st)); err != nil {
			return err
		}
	}
	if (st.SrcFirst || st.Prim == algo.LocalReduce) && st.Src.Buf == algo.In && s.coll.Reducing() && !s.unscaled {
		return fmt.Errorf("reduces In without pre-scaling it, in a plan not marked Unscaled")
	}
	var local *value
	if st.Src.Valid() {
		var err error
		if local, err = s.read(rs, st.Src); err != nil {
			return err
		}
	}
	res := local
	switch {
	case st.Prim == algo.LocalReduce:
		acc, err := s.read(rs, st.Dst)
		if err != nil {
			return err
		}
		if res, err = reduce(local, acc); err != nil {
			return err
		}
	case st.Prim.Reduces():
		a, b := in, local
		if st.SrcFirst {
			a, b = local, in
		}
		var err error
		if res, err = reduce(a, b); err != nil {
			return err
		}
	case st.Prim.Recvs():
		res = in
	}
	res, err := s.checkFinal(st, res)
	if err != nil {
		return err
	}
	if st.Dst.Valid() {
		if err := s.write(rs, st.Dst, res); err != nil {
			return err
		}
	}
	if st.Prim.Sends() {
		s.send(rs, st.SendPeer, blockOf(st), res)
	}
	s.advance(rs)
	return nil
}

// checkFinal enforces the Final rule: a step is Final exactly when it
// produces (by reducing, or by pre-scaling an In operand) the complete
// reduction of its block. It returns the step's result, marked final if so.
func (s *sim) checkFinal(st algo.Step, res *value) (*value, error) {
	produces := st.Prim.Reduces() || (s.coll.Reducing() && st.Src.Buf == algo.In)
	complete := s.coll.Reducing() && res.ranks.count() == s.n
	switch {
	case st.Final && !s.coll.Reducing():
		return nil, fmt.Errorf("final in %v, which does not reduce", s.coll)
	case st.Final && !(produces && complete):
		return nil, fmt.Errorf("final, but the step does not complete a reduction (its result is %v)", res)
	case !st.Final && produces && complete:
		return nil, fmt.Errorf("completes the reduction of %v but is not final", res)
	case st.Final:
		done := *res
		done.final = true
		return &done, nil
	}
	return res, nil
}

func (s *sim) execSendRecv(rs *rankState, st algo.Step) error {
	if st.Final {
		return errors.New("final on a sendRecv, which does not reduce")
	}
	if !rs.sendDone && s.queue(rs.rank, st.SendPeer).len() < s.opts.QueueCap {
		v, err := s.read(rs, st.Src)
		if err != nil {
			return err
		}
		s.send(rs, st.SendPeer, st.Src.Block, v)
		rs.sendDone = true
	}
	if !rs.recvDone && s.queue(st.RecvPeer, rs.rank).len() > 0 {
		v, err := s.recv(rs, st.RecvPeer, st.Dst.Block)
		if err != nil {
			return err
		}
		if err := s.write(rs, st.Dst, v); err != nil {
			return err
		}
		rs.recvDone = true
	}
	if rs.sendDone && rs.recvDone {
		s.advance(rs)
	}
	return nil
}

// blockOf returns the block whose chunk a step moves, which sets the length
// of its messages.
func blockOf(st algo.Step) int {
	if st.Src.Valid() {
		return st.Src.Block
	}
	return st.Dst.Block
}

// sameLength reports whether chunks of blocks a and b have the same length.
// AllReduce, Broadcast and Reduce split one vector into NBlocks blocks of
// possibly different lengths; in the other collectives every block is count
// elements long.
func (s *sim) sameLength(a, b int) bool {
	switch s.coll {
	case algo.AllReduce, algo.Broadcast, algo.Reduce:
		return a == b
	}
	return true
}

func (s *sim) send(rs *rankState, to, block int, v *value) {
	s.queue(rs.rank, to).push(message{val: v, block: block, chunk: rs.chunk})
}

// recv takes the next message from rank from, for a step on block.
func (s *sim) recv(rs *rankState, from, block int) (*value, error) {
	m := s.queue(from, rs.rank).pop()
	if m.chunk != rs.chunk || !s.sameLength(m.block, block) {
		return nil, fmt.Errorf("receives block %d chunk %d from rank %d, a message of another length (sent for block %d chunk %d)",
			block, rs.chunk, from, m.block, m.chunk)
	}
	return m.val, nil
}

// holds returns an error unless rank's buffer buf holds block, per the block
// model of package algo.
func (s *sim) holds(rank int, buf algo.Buf, block int) error {
	switch {
	case buf == algo.In && (s.coll == algo.AllGather || s.coll == algo.Gather) && block != rank,
		buf == algo.Out && (s.coll == algo.ReduceScatter || s.coll == algo.Scatter) && block != rank:
		return fmt.Errorf("%v[%d]: in %v, %v holds only block rank (%d)", buf, block, s.coll, buf, rank)
	case buf == algo.In && (s.coll == algo.Broadcast || s.coll == algo.Scatter) && rank != s.root,
		buf == algo.Out && (s.coll == algo.Reduce || s.coll == algo.Gather) && rank != s.root:
		return fmt.Errorf("%v[%d]: in %v, only the root (%d) has %v", buf, block, s.coll, s.root, buf)
	}
	return nil
}

func (s *sim) read(rs *rankState, ref algo.Ref) (*value, error) {
	if err := s.holds(rs.rank, ref.Buf, ref.Block); err != nil {
		return nil, fmt.Errorf("reads %w", err)
	}
	switch ref.Buf {
	case algo.In:
		if s.coll.Reducing() && !s.unscaled {
			// The executor pre-scales every read of In.
			if rs.inRead[ref.Block][rs.chunk] {
				return nil, fmt.Errorf("reads %v a second time (its contribution would be pre-scaled twice)", ref)
			}
			rs.inRead[ref.Block][rs.chunk] = true
		}
		return &value{block: ref.Block, chunk: rs.chunk, ranks: singleRank(s.n, rs.rank), order: strconv.Itoa(rs.rank)}, nil
	case algo.Out:
		if v := rs.out[ref.Block][rs.chunk]; v != nil {
			return v, nil
		}
		return nil, fmt.Errorf("reads %v, which nothing has written", ref)
	default:
		if v := rs.tmp[ref.Block]; v != nil {
			return v, nil
		}
		return nil, fmt.Errorf("reads %v, which nothing has written in this run of the phase on this chunk (tmp lives only that long)", ref)
	}
}

func (s *sim) write(rs *rankState, ref algo.Ref, v *value) error {
	if ref.Buf == algo.In {
		return fmt.Errorf("writes %v: the send buffer is read-only", ref)
	}
	if err := s.holds(rs.rank, ref.Buf, ref.Block); err != nil {
		return fmt.Errorf("writes %w", err)
	}
	if ref.Buf == algo.Out {
		rs.out[ref.Block][rs.chunk] = v
	} else {
		rs.tmp[ref.Block] = v
	}
	return nil
}

func (s *sim) checkQueuesEmpty() error {
	var lines []string
	for i := range s.queues {
		if q := &s.queues[i]; q.len() > 0 {
			lines = append(lines, fmt.Sprintf("rank %d -> rank %d: %d message(s), first %v", i/s.n, i%s.n, q.len(), q.msgs[q.head].val))
		}
	}
	if lines == nil {
		return nil
	}
	return fmt.Errorf("sim: messages never received:\n\t%s", strings.Join(lines, "\n\t"))
}

// checkResult compares every Out block the collective defines with what it
// must hold and, in an all-reduce, checks that every rank computed it with
// the same operands in the same order.
func (s *sim) checkResult() error {
	for _, rs := range s.ranks {
		for b := range s.nblocks {
			for c := range s.opts.Chunks {
				want := s.expected(rs.rank, b, c)
				if want == nil {
					continue
				}
				if got := rs.out[b][c]; !got.equal(want) {
					return fmt.Errorf("sim: rank %d out[%d] chunk %d holds %v, want %v", rs.rank, b, c, got, want)
				}
				if s.coll != algo.AllReduce {
					continue
				}
				// Floating-point reductions depend on the order of their
				// operands (and min and max on their places, with NaNs).
				if got, first := rs.out[b][c].order, s.ranks[0].out[b][c].order; got != first {
					return fmt.Errorf("sim: rank %d computes out[%d] chunk %d as %s, rank 0 as %s: the ranks' results may differ", rs.rank, b, c, got, first)
				}
			}
		}
	}
	return nil
}

// expected returns what Out block b chunk c of rank must hold at the end, or
// nil if the collective defines nothing there.
func (s *sim) expected(rank, b, c int) *value {
	from := func(r, block int) *value {
		return &value{block: block, chunk: c, ranks: singleRank(s.n, r)}
	}
	reduced := &value{block: b, chunk: c, ranks: allRanks(s.n), final: true}
	switch s.coll {
	case algo.AllReduce:
		return reduced
	case algo.ReduceScatter:
		if b == rank {
			return reduced
		}
	case algo.Reduce:
		if rank == s.root {
			return reduced
		}
	case algo.AllGather:
		return from(b, b)
	case algo.Broadcast:
		return from(s.root, b)
	case algo.AllToAll:
		return from(b, rank)
	case algo.Gather:
		if rank == s.root {
			return from(b, b)
		}
	case algo.Scatter:
		if b == rank {
			return from(s.root, b)
		}
	}
	return nil
}
