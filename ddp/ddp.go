// Package ddp reduces the gradients of a data-parallel training job across
// its ranks, as the Reducer of PyTorch's DistributedDataParallel does, for Go
// trainers of any framework: it knows nothing of models, only of gradient
// buffers.
//
// # The contract
//
// Every rank calls New with the same parameter sizes, in the same
// registration order (the model's forward order) and the same Config; New
// is collective and fails on every rank, with ErrMismatch naming a rank,
// when they differ. The gradients then live in flat buckets that the
// Reducer owns: Grad(i) is parameter i's gradient, a view into its bucket.
// A framework that lets the caller provide gradient memory writes there
// (no copy in or out); otherwise Set copies a gradient in (one copy).
//
// Buckets are filled in reverse registration order, as a backward pass
// produces gradients: the first bucket holds the last parameters, up to
// Config.FirstBucketBytes (1 MiB by default, small so that communication
// starts early), then each bucket up to Config.BucketBytes (25 MiB by
// default). A bucket closes with the parameter that reaches its limit, so
// it may exceed it by one parameter, and a parameter larger than the limit
// is a bucket of its own.
//
// One step is: write each gradient, MarkReady(i) as soon as it is final
// (Set does both), then Wait before the optimizer reads the gradients. A
// bucket's all-reduce starts as soon as all its parameters are marked and
// every earlier bucket has started, so communication runs while the
// backward pass computes the rest; buckets start in the same order on every
// rank whatever order the parameters are marked in. MarkReady may be called
// from several goroutines at once; Wait from one. After Wait returns nil,
// Grad(i) holds the average of the ranks' gradients (Config.Scale: their
// sum times a scale), the same bits on every rank, until the next step
// writes it. A step that marks nothing and does not Wait communicates
// nothing, so gradients can accumulate in Grad(i) over several local steps.
//
// Every rank must mark every parameter once per step. Wait checks this on
// every rank in one small extra round (an all-gather of a few words per
// rank): a rank that missed a parameter (PyTorch's "unused parameters"),
// marked one twice or skipped a step makes Wait fail on every rank with
// ErrMismatch naming the rank and the parameter, instead of hanging or
// silently mixing steps. The gradients of a failed step are undefined;
// skip the optimizer step. The Comm stays usable and the next step starts
// afresh.
//
// Between the first MarkReady of a step and the return of its Wait the
// Comm belongs to the Reducer: the bucket all-reduces run on its own
// goroutine, and a collective issued on the Comm meanwhile by the caller
// fails with comm.ErrConcurrentUse. A step allocates nothing.
//
// Config.Symmetric puts the buckets in memory from Comm.Alloc, so that
// buckets of 64 KiB or more take gccl's zero-copy symmetric all-reduce.
// Config.Compression all-reduces the buckets as bfloat16 or float16 (half
// the bytes, like PyTorch's bf16_compress_hook): each bucket is rounded on
// its way out and widened back into Grad when it returns.
//
// BroadcastParams copies rank 0's parameters to every rank before training
// (DDP does this at construction), and CheckReplicas tells whether every
// rank holds the same parameters, bit for bit.
package ddp

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"sync"
	"time"
	"unsafe"

	"github.com/gccl/gccl/comm"
)

// Defaults of Config, as in PyTorch's DDP.
const (
	DefaultBucketBytes      = 25 << 20
	DefaultFirstBucketBytes = 1 << 20
)

// Compression is how buckets travel.
type Compression uint8

const (
	// NoCompression all-reduces float32 gradients as they are.
	NoCompression Compression = iota
	// BFloat16 rounds each bucket to bfloat16, all-reduces that, and
	// widens the result back to float32.
	BFloat16
	// Float16 does the same with IEEE half precision (more mantissa, less
	// range: gradients beyond 65504 overflow).
	Float16
)

func (c Compression) String() string {
	switch c {
	case NoCompression:
		return "none"
	case BFloat16:
		return "bf16"
	case Float16:
		return "fp16"
	}
	return fmt.Sprintf("Compression(%d)", uint8(c))
}

