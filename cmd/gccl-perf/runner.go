package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/gpu"
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

// rankState is one of this process's ranks: its communicator, its rank in
// the whole job, and its buffers.
type rankState struct {
	comm  *comm.Comm
	rank  int
	local int // index among this process's ranks
	// One send and one receive buffer, maxBytes each (every layout fits:
	// rounding only shrinks), reused for every size like nccl-tests. Under
	// -M device they are the host mirrors of gpu's buffers.
	send, recv []byte
	// registered holds send's and recv's allocations under -R.
	registered []*comm.SymBuffer
	// gpu is the rank's device memory under -M device, else nil.
	gpu *rankGPU
}

// region is a byte range of one of a rank's two buffers.
type region struct {
	inRecv bool // the receive buffer, else the send buffer
	off, n int64
}

// hostBytes is r in rs's host memory: the buffer itself, or under -M
// device its mirror.
func (rs *rankState) hostBytes(r region) []byte {
	b := rs.send
	if r.inRecv {
		b = rs.recv
	}
	return b[r.off : r.off+r.n]
}

// buffer returns r as elements of dt for the collectives, in the memory
// the benchmark measures.
func (rs *rankState) buffer(dt comm.DataType, r region) (comm.Buffer, error) {
	if rs.gpu != nil {
		return rs.gpu.view(dt, r)
	}
	return comm.HostBytesOf(dt, rs.hostBytes(r)), nil
}

// upload makes the memory the collectives use hold what the host buffers
// hold: a copy to the device under -M device, nothing otherwise.
func (rs *rankState) upload() error {
	if rs.gpu == nil {
		return nil
	}
	return rs.gpu.upload(rs.send, rs.recv)
}

// download brings the collectives' results into the host receive buffer:
// a copy from the device under -M device, nothing otherwise.
func (rs *rankState) download() error {
	if rs.gpu == nil {
		return nil
	}
	return rs.gpu.download(rs.recv)
}

// allocRegistered makes send and recv buffers from the rank's Alloc.
func (rs *rankState) allocRegistered(ctx context.Context, size int64) error {
	for _, dst := range []*[]byte{&rs.send, &rs.recv} {
		b, err := rs.comm.Alloc(ctx, comm.Uint8, int(max(size, 1)))
		if err != nil {
			return err
		}
		rs.registered = append(rs.registered, b)
		*dst = b.HostBytes()[:size]
	}
	return nil
}

// runner drives this process's ranks through a benchmark. Each phase
// (warm-up, timed loop, check pass) runs one goroutine per local rank and
// returns when every one is done; per-rank results (times, wrong counts)
// are then combined over the whole job, across processes through the
// communicator itself, so the main goroutine can print.
type runner struct {
	ctx   context.Context
	cfg   *config
	env   *environment
	ranks []*rankState  // this process's ranks
	gpus  []*gpu.Device // the ranks' devices under -M device, else nil
	n     int           // ranks in the whole job
	// world is this process's rank when the job spans several processes,
	// and combines results across them; nil when every rank is local.
	world *comm.Comm
}

// newRunner prepares a benchmark on comms, this process's ranks, whose
// devices under -M device are gpus. When the job has ranks in other
// processes, comms must be this process's only rank.
func newRunner(ctx context.Context, cfg *config, env *environment, comms []*comm.Comm, gpus []*gpu.Device) *runner {
	rn := &runner{ctx: ctx, cfg: cfg, env: env, gpus: gpus, n: comms[0].Size()}
	for i, c := range comms {
		rn.ranks = append(rn.ranks, &rankState{comm: c, rank: c.Rank(), local: i})
	}
	if len(comms) < rn.n {
		rn.world = comms[0]
	}
	return rn
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
	n := rn.n
	count := int(size / int64(dt.dt.Size()))
	return &point{dt: dt, op: op, root: root, lay: rn.cfg.test.layoutFor(count, n), spec: newCheckSpec(dt.dt, op.kind, n)}
}

