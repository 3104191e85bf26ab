package main

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/gccl/gccl/comm"
)

// measurement identifies one rank's timed loop, for time sources that model
// the time rather than read a clock.
type measurement struct {
	rank    int
	bytes   int64 // the size column
	inPlace bool
	ops     int // collectives in the loop
}

// timeSource runs loop, one rank's timed iterations, and says how long it
// took. Tests substitute a deterministic model to get reproducible tables.
type timeSource func(m measurement, loop func() error) (time.Duration, error)

// wallClock times with the monotonic clock.
func wallClock(_ measurement, loop func() error) (time.Duration, error) {
	start := time.Now()
	err := loop()
	return time.Since(start), err
}

// runner drives the ranks through a benchmark. Each phase (warm-up, timed
// loop, check pass) runs one goroutine per rank and returns when every rank
// is done, so the main goroutine can combine the ranks' results and print.
type runner struct {
	ctx   context.Context
	cfg   *config
	env   *environment
	comms []*comm.Comm
	// One send and one receive buffer per rank, maxBytes each (every layout
	// fits: rounding only shrinks), reused for every size like nccl-tests.
	send, recv [][]byte
}

// point is one benchmarked case: a type, op and root at one size.
type point struct {
	dt   dataType
	op   redOp
	root int
	lay  layout
	spec checkSpec
}

func (rn *runner) newPoint(dt dataType, op redOp, root int, size int64) *point {
	n := rn.cfg.ranks
	count := int(size / int64(dt.dt.Size()))
	return &point{dt: dt, op: op, root: root, lay: rn.cfg.test.layoutFor(count, n), spec: newCheckSpec(dt.dt, op.kind, n)}
}