// Config tunes a Reducer. The zero value is PyTorch DDP's defaults: 25 MiB
// buckets after a 1 MiB first one, averaged gradients, no compression,
// buckets on the heap.
type Config struct {
	// BucketBytes caps a bucket's size, in bytes of float32 gradient; 0
	// means DefaultBucketBytes.
	BucketBytes int
	// FirstBucketBytes caps the first bucket (the last parameters); 0
	// means DefaultFirstBucketBytes. Set it to BucketBytes for uniform
	// buckets.
	FirstBucketBytes int
	// Scale, when not 0, makes the reduced gradient the sum of the ranks'
	// gradients times Scale (comm.PreMulSum) instead of their average
	// (comm.Avg). Scale 1 sums.
	Scale float64
	// Compression picks the type the buckets are all-reduced in.
	Compression Compression
	// Symmetric allocates the buckets with Comm.Alloc, so that buckets of
	// 64 KiB or more take the zero-copy symmetric all-reduce. With
	// compression, the compressed buckets are the ones allocated so.
	Symmetric bool
	// Names, when not nil, names the parameters (one per size) in errors.
	Names []string
}

// Stats are a Reducer's counters since New.
type Stats struct {
	Steps   int64 // steps completed by Wait, failed ones included
	Buckets int64 // bucket all-reduces run
	Bytes   int64 // bytes all-reduced, as sent (compressed)
	// Comm is the time the bucket all-reduces took, compression included:
	// each from when the Reducer's goroutine started it to its end.
	Comm time.Duration
	// Overlapped is the part of Comm that ran before Wait was called, that
	// is behind the caller's own work (the backward pass).
	Overlapped time.Duration
	// Check is the time of the end-of-step agreement round.
	Check time.Duration
	// Blocked is the time the caller spent blocked in Wait: the exposed
	// communication, the agreement round included.
	Blocked time.Duration
}

// Overlap is the share of the communication hidden behind the caller's
// work: Overlapped / Comm, 0 when nothing was reduced.
func (s Stats) Overlap() float64 {
	if s.Comm <= 0 {
		return 0
	}
	return float64(s.Overlapped) / float64(s.Comm)
}

// param is one registered parameter's place.
type param struct {
	bucket int
	off, n int // elements, in flat
}

// bucket is a run of parameters reduced together.
type bucket struct {
	off, n int   // elements, in flat (and in the compressed buffers)
	params []int // parameter indices, in fill order
}

// The agreement record of a step, one per rank: its step number, the
// first parameter it did not mark (or -1), the first it marked twice or
// did not know (or -1).
const (
	recStep = iota
	recMissing
	recTwice
	recLen
)

// Reducer reduces registered gradients across the ranks of a Comm. See
// the package documentation for its contract.
type Reducer struct {
	c       *comm.Comm
	op      comm.Op
	comp    Compression
	names   []string
	params  []param
	buckets []bucket

	flat []float32 // every bucket's gradients
	bf   []comm.BFloat16Bits
	fp   []comm.Float16Bits
	syms []*comm.SymBuffer // Alloc'd memory, freed by Close

	// Step state, under mu.
	mu        sync.Mutex
	step      uint64
	marked    []bool
	left      []int // per bucket: parameters not yet marked
	next      int   // the next bucket to start
	marks     int   // MarkReady calls this step
	twice     int   // first parameter marked twice, or -1
	waiting   bool  // Wait started this step's end: the rest is launched
	completed int   // completions Wait has received this step
	closed    bool

	// The agreement round.
	mine, all []int64

	// The goroutine that runs the all-reduces: work carries bucket
	// indices (len(buckets) for the agreement round), done returns them
	// once run; errs and times are written before done is sent.
	work   chan int
	done   chan int
	exited chan struct{}
	errs   []error
	times  [][2]time.Time

	stats Stats
}