// benchmark runs every type, op and root the flags ask for, over every size,
// and hands each finished row to emit.
func (rn *runner) benchmark(emit func(*row)) error {
	if rn.cfg.register {
		// Alloc is collective: every local rank allocates at once.
		if err := rn.parallel(func(rs *rankState) error { return rs.allocRegistered(rn.ctx, rn.cfg.maxBytes) }); err != nil {
			return fmt.Errorf("-R: %w", err)
		}
		defer func() {
			for _, rs := range rn.ranks {
				for _, b := range rs.registered {
					b.Free()
				}
			}
		}()
	} else {
		// Under -M device these are the device buffers' host mirrors, of
		// their size: at least a byte, the least gpu allocates.
		size := rn.cfg.maxBytes
		if rn.gpus != nil {
			size = max(size, 1)
		}
		for _, rs := range rn.ranks {
			rs.send = make([]byte, size)
			rs.recv = make([]byte, size)
		}
	}
	if rn.gpus != nil {
		// Allocated once, like the host buffers: the timed loops only
		// take views of them.
		defer func() {
			for _, rs := range rn.ranks {
				if rs.gpu != nil {
					rs.gpu.free()
				}
			}
		}()
		for _, rs := range rn.ranks {
			var err error
			if rs.gpu, err = newRankGPU(rn.gpus[rs.local], len(rs.send)); err != nil {
				return err
			}
		}
		if rn.cfg.deviceWindows {
			// RegisterDevice is collective: every local rank at once.
			if err := rn.parallel(func(rs *rankState) error {
				return rs.gpu.register(rn.ctx, rs.comm, rn.gpus[rs.local])
			}); err != nil {
				return err
			}
		}
	}
	c := rn.cfg
	for _, dt := range c.dataTypes {
		// Realistic values of the type in the whole buffers (this also maps
		// their pages before anything is timed); timed loops then work on
		// whatever earlier operations left there. Check passes write their
		// own inputs.
		spec := newCheckSpec(dt.dt, opNone, rn.n)
		if err := rn.parallel(func(rs *rankState) error {
			spec.fillInput(rs.rank, rs.send)
			spec.fillInput(rs.rank, rs.recv)
			return rs.upload()
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

// views returns rs's send and receive memory for the iter-th operation.
// Like nccl-tests, successive operations move through the buffers (by the
// size of one operation's footprint, wrapping at maxBytes), so that a small
// size is not timed on memory left hot in cache by the previous operation.
// In place, both lie in the receive buffer.
func (rn *runner) views(rs *rankState, p *point, inPlace bool, iter int) (send, recv region) {
	ts := int64(p.dt.dt.Size())
	footprint := p.lay.sizeBytes(int(ts))
	shift := int64(0)
	if footprint > 0 {
		shift = footprint * (int64(iter) % (rn.cfg.maxBytes / footprint))
	}
	sendBytes, recvBytes := int64(p.lay.sendCount)*ts, int64(p.lay.recvCount)*ts
	if !inPlace {
		return region{off: shift, n: sendBytes}, region{inRecv: true, off: shift, n: recvBytes}
	}
	so := shift + int64(p.lay.sendInPlaceOffset*rs.rank)*ts
	ro := shift + int64(p.lay.recvInPlaceOffset*rs.rank)*ts
	return region{inRecv: true, off: so, n: sendBytes}, region{inRecv: true, off: ro, n: recvBytes}
}

// opArgsFor wraps memory as Buffers once, ahead of any timed loop. Equal
// regions become one Buffer, so that an in-place call passes the same
// buffer twice, as a caller of gccl would.
func (rn *runner) opArgsFor(rs *rankState, p *point, send, recv region) (*opArgs, error) {
	n, rank := rn.n, rs.rank
	a := &opArgs{op: p.op.commOp(rank), root: p.root, next: (rank + 1) % n, prev: (rank - 1 + n) % n}
	var err error
	if a.send, err = rs.buffer(p.dt.dt, send); err != nil {
		return nil, err
	}
	if recv == send {
		a.recv = a.send
	} else if a.recv, err = rs.buffer(p.dt.dt, recv); err != nil {
		return nil, err
	}
	return a, nil
}

// opSequence is count operations of one rank, each on its own views. The
// views repeat once they have gone round the buffers, and so do the
// operations: it holds one per distinct view (a cycle), not one per
// operation, so that the garbage collector, which marks what is live while
// a timed loop runs, has little to mark (a million-call loop of 8 B calls
// under -z 0 would otherwise have it scan a million pointers per cycle).
type opSequence struct {
	cycle []*opArgs
	count int
}

// once is a sequence of one operation.
func once(a *opArgs) opSequence { return opSequence{cycle: []*opArgs{a}, count: 1} }

// sequence prepares count operations of rs (see opSequence).
func (rn *runner) sequence(rs *rankState, p *point, inPlace bool, count int) (opSequence, error) {
	cycle := count
	if fp := p.lay.sizeBytes(int(p.dt.dt.Size())); fp > 0 {
		cycle = int(min(int64(count), rn.cfg.maxBytes/fp))
	}
	seq := opSequence{cycle: make([]*opArgs, max(cycle, 1)), count: count}
	for i := range seq.cycle {
		send, recv := rn.views(rs, p, inPlace, i)
		var err error
		if seq.cycle[i], err = rn.opArgsFor(rs, p, send, recv); err != nil {
			return opSequence{}, err
		}
	}
	return seq, nil
}

// issue runs seq in order on rs: with -z 1 each call blocks; otherwise
// all are issued as async requests and then waited for, the way nccl-tests
// launches a whole loop onto a stream before synchronizing. A Comm's
// requests complete in issue order, and a failed one aborts the Comm,
// failing those after it: waiting for the last waits for all, and the
// loop holds no other request (nor the garbage collector's time marking
// them).
func (rn *runner) issue(rs *rankState, seq opSequence) error {
	c, t := rs.comm, rn.cfg.test
	var last *comm.Request
	for i, j := 0, 0; i < seq.count; i++ {
		a := seq.cycle[j]
		if j++; j == len(seq.cycle) {
			j = 0
		}
		if rn.cfg.blocking {
			if err := t.run(rn.ctx, c, a); err != nil {
				return err
			}
		} else {
			last = t.start(c, a)
		}
	}
	if last != nil {
		if err := last.Wait(rn.ctx); err != nil {
			return err
		}
	}
	return rs.gpu.sync()
}

func (rn *runner) warmUp(p *point) error {
	w := rn.cfg.warmup
	if w == 0 {
		return nil
	}
	return rn.parallel(func(rs *rankState) error {
		seq, err := rn.sequence(rs, p, false, w)
		if err != nil {
			return err
		}
		return rn.issue(rs, seq)
	})
}

// measure times p in one placement, then checks its results (nccl-tests'
// BenchTime): the check runs separately so that it costs the timing nothing.
func (rn *runner) measure(p *point, inPlace bool) (placementResult, error) {
	c := rn.cfg
	total := c.iters * c.aggIters
	times := make([]time.Duration, len(rn.ranks))
	err := rn.parallel(func(rs *rankState) error {
		seq, err := rn.sequence(rs, p, inPlace, total)
		if err != nil {
			return err
		}
		// One untimed operation, then line the ranks up, so that the timed
		// loop starts together and pays no first-use costs.
		if err := rn.issue(rs, once(seq.cycle[0])); err != nil {
			return err
		}
		if err := rs.comm.Barrier(rn.ctx); err != nil {
			return err
		}
		m := measurement{rank: rs.rank, bytes: p.lay.sizeBytes(p.dt.dt.Size()), inPlace: inPlace, ops: total}
		d, err := rn.env.timer(m, func() error { return rn.issue(rs, seq) })
		times[rs.local] = d
		return err
	})
	if err != nil {
		return placementResult{}, err
	}
	jobTime, err := rn.jobTime(times)
	if err != nil {
		return placementResult{}, err
	}
	sec := jobTime.Seconds() / float64(total)
	res := placementResult{TimeUs: sec * 1e6, Checked: c.check > 0}
	if sec > 0 {
		res.AlgBW = float64(c.test.algBytes(p.lay, p.dt.dt.Size(), rn.n)) / 1e9 / sec
		res.BusBW = res.AlgBW * busBW(c.test.name, rn.n)
	}
	// Like nccl-tests, -c N runs up to N check passes and stops at the first
	// that finds wrong elements. Every process sees the job's count, so all
	// stop at the same pass.
	for range c.check {
		if res.Wrong, err = rn.checkPass(p, inPlace); err != nil || res.Wrong > 0 {
			break
		}
	}
	return res, err
}

// checkPass runs p once on fresh inputs and poisoned outputs and returns the
// wrong elements summed over every rank of the job.
func (rn *runner) checkPass(p *point, inPlace bool) (int64, error) {
	wrong := make([]int64, len(rn.ranks))
	err := rn.parallel(func(rs *rankState) error {
		send, recv := rn.views(rs, p, inPlace, 0)
		sendBytes, recvBytes := rs.hostBytes(send), rs.hostBytes(recv)
		if inPlace {
			poison(rs.recv[:p.lay.sizeBytes(p.dt.dt.Size())])
		} else {
			poison(recvBytes)
		}
		p.spec.fillInput(rs.rank, sendBytes) // after the poison: in place, send lies inside it
		if err := rs.upload(); err != nil {
			return err
		}
		a, err := rn.opArgsFor(rs, p, send, recv)
		if err != nil {
			return err
		}
		if err := rn.issue(rs, once(a)); err != nil {
			return err
		}
		if err := rs.download(); err != nil {
			return err
		}
		if rn.env.afterCheckOp != nil {
			rn.env.afterCheckOp(rs.rank, inPlace, recvBytes)
		}
		wrong[rs.local] = p.spec.countWrong(rn.cfg.test, rs.rank, p.root, p.lay.paramCount, recvBytes)
		return nil
	})
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, w := range wrong {
		sum += w
	}
	return rn.jobWrong(sum)
}

// jobTime combines the timed loops of this process's ranks with those of
// the rest of the job, as -a asks.
func (rn *runner) jobTime(local []time.Duration) (time.Duration, error) {
	mode := rn.cfg.average
	if rn.world == nil {
		return combineTimes(local, mode), nil
	}
	v := []float64{timeContribution(mode, rn.world.Rank(), local[0])}
	if err := comm.AllReduce(rn.ctx, rn.world, v, v, timeReductionOp(mode)); err != nil {
		return 0, fmt.Errorf("combining times across ranks: %w", err)
	}
	return timeFromReduction(mode, v[0], rn.n), nil
}

// jobWrong sums this process's wrong-element count over the job.
func (rn *runner) jobWrong(local int64) (int64, error) {
	if rn.world == nil {
		return local, nil
	}
	v := []int64{local}
	if err := comm.AllReduce(rn.ctx, rn.world, v, v, comm.Sum); err != nil {
		return 0, fmt.Errorf("summing wrong elements across ranks: %w", err)
	}
	return v[0], nil
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

// Across processes, -a's combination is one all-reduce of a float64 per
// rank: rank 0's time and the mean are sums (of rank 0's time alone, or of
// every rank's), the minimum and the maximum are Min and Max. Times travel
// as nanoseconds, exact in a float64 up to 104 days.

// timeReductionOp is the all-reduce op that combines rank times as mode asks.
func timeReductionOp(mode averageMode) comm.Op {
	switch mode {
	case averageMin:
		return comm.Min
	case averageMax:
		return comm.Max
	}
	return comm.Sum
}

// timeContribution is what rank puts into the all-reduce for its time d.
func timeContribution(mode averageMode, rank int, d time.Duration) float64 {
	if mode == averageRank0 && rank != 0 {
		return 0
	}
	return float64(d)
}

// timeFromReduction is the combined time given the all-reduced value over
// n ranks.
func timeFromReduction(mode averageMode, reduced float64, n int) time.Duration {
	if mode == averageMean {
		return time.Duration(reduced) / time.Duration(n) // truncates like combineTimes
	}
	return time.Duration(reduced)
}

// parallel runs f for every local rank at once and waits for all. A rank
// that fails aborts every local Comm, so that its peers, here and in other
// processes, return errors instead of waiting for it until the timeout.
func (rn *runner) parallel(f func(rs *rankState) error) error {
	errs := make([]error, len(rn.ranks))
	var wg sync.WaitGroup
	for _, rs := range rn.ranks {
		wg.Go(func() {
			if err := f(rs); err != nil {
				errs[rs.local] = err
				for _, other := range rn.ranks {
					other.comm.Abort(err)
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