// benchmark runs every type, op and root the flags ask for, over every size,
// and hands each finished row to emit.
func (rn *runner) benchmark(emit func(*row)) error {
	n := rn.cfg.ranks
	rn.send, rn.recv = make([][]byte, n), make([][]byte, n)
	for r := range n {
		rn.send[r] = make([]byte, rn.cfg.maxBytes)
		rn.recv[r] = make([]byte, rn.cfg.maxBytes)
	}
	c := rn.cfg
	for _, dt := range c.dataTypes {
		// Realistic values of the type in the whole buffers (this also maps
		// their pages before anything is timed); timed loops then work on
		// whatever earlier operations left there. Check passes write their
		// own inputs.
		spec := newCheckSpec(dt.dt, opNone, c.ranks)
		if err := rn.parallel(func(rank int) error {
			spec.fillInput(rank, rn.send[rank])
			spec.fillInput(rank, rn.recv[rank])
			return nil
		}); err != nil {
			return err
		}
		for _, op := range c.ops {
			for _, root := range c.roots {
				if err := rn.benchCase(dt, op, root, emit); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// benchCase is nccl-tests' TimeTest: warm up at the largest and the smallest
// size, then measure each size out of place and in place.
func (rn *runner) benchCase(dt dataType, op redOp, root int, emit func(*row)) error {
	c := rn.cfg
	for _, size := range []int64{c.maxBytes, c.minBytes} {
		if err := rn.warmUp(rn.newPoint(dt, op, root, size)); err != nil {
			return err
		}
	}
	for _, size := range sizes(c.minBytes, c.maxBytes, c.stepBytes, c.stepFactor) {
		p := rn.newPoint(dt, op, root, size)
		r := &row{
			Bytes: p.lay.sizeBytes(dt.dt.Size()), Count: int64(p.lay.paramCount),
			Type: dt.name, RedOp: op.name, Root: root,
		}
		var err error
		if r.OutOfPlace, err = rn.measure(p, false); err != nil {
			return err
		}
		if r.InPlace, err = rn.measure(p, true); err != nil {
			return err
		}
		emit(r)
	}
	return nil
}

// views returns rank's send and receive memory for the iter-th operation.
// Like nccl-tests, successive operations move through the buffers (by the
// size of one operation's footprint, wrapping at maxBytes), so that a small
// size is not timed on memory left hot in cache by the previous operation.
func (rn *runner) views(rank int, p *point, inPlace bool, iter int) (send, recv []byte) {
	ts := int64(p.dt.dt.Size())
	footprint := p.lay.sizeBytes(int(ts))
	shift := int64(0)
	if footprint > 0 {
		shift = footprint * (int64(iter) % (rn.cfg.maxBytes / footprint))
	}
	sendBytes, recvBytes := int64(p.lay.sendCount)*ts, int64(p.lay.recvCount)*ts
	if !inPlace {
		return rn.send[rank][shift : shift+sendBytes], rn.recv[rank][shift : shift+recvBytes]
	}
	base := rn.recv[rank][shift:]
	so := int64(p.lay.sendInPlaceOffset*rank) * ts
	ro := int64(p.lay.recvInPlaceOffset*rank) * ts
	return base[so : so+sendBytes], base[ro : ro+recvBytes]
}

// opArgsFor wraps memory as Buffers once, ahead of any timed loop.
func (rn *runner) opArgsFor(rank int, p *point, send, recv []byte) *opArgs {
	n := rn.cfg.ranks
	return &opArgs{
		send: comm.HostBytesOf(p.dt.dt, send), recv: comm.HostBytesOf(p.dt.dt, recv),
		op: p.op.commOp(rank), root: p.root,
		next: (rank + 1) % n, prev: (rank - 1 + n) % n,
	}
}

// opSequence prepares count operations of rank, each on its own views.
func (rn *runner) opSequence(rank int, p *point, inPlace bool, count int) []*opArgs {
	ops := make([]*opArgs, count)
	for i := range ops {
		send, recv := rn.views(rank, p, inPlace, i)
		ops[i] = rn.opArgsFor(rank, p, send, recv)
	}
	return ops
}

// issue runs ops in order on rank: with -z 1 each call blocks; otherwise all
// are issued as async requests and then waited for, the way nccl-tests
// launches a whole loop onto a stream before synchronizing. reqs is scratch
// space of len(ops), so that the timed loop allocates nothing.
func (rn *runner) issue(rank int, ops []*opArgs, reqs []*comm.Request) error {
	c, t := rn.comms[rank], rn.cfg.test
	if rn.cfg.blocking {
		for _, a := range ops {
			if err := t.run(rn.ctx, c, a); err != nil {
				return err
			}
		}
		return nil
	}
	for i, a := range ops {
		reqs[i] = t.start(c, a)
	}
	for _, q := range reqs[:len(ops)] {
		if err := q.Wait(rn.ctx); err != nil {
			return err
		}
	}
	return nil
}

func (rn *runner) warmUp(p *point) error {
	w := rn.cfg.warmup
	if w == 0 {
		return nil
	}
	return rn.parallel(func(rank int) error {
		return rn.issue(rank, rn.opSequence(rank, p, false, w), make([]*comm.Request, w))
	})
}

// measure times p in one placement, then checks its results (nccl-tests'
// BenchTime): the check runs separately so that it costs the timing nothing.
func (rn *runner) measure(p *point, inPlace bool) (placementResult, error) {
	c := rn.cfg
	total := c.iters * c.aggIters
	times := make([]time.Duration, c.ranks)
	err := rn.parallel(func(rank int) error {
		ops := rn.opSequence(rank, p, inPlace, total)
		reqs := make([]*comm.Request, total)
		// One untimed operation, then line the ranks up, so that the timed
		// loop starts together and pays no first-use costs.
		if err := rn.issue(rank, ops[:1], reqs); err != nil {
			return err
		}
		if err := rn.comms[rank].Barrier(rn.ctx); err != nil {
			return err
		}
		m := measurement{rank: rank, bytes: p.lay.sizeBytes(p.dt.dt.Size()), inPlace: inPlace, ops: total}
		d, err := rn.env.timer(m, func() error { return rn.issue(rank, ops, reqs) })
		times[rank] = d
		return err
	})
	if err != nil {
		return placementResult{}, err
	}
	sec := combineTimes(times, c.average).Seconds() / float64(total)
	res := placementResult{TimeUs: sec * 1e6, Checked: c.check > 0}
	if sec > 0 {
		res.AlgBW = float64(c.test.algBytes(p.lay, p.dt.dt.Size(), c.ranks)) / 1e9 / sec
		res.BusBW = res.AlgBW * busBW(c.test.name, c.ranks)
	}
	// Like nccl-tests, -c N runs up to N check passes and stops at the first
	// that finds wrong elements.
	for range c.check {
		if res.Wrong, err = rn.checkPass(p, inPlace); err != nil || res.Wrong > 0 {
			break
		}
	}
	return res, err
}

// checkPass runs p once on fresh inputs and poisoned outputs and returns the
// wrong elements summed over ranks.
func (rn *runner) checkPass(p *point, inPlace bool) (int64, error) {
	wrong := make([]int64, rn.cfg.ranks)
	err := rn.parallel(func(rank int) error {
		send, recv := rn.views(rank, p, inPlace, 0)
		if inPlace {
			poison(rn.recv[rank][:p.lay.sizeBytes(p.dt.dt.Size())])
		} else {
			poison(recv)
		}
		p.spec.fillInput(rank, send) // after the poison: in place, send lies inside it
		if err := rn.issue(rank, []*opArgs{rn.opArgsFor(rank, p, send, recv)}, make([]*comm.Request, 1)); err != nil {
			return err
		}
		if rn.env.afterCheckOp != nil {
			rn.env.afterCheckOp(rank, inPlace, recv)
		}
		wrong[rank] = p.spec.countWrong(rn.cfg.test, rank, p.root, p.lay.paramCount, recv)
		return nil
	})
	var sum int64
	for _, w := range wrong {
		sum += w
	}
	return sum, err
}

// combineTimes reduces the ranks' times as -a asks.
func combineTimes(times []time.Duration, mode averageMode) time.Duration {
	switch mode {
	case averageRank0:
		return times[0]
	case averageMin:
		return slices.Min(times)
	case averageMax:
		return slices.Max(times)
	}
	var sum time.Duration
	for _, t := range times {
		sum += t
	}
	return sum / time.Duration(len(times))
}

// parallel runs f for every rank at once and waits for all. A rank that
// fails aborts every Comm, so that its peers return errors instead of
// waiting for it until the timeout.
func (rn *runner) parallel(f func(rank int) error) error {
	errs := make([]error, len(rn.comms))
	var wg sync.WaitGroup
	for r := range rn.comms {
		wg.Go(func() {
			if err := f(r); err != nil {
				errs[r] = err
				for _, c := range rn.comms {
					c.Abort(err)
				}
			}
		})
	}
	wg.Wait()
	return rootCause(errs)
}

// rootCause picks the error that started a failure over the errors of the
// ranks it took down with it.
func rootCause(errs []error) error {
	var first error
	for _, err := range errs {
		if err == nil {
			continue
		}
		if !errors.Is(err, comm.ErrAborted) && !errors.Is(err, comm.ErrPeerLost) {
			return err
		}
		if first == nil {
			first = err
		}
	}
	return first
}