// New registers parameters by the number of float32 elements of their
// gradients, in forward order, and lays out their buckets. It is
// collective: every rank of c calls it with the same sizes and Config.
func New(ctx context.Context, c *comm.Comm, sizes []int, cfg *Config) (*Reducer, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	rank := c.Rank()
	bad := validate(sizes, cfg)
	r := &Reducer{c: c, comp: cfg.Compression, names: cfg.Names, op: comm.Avg, twice: -1}
	if cfg.Scale != 0 {
		r.op = comm.PreMulSum(cfg.Scale)
	}
	if err := r.agreeOnRegistration(ctx, sizes, cfg, bad); err != nil {
		return nil, err
	}
	first, limit := cfg.FirstBucketBytes, cfg.BucketBytes
	if first == 0 {
		first = DefaultFirstBucketBytes
	}
	if limit == 0 {
		limit = DefaultBucketBytes
	}
	groups := Layout(sizes, first, limit)
	r.params = make([]param, len(sizes))
	r.buckets = make([]bucket, len(groups))
	total := 0
	for b, g := range groups {
		total = alignUp(total)
		bk := bucket{off: total, params: g}
		for _, i := range g {
			r.params[i] = param{bucket: b, off: total, n: sizes[i]}
			total += sizes[i]
		}
		bk.n = total - bk.off
		r.buckets[b] = bk
	}
	if err := r.allocate(ctx, cfg.Symmetric, total); err != nil {
		return nil, fmt.Errorf("ddp: rank %d: allocating %d buckets of gradients: %w", rank, len(groups), err)
	}
	nb := len(r.buckets)
	r.marked = make([]bool, len(sizes))
	r.left = make([]int, nb)
	r.resetStep()
	r.mine, r.all = make([]int64, recLen), make([]int64, recLen*c.Size())
	r.work, r.done, r.exited = make(chan int, nb+1), make(chan int, nb+1), make(chan struct{})
	r.errs, r.times = make([]error, nb+1), make([][2]time.Time, nb+1)
	go r.run()
	return r, nil
}

// validate checks New's arguments on this rank.
func validate(sizes []int, cfg *Config) error {
	switch {
	case len(sizes) == 0:
		return invalid("no parameters")
	case cfg.Names != nil && len(cfg.Names) != len(sizes):
		return invalid("%d names for %d parameters", len(cfg.Names), len(sizes))
	case cfg.BucketBytes < 0 || cfg.FirstBucketBytes < 0:
		return invalid("negative bucket size %d, %d", cfg.FirstBucketBytes, cfg.BucketBytes)
	case cfg.Compression > Float16:
		return invalid("unknown compression %v", cfg.Compression)
	case math.IsNaN(cfg.Scale) || math.IsInf(cfg.Scale, 0):
		return invalid("scale %v", cfg.Scale)
	}
	for i, n := range sizes {
		if n <= 0 {
			return invalid("parameter %d has %d elements", i, n)
		}
	}
	return nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{comm.ErrInvalidArgument}, args...)...)
}

// agreeOnRegistration all-gathers each rank's verdict on its arguments and
// a fingerprint of them, so that New fails on every rank if one rank's
// arguments are bad or differ from another's.
func (r *Reducer) agreeOnRegistration(ctx context.Context, sizes []int, cfg *Config, bad error) error {
	h := fnv.New64a()
	var w [8]byte
	put := func(v uint64) {
		for k := range w {
			w[k] = byte(v >> (8 * k))
		}
		h.Write(w[:])
	}
	put(uint64(len(sizes)))
	for _, n := range sizes {
		put(uint64(n))
	}
	put(uint64(cfg.BucketBytes))
	put(uint64(cfg.FirstBucketBytes))
	put(math.Float64bits(cfg.Scale))
	put(uint64(cfg.Compression))
	if cfg.Symmetric {
		put(1)
	}
	ok := int64(0)
	if bad != nil {
		ok = 1
	}
	mine := []int64{ok, int64(len(sizes)), int64(h.Sum64())}
	all := make([]int64, len(mine)*r.c.Size())
	rank := r.c.Rank()
	if err := comm.AllGather(ctx, r.c, mine, all); err != nil {
		return fmt.Errorf("ddp: rank %d: registering parameters: %w", rank, err)
	}
	if bad != nil {
		return fmt.Errorf("ddp: rank %d: New: %w", rank, bad)
	}
	for p := range r.c.Size() {
		rec := all[p*len(mine) : (p+1)*len(mine)]
		switch {
		case rec[0] != 0:
			return fmt.Errorf("ddp: rank %d: New: rank %d's arguments are invalid (its error says why): %w", rank, p, comm.ErrInvalidArgument)
		case rec[1] != mine[1]:
			return fmt.Errorf("ddp: rank %d: New: rank %d registers %d parameters, this rank %d (every rank registers the same parameters in the same order): %w",
				rank, p, rec[1], mine[1], comm.ErrMismatch)
		case rec[2] != mine[2]:
			return fmt.Errorf("ddp: rank %d: New: rank %d registers other parameter sizes or another Config than this rank (every rank passes the same): %w",
				rank, p, comm.ErrMismatch)
		}
	}
	return nil
}

// Layout returns the buckets New makes of parameters with these sizes (in
// float32 elements): parameter indices per bucket, each in fill order,
// filled from the last parameter to the first; the first bucket closes at
// or beyond firstBytes, the others at or beyond bytes.
func Layout(sizes []int, firstBytes, bytes int) [][]int {
	var out [][]int
	var cur []int
	have, limit := 0, firstBytes
	for i := len(sizes) - 1; i >= 0; i-- {
		cur = append(cur, i)
		have += 4 * sizes[i]
		if have >= limit {
			out = append(out, cur)
			cur, have, limit = nil, 0, bytes
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// alignUp rounds an element offset up to 64 bytes, so that every bucket
// starts on a cache line.
func alignUp(n int) int { return (n + 15) &^ 15 }

// allocate makes the buckets' memory: float32 gradients, and the
// compressed copies when compressing; the buffer that is all-reduced comes
// from Comm.Alloc when sym.
func (r *Reducer) allocate(ctx context.Context, sym bool, total int) error {
	total = alignUp(total)
	if !sym {
		r.flat = make([]float32, total)
		switch r.comp {
		case BFloat16:
			r.bf = make([]comm.BFloat16Bits, total)
		case Float16:
			r.fp = make([]comm.Float16Bits, total)
		}
		return nil
	}
	var dt comm.DataType
	switch r.comp {
	case NoCompression:
		dt = comm.Float32
	case BFloat16:
		dt = comm.BFloat16
	case Float16:
		dt = comm.Float16
	}
	sb, err := r.c.Alloc(ctx, dt, total)
	if err != nil {
		return err
	}
	r.syms = append(r.syms, sb)
	switch r.comp {
	case NoCompression:
		r.flat, err = comm.SymSlice[float32](sb)
	case BFloat16:
		r.flat = make([]float32, total)
		r.bf, err = comm.SymSlice[comm.BFloat16Bits](sb)
	case Float16:
		r.flat = make([]float32, total)
		r.fp, err = comm.SymSlice[comm.Float16Bits](sb)
	}
	return err
}

// NumParams is the number of registered parameters.
func (r *Reducer) NumParams() int { return len(r.params) }

// Buckets returns the parameter indices of each bucket, in the order the
// buckets are reduced, each in fill order.
func (r *Reducer) Buckets() [][]int {
	out := make([][]int, len(r.buckets))
	for b, bk := range r.buckets {
		out[b] = append([]int(nil), bk.params...)
	}
	return out
}

// Grad returns parameter i's gradient: a view into its bucket, valid until
// Close. Write the gradient there, then MarkReady(i); after Wait it holds
// the reduced gradient.
func (r *Reducer) Grad(i int) []float32 {
	p := r.params[i]
	return r.flat[p.off : p.off+p.n : p.off+p.n]
}

// Set copies g into parameter i's gradient and marks it ready.
func (r *Reducer) Set(i int, g []float32) error {
	if i < 0 || i >= len(r.params) {
		return r.markErr(i, invalid("no parameter %d (%d registered)", i, len(r.params)))
	}
	if p := r.params[i]; len(g) != p.n {
		return r.markErr(i, invalid("%s has %d elements, Set got %d", r.name(i), p.n, len(g)))
	}
	copy(r.Grad(i), g)
	return r.MarkReady(i)
}

// MarkReady says parameter i's gradient is final for this step. When that
// completes a bucket, and every earlier bucket has started, the bucket's
// all-reduce starts (and with it any later buckets already complete). An
// error (an unknown parameter, one marked twice) also fails this step's
// Wait, on every rank; call Wait still, so that the other ranks learn of it.
func (r *Reducer) MarkReady(i int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return fmt.Errorf("ddp: rank %d: MarkReady(%d) after Close: %w", r.c.Rank(), i, comm.ErrClosed)
	case r.waiting:
		return fmt.Errorf("ddp: rank %d: MarkReady(%d) while Wait of step %d is unfinished (call Wait again until it returns): %w",
			r.c.Rank(), i, r.step, comm.ErrInvalidArgument)
	case i < 0 || i >= len(r.params):
		if r.twice < 0 {
			r.twice = len(r.params) // reported as an unknown parameter
		}
		r.marks++
		return r.markErr(i, invalid("no parameter %d (%d registered)", i, len(r.params)))
	case r.marked[i]:
		if r.twice < 0 {
			r.twice = i
		}
		r.marks++
		return r.markErr(i, invalid("%s marked ready twice in one step", r.name(i)))
	}
	r.marks++
	r.marked[i] = true
	b := r.params[i].bucket
	r.left[b]--
	for r.next < len(r.buckets) && r.left[r.next] == 0 {
		r.launch(r.next)
		r.next++
	}
	return nil
}

func (r *Reducer) markErr(i int, err error) error {
	return fmt.Errorf("ddp: rank %d: step %d: MarkReady(%d): %w", r.c.Rank(), r.step, i, err)
}

// launch hands a bucket (or, for len(buckets), the agreement round) to
// the Reducer's goroutine. The channel has room for a whole step.
func (r *Reducer) launch(b int) { r.work <- b }

// Wait waits for this step's all-reduces and the agreement round, and
// returns their verdict: nil when every rank marked every parameter once
// and every all-reduce succeeded. A parameter this rank did not mark is
// reduced anyway (with whatever its view holds) so that the other ranks'
// all-reduces complete, and the step fails everywhere. If ctx ends first,
// Wait returns its error and the reductions go on: call Wait again to
// finish the step (or abort the Comm).
func (r *Reducer) Wait(ctx context.Context) error {
	start := time.Now()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return fmt.Errorf("ddp: rank %d: Wait after Close: %w", r.c.Rank(), comm.ErrClosed)
	}
	if !r.waiting {
		r.waiting = true
		r.mine[recStep] = int64(r.step)
		r.mine[recMissing] = -1
		r.mine[recTwice] = int64(r.twice)
		for ; r.next < len(r.buckets); r.next++ {
			if r.left[r.next] > 0 && r.mine[recMissing] < 0 {
				r.mine[recMissing] = int64(r.firstMissing(r.next))
			}
			r.launch(r.next)
		}
		r.launch(len(r.buckets))
	}
	r.mu.Unlock()
	nb := len(r.buckets)
	for r.completed <= nb {
		// An ended ctx wins over reductions that finished too (select
		// would pick either): the Wait returns at once and can be resumed.
		if ctx.Err() != nil {
			r.stats.Blocked += time.Since(start)
			return fmt.Errorf("ddp: rank %d: step %d: Wait: %w", r.c.Rank(), r.step, ctx.Err())
		}
		select {
		case <-r.done:
			r.completed++
		case <-ctx.Done():
		}
	}
	r.stats.Blocked += time.Since(start)
	err := r.finish(start)
	r.mu.Lock()
	r.step++
	r.resetStep()
	r.mu.Unlock()
	return err
}

// firstMissing returns bucket b's first unmarked parameter.
func (r *Reducer) firstMissing(b int) int {
	for _, i := range r.buckets[b].params {
		if !r.marked[i] {
			return i
		}
	}
	return -1
}

// finish accounts for a step whose reductions all returned and turns their
// errors and the agreement into its verdict.
func (r *Reducer) finish(waitStart time.Time) error {
	nb := len(r.buckets)
	s := &r.stats
	s.Steps++
	for b := range nb {
		t := r.times[b]
		s.Buckets++
		s.Bytes += int64(r.buckets[b].n * r.wireSize())
		s.Comm += t[1].Sub(t[0])
		if end := minTime(t[1], waitStart); end.After(t[0]) {
			s.Overlapped += end.Sub(t[0])
		}
	}
	s.Check += r.times[nb][1].Sub(r.times[nb][0])
	for b := range nb + 1 {
		if err := r.errs[b]; err != nil {
			what := "the agreement round"
			if b < nb {
				what = fmt.Sprintf("bucket %d's all-reduce", b)
			}
			return fmt.Errorf("ddp: rank %d: step %d: %s: %w", r.c.Rank(), r.step, what, err)
		}
	}
	return r.verdict()
}

// verdict reads the agreement round: the first rank (in rank order) whose
// record shows a fault names it, so every rank returns the same story.
func (r *Reducer) verdict() error {
	rank := r.c.Rank()
	for p := range r.c.Size() {
		rec := r.all[p*recLen : (p+1)*recLen]
		switch {
		case rec[recStep] != int64(r.step):
			return fmt.Errorf("ddp: rank %d: step %d: rank %d is at step %d (a rank skipped a Wait, or called one more): %w",
				rank, r.step, p, rec[recStep], comm.ErrMismatch)
		case rec[recMissing] >= 0:
			return fmt.Errorf("ddp: rank %d: step %d: rank %d did not mark %s ready before Wait (every rank marks every parameter once a step; give an unused one a zero gradient): %w",
				rank, r.step, p, r.name(int(rec[recMissing])), comm.ErrMismatch)
		case rec[recTwice] >= int64(len(r.params)):
			return fmt.Errorf("ddp: rank %d: step %d: rank %d marked an unknown parameter ready: %w",
				rank, r.step, p, comm.ErrInvalidArgument)
		case rec[recTwice] >= 0:
			return fmt.Errorf("ddp: rank %d: step %d: rank %d marked %s ready twice: %w",
				rank, r.step, p, r.name(int(rec[recTwice])), comm.ErrMismatch)
		}
	}
	return nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// resetStep readies the step state for the next step; under mu.
func (r *Reducer) resetStep() {
	clear(r.marked)
	for b, bk := range r.buckets {
		r.left[b] = len(bk.params)
	}
	r.next, r.marks, r.twice, r.waiting, r.completed = 0, 0, -1, false, 0
}

// name names parameter i for errors.
func (r *Reducer) name(i int) string {
	if r.names != nil && i >= 0 && i < len(r.names) {
		return fmt.Sprintf("parameter %d (%q)", i, r.names[i])
	}
	return fmt.Sprintf("parameter %d", i)
}

func (r *Reducer) wireSize() int {
	if r.comp == NoCompression {
		return 4
	}
	return 2
}

// run is the Reducer's goroutine: it all-reduces buckets in the order they
// are launched, and runs each step's agreement round.
func (r *Reducer) run() {
	defer close(r.exited)
	for b := range r.work {
		t0 := time.Now()
		var err error
		if b == len(r.buckets) {
			err = comm.AllGather(context.Background(), r.c, r.mine, r.all)
		} else {
			err = r.reduce(b)
		}
		r.errs[b] = err
		r.times[b] = [2]time.Time{t0, time.Now()}
		r.done <- b
	}
}

// reduce all-reduces bucket b in place, through its compressed copy when
// compressing.
func (r *Reducer) reduce(b int) error {
	bk := r.buckets[b]
	g := r.flat[bk.off : bk.off+bk.n]
	ctx := context.Background()
	switch r.comp {
	case BFloat16:
		w := r.bf[bk.off : bk.off+bk.n]
		for k, v := range g {
			w[k] = comm.ToBFloat16(v)
		}
		err := comm.AllReduce(ctx, r.c, w, w, r.op)
		for k, v := range w {
			g[k] = v.Float()
		}
		return err
	case Float16:
		w := r.fp[bk.off : bk.off+bk.n]
		for k, v := range g {
			w[k] = comm.ToFloat16(v)
		}
		err := comm.AllReduce(ctx, r.c, w, w, r.op)
		for k, v := range w {
			g[k] = v.Float()
		}
		return err
	}
	return comm.AllReduce(ctx, r.c, g, g, r.op)
}

// Stats returns the counters. Call it between steps.
func (r *Reducer) Stats() Stats { return r.stats }

// Close stops the Reducer's goroutine, after the reductions in flight
// (abort the Comm to end those early), and frees the buckets' symmetric
// memory. It is not collective and does not close the Comm.
func (r *Reducer) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.mu.Unlock()
	close(r.work)
	<-r.exited
	var err error
	for _, sb := range r.syms {
		err = errors.Join(err, sb.Free())
	}
	r.flat, r.bf, r.fp, r.syms = nil, nil, nil, nil
	return err
}

// BroadcastParams copies rank 0's parameters into every rank's params
// (params[i] has parameter i's size), bucket by bucket through the
// gradient buckets, whose contents it overwrites. It is collective; call
// it before training or between steps.
func (r *Reducer) BroadcastParams(ctx context.Context, params [][]float32) error {
	rank := r.c.Rank()
	if err := r.agreeOnArgs(ctx, "BroadcastParams", r.checkParams(params)); err != nil {
		return err
	}
	for b, bk := range r.buckets {
		g := r.flat[bk.off : bk.off+bk.n]
		if rank == 0 {
			for _, i := range bk.params {
				copy(r.Grad(i), params[i])
			}
		}
		if err := comm.Broadcast(ctx, r.c, g, g, 0); err != nil {
			return fmt.Errorf("ddp: rank %d: BroadcastParams: bucket %d: %w", rank, b, err)
		}
		if rank != 0 {
			for _, i := range bk.params {
				copy(params[i], r.Grad(i))
			}
		}
	}
	return nil
}

// CheckReplicas tells whether every rank's params hold the same bits: each
// rank hashes each parameter, the ranks all-gather the hashes, and every
// rank returns nil or the same ErrMismatch naming the first parameter and
// rank that differ from rank 0. It is collective.
func (r *Reducer) CheckReplicas(ctx context.Context, params [][]float32) error {
	rank := r.c.Rank()
	if err := r.agreeOnArgs(ctx, "CheckReplicas", r.checkParams(params)); err != nil {
		return err
	}
	n := len(r.params)
	mine, all := make([]uint64, n), make([]uint64, n*r.c.Size())
	for i, p := range params {
		h := fnv.New64a()
		if len(p) > 0 {
			h.Write(unsafe.Slice((*byte)(unsafe.Pointer(&p[0])), 4*len(p)))
		}
		mine[i] = h.Sum64()
	}
	if err := comm.AllGather(ctx, r.c, mine, all); err != nil {
		return fmt.Errorf("ddp: rank %d: CheckReplicas: %w", rank, err)
	}
	for i := range n {
		for p := 1; p < r.c.Size(); p++ {
			if all[p*n+i] != all[i] {
				return fmt.Errorf("ddp: rank %d: CheckReplicas: %s differs between rank 0 and rank %d: %w",
					rank, r.name(i), p, comm.ErrMismatch)
			}
		}
	}
	return nil
}

// checkParams checks params against the registration.
func (r *Reducer) checkParams(params [][]float32) error {
	if len(params) != len(r.params) {
		return invalid("%d parameters for %d registered", len(params), len(r.params))
	}
	for i, p := range params {
		if len(p) != r.params[i].n {
			return invalid("%s has %d elements, got %d", r.name(i), r.params[i].n, len(p))
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return comm.ErrClosed
	case r.marks > 0 || r.waiting:
		return invalid("called during step %d (after MarkReady, before Wait returned)", r.step)
	}
	return nil
}

// agreeOnArgs all-gathers each rank's verdict on its arguments, so that a
// collective helper fails on every rank, naming the culprit, rather than
// leaving the others waiting.
func (r *Reducer) agreeOnArgs(ctx context.Context, op string, bad error) error {
	rank := r.c.Rank()
	mine, all := []int64{0}, make([]int64, r.c.Size())
	if bad != nil {
		mine[0] = 1
	}
	if err := comm.AllGather(ctx, r.c, mine, all); err != nil {
		return fmt.Errorf("ddp: rank %d: %s: %w", rank, op, err)
	}
	if bad != nil {
		return fmt.Errorf("ddp: rank %d: %s: %w", rank, op, bad)
	}
	for p, v := range all {
		if v != 0 {
			return fmt.Errorf("ddp: rank %d: %s: rank %d's arguments are invalid (its error says why): %w", rank, op, p, comm.ErrInvalidArgument)
		}
	}
	return nil
}
