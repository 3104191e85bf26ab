package ddp_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/ddp"
)

var bg = context.Background()

// world makes n in-process ranks, closed when the test ends.
func world(t testing.TB, n int) []*comm.Comm {
	t.Helper()
	cs, err := comm.InitLocal(n, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, c := range cs {
			c.Close()
		}
	})
	return cs
}

// onAll runs f on every rank at once and returns each rank's error; ranks
// still running after a minute are aborted and the test fails as hung.
func onAll(t testing.TB, cs []*comm.Comm, f func(c *comm.Comm) error) []error {
	t.Helper()
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for r, c := range cs {
		wg.Go(func() { errs[r] = f(c) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		for _, c := range cs {
			c.Abort(errors.New("test hung"))
		}
		<-done
		t.Fatalf("ranks hung; errors after abort: %v", errs)
	}
	return errs
}

func noErrors(t testing.TB, errs []error) {
	t.Helper()
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

// reducers makes a Reducer on every rank, closed when the test ends.
func reducers(t testing.TB, cs []*comm.Comm, sizes []int, cfg *ddp.Config) []*ddp.Reducer {
	t.Helper()
	rs := make([]*ddp.Reducer, len(cs))
	noErrors(t, onAll(t, cs, func(c *comm.Comm) (err error) {
		rs[c.Rank()], err = ddp.New(bg, c, sizes, cfg)
		return err
	}))
	t.Cleanup(func() {
		for _, r := range rs {
			require.NoError(t, r.Close())
		}
	})
	return rs
}

// grad is rank's synthetic gradient of parameter i, element j, at a step:
// multiples of 1/4 in [-2, 2], so every partial sum is exact.
func grad(rank, step, i, j int) float32 {
	return float32((rank*7+i*3+j+step*5)%17-8) / 4
}

func fill(g []float32, rank, step, i int) {
	for j := range g {
		g[j] = grad(rank, step, i, j)
	}
}

// want is the reduced gradient: the ranks' average, or their sum times
// scale.
func want(n, step, i, j int, scale float64) float64 {
	s := 0.0
	for r := range n {
		s += float64(grad(r, step, i, j))
	}
	if scale == 0 {
		return s / float64(n)
	}
	return s * scale
}

// order is a rank's order of marking parameters in a step: reverse
// registration order on rank 0 (a backward pass), shuffled on the others.
func order(nparams, rank, step int) []int {
	o := make([]int, nparams)
	for k := range o {
		o[k] = nparams - 1 - k
	}
	if rank > 0 {
		rand.New(rand.NewPCG(uint64(rank), uint64(step))).Shuffle(len(o), func(a, b int) { o[a], o[b] = o[b], o[a] })
	}
	return o
}

// step runs one step on every rank: fill, mark in order(), Wait.
func step(t testing.TB, cs []*comm.Comm, rs []*ddp.Reducer, s int) {
	t.Helper()
	noErrors(t, onAll(t, cs, func(c *comm.Comm) error {
		r := rs[c.Rank()]
		for _, i := range order(r.NumParams(), c.Rank(), s) {
			fill(r.Grad(i), c.Rank(), s, i)
			if err := r.MarkReady(i); err != nil {
				return err
			}
		}
		return r.Wait(bg)
	}))
}

// checkReduced checks every rank's gradients against want, within tol
// (relative to the gradients' scale of 2), and that all ranks hold the
// same bits.
func checkReduced(t testing.TB, rs []*ddp.Reducer, s int, scale, tol float64) {
	t.Helper()
	n := len(rs)
	if scale == 0 && n&(n-1) != 0 {
		tol += 1e-7 // the average premultiplies by 1/n, inexact
	}
	for i := range rs[0].NumParams() {
		g0 := rs[0].Grad(i)
		for j, v := range g0 {
			w := want(n, s, i, j, scale)
			require.InDelta(t, w, float64(v), tol*2, "step %d parameter %d element %d", s, i, j)
		}
		for r := 1; r < n; r++ {
			require.Equal(t, g0, rs[r].Grad(i), "rank %d's parameter %d differs from rank 0's", r, i)
		}
	}
}

func TestLayout(t *testing.T) {
	for _, tc := range []struct {
		name          string
		sizes         []int
		first, bucket int
		want          [][]int
	}{
		{"one bucket", []int{10, 20, 30}, 1 << 20, 1 << 20, [][]int{{2, 1, 0}}},
		// 4 bytes per element: the first bucket closes at 100 bytes (25
		// elements) with the parameter that reaches it, the others at 200.
		{"reverse order, first bucket", []int{5, 40, 10, 10, 30, 20}, 100, 200,
			[][]int{{5, 4}, {3, 2, 1}, {0}}},
		{"a parameter larger than a bucket is alone", []int{1, 1000, 1}, 8, 8,
			[][]int{{2, 1}, {0}}},
		{"every parameter alone", []int{3, 3, 3}, 4, 4, [][]int{{2}, {1}, {0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, ddp.Layout(tc.sizes, tc.first, tc.bucket))
		})
	}
}

// The Reducer lays the buckets out as Layout says, with DDP's defaults.
func TestBucketsFollowLayout(t *testing.T) {
	cs := world(t, 1)
	sizes := []int{300_000, 1000, 2_000_000, 10, 5_000_000, 100}
	rs := reducers(t, cs, sizes, nil)
	require.Equal(t, ddp.Layout(sizes, ddp.DefaultFirstBucketBytes, ddp.DefaultBucketBytes), rs[0].Buckets())
	require.Equal(t, [][]int{{5, 4}, {3, 2, 1, 0}}, rs[0].Buckets())
	for i, n := range sizes {
		require.Len(t, rs[0].Grad(i), n)
		require.Equal(t, n, cap(rs[0].Grad(i)), "a view must not reach into the next parameter")
	}
}

func TestAverage(t *testing.T) {
	sizes := []int{7, 1000, 3, 4097, 64, 1}
	for _, n := range []int{1, 2, 3, 4} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			cs := world(t, n)
			rs := reducers(t, cs, sizes, &ddp.Config{BucketBytes: 4096, FirstBucketBytes: 64})
			require.Len(t, rs[0].Buckets(), 3)
			for s := range 3 {
				step(t, cs, rs, s)
				checkReduced(t, rs, s, 0, 1e-7)
			}
			require.EqualValues(t, 3, rs[0].Stats().Steps)
			require.EqualValues(t, 3*len(rs[0].Buckets()), rs[0].Stats().Buckets)
		})
	}
}

func TestSumWithScale(t *testing.T) {
	cs := world(t, 3)
	rs := reducers(t, cs, []int{100, 200}, &ddp.Config{Scale: 0.5, FirstBucketBytes: 400})
	step(t, cs, rs, 0)
	checkReduced(t, rs, 0, 0.5, 0)
}

// Set copies a gradient the framework owns into the bucket (one copy).
func TestSet(t *testing.T) {
	cs := world(t, 2)
	sizes := []int{5, 6}
	rs := reducers(t, cs, sizes, nil)
	noErrors(t, onAll(t, cs, func(c *comm.Comm) error {
		r := rs[c.Rank()]
		for i := range sizes {
			g := make([]float32, sizes[i])
			fill(g, c.Rank(), 0, i)
			if err := r.Set(i, g); err != nil {
				return err
			}
		}
		return r.Wait(bg)
	}))
	checkReduced(t, rs, 0, 0, 0)

	err := rs[0].Set(0, make([]float32, 4))
	require.ErrorIs(t, err, comm.ErrInvalidArgument)
	require.ErrorContains(t, err, "parameter 0 has 5 elements, Set got 4")
}

// Buckets start in bucket order, each once it and every earlier one are
// complete, whatever order the parameters are marked in.
func TestBucketsStartInOrder(t *testing.T) {
	cs := world(t, 1)
	// Six parameters of 64 bytes, buckets of two: {5,4} {3,2} {1,0}.
	rs := reducers(t, cs, []int{16, 16, 16, 16, 16, 16}, &ddp.Config{BucketBytes: 128, FirstBucketBytes: 128})
	r := rs[0]
	require.Equal(t, [][]int{{5, 4}, {3, 2}, {1, 0}}, r.Buckets())
	for _, tc := range []struct {
		mark    int
		started int
	}{
		{3, 0}, {2, 0}, // bucket 1 complete, but bucket 0 is not
		{5, 0}, {0, 0},
		{4, 2}, // bucket 0 complete: it and bucket 1 start
		{1, 3},
	} {
		require.NoError(t, r.MarkReady(tc.mark))
		require.Equal(t, tc.started, ddp.Started(r), "after marking parameter %d", tc.mark)
	}
	require.NoError(t, r.Wait(bg))
}

// A bucket's all-reduce runs before Wait, while the caller still "computes"
// the rest of the backward pass: here the caller waits for bucket 0's
// reduction to return on every rank before marking the last parameter.
func TestOverlap(t *testing.T) {
	cs := world(t, 2)
	sizes := []int{1000, 1000, 1000}
	rs := reducers(t, cs, sizes, &ddp.Config{BucketBytes: 4000, FirstBucketBytes: 4000})
	require.Equal(t, [][]int{{2}, {1}, {0}}, rs[0].Buckets())
	noErrors(t, onAll(t, cs, func(c *comm.Comm) error {
		r := rs[c.Rank()]
		for _, i := range []int{2, 1} {
			fill(r.Grad(i), c.Rank(), 0, i)
			if err := r.MarkReady(i); err != nil {
				return err
			}
		}
		deadline := time.Now().Add(30 * time.Second)
		for ddp.Finished(r) < 2 {
			if time.Now().After(deadline) {
				return errors.New("buckets 0 and 1 did not finish before Wait")
			}
			time.Sleep(time.Millisecond)
		}
		fill(r.Grad(0), c.Rank(), 0, 0)
		if err := r.MarkReady(0); err != nil {
			return err
		}
		return r.Wait(bg)
	}))
	checkReduced(t, rs, 0, 0, 0)
	for _, r := range rs {
		// Buckets 0 and 1 ran wholly before Wait: their time counts as
		// overlapped (how much of the total that is depends on timing).
		s := r.Stats()
		require.Positive(t, s.Overlapped, "%+v", s)
		require.LessOrEqual(t, s.Overlapped, s.Comm, "%+v", s)
	}
}

// MarkReady may be called from several goroutines at once (a framework
// whose backward pass runs layers in parallel).
func TestConcurrentMarkReady(t *testing.T) {
	cs := world(t, 2)
	sizes := make([]int, 64)
	for i := range sizes {
		sizes[i] = 100 + i
	}
	rs := reducers(t, cs, sizes, &ddp.Config{BucketBytes: 2000, FirstBucketBytes: 2000})
	for s := range 3 {
		noErrors(t, onAll(t, cs, func(c *comm.Comm) error {
			r := rs[c.Rank()]
			var wg sync.WaitGroup
			errs := make([]error, 4)
			for w := range 4 {
				wg.Go(func() {
					for i := w; i < len(sizes); i += 4 {
						fill(r.Grad(i), c.Rank(), s, i)
						if err := r.MarkReady(i); err != nil && errs[w] == nil {
							errs[w] = err
						}
					}
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				return err
			}
			return r.Wait(bg)
		}))
		checkReduced(t, rs, s, 0, 0)
	}
}

// A rank that misses a parameter (PyTorch's unused parameter) fails the
// step on every rank, naming itself and the parameter; nobody hangs, and
// the next step works.
func TestMissedParameter(t *testing.T) {
	cs := world(t, 3)
	sizes := []int{10, 20, 30, 40}
	cfg := &ddp.Config{BucketBytes: 100, FirstBucketBytes: 100, Names: []string{"w1", "b1", "w2", "b2"}}
	rs := reducers(t, cs, sizes, cfg)
	errs := onAll(t, cs, func(c *comm.Comm) error {
		r := rs[c.Rank()]
		for i := range sizes {
			if c.Rank() == 2 && i == 1 {
				continue
			}
			fill(r.Grad(i), c.Rank(), 0, i)
			if err := r.MarkReady(i); err != nil {
				return err
			}
		}
		return r.Wait(bg)
	})
	for r, err := range errs {
		require.ErrorIs(t, err, comm.ErrMismatch, "rank %d", r)
		require.ErrorContains(t, err, fmt.Sprintf("ddp: rank %d: step 0: rank 2 did not mark parameter 1 (\"b1\") ready before Wait", r))
	}
	step(t, cs, rs, 1)
	checkReduced(t, rs, 1, 0, 0)
}

// A rank that marks a parameter twice hears at once, and the step fails
// on every rank.
func TestMarkedTwice(t *testing.T) {
	cs := world(t, 2)
	sizes := []int{10, 20}
	rs := reducers(t, cs, sizes, nil)
	errs := onAll(t, cs, func(c *comm.Comm) error {
		r := rs[c.Rank()]
		for _, i := range []int{1, 0} {
			if err := r.MarkReady(i); err != nil {
				return err
			}
		}
		if c.Rank() == 1 {
			err := r.MarkReady(0)
			if !errors.Is(err, comm.ErrInvalidArgument) {
				return fmt.Errorf("second MarkReady(0): %v, want ErrInvalidArgument", err)
			}
			e2 := r.MarkReady(7)
			if !errors.Is(e2, comm.ErrInvalidArgument) || !errors.Is(err, comm.ErrInvalidArgument) {
				return fmt.Errorf("MarkReady(7): %v, want ErrInvalidArgument", e2)
			}
		}
		return r.Wait(bg)
	})
	for r, err := range errs {
		require.ErrorIs(t, err, comm.ErrMismatch, "rank %d", r)
		require.ErrorContains(t, err, "rank 1 marked parameter 0 ready twice")
	}
	step(t, cs, rs, 1)
	checkReduced(t, rs, 1, 0, 0)
}

// New is collective and refuses, on every rank, registrations that differ.
func TestRegistrationMismatch(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sizes func(rank int) []int
		cfg   func(rank int) *ddp.Config
		kind  error
		msg   string
	}{
		{"sizes", func(r int) []int { return []int{10, 20 + r} }, func(int) *ddp.Config { return nil },
			comm.ErrMismatch, "rank 1 registers other parameter sizes or another Config"},
		{"invalid", func(r int) []int { return []int{10, 20 * (1 - r)} }, func(int) *ddp.Config { return nil },
			comm.ErrInvalidArgument, "arguments are invalid"},
		{"number", func(r int) []int { return []int{10, 20, 30}[:2+r] }, func(int) *ddp.Config { return nil },
			comm.ErrMismatch, "rank 1 registers 3 parameters, this rank 2"},
		{"config", func(r int) []int { return []int{10, 20} }, func(r int) *ddp.Config { return &ddp.Config{Compression: ddp.Compression(r)} },
			comm.ErrMismatch, "another Config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := world(t, 2)
			errs := onAll(t, cs, func(c *comm.Comm) error {
				r, err := ddp.New(bg, c, tc.sizes(c.Rank()), tc.cfg(c.Rank()))
				if err == nil {
					r.Close()
				}
				return err
			})
			for r, err := range errs {
				require.ErrorIs(t, err, tc.kind, "rank %d", r)
			}
			require.ErrorContains(t, errs[0], tc.msg)
		})
	}
}

// Compressed buckets travel as bfloat16 or float16: the result is the
// average within the type's rounding, the same bits on every rank.
func TestCompression(t *testing.T) {
	for _, tc := range []struct {
		comp ddp.Compression
		tol  float64 // relative
	}{
		{ddp.BFloat16, 1.0 / 128}, {ddp.Float16, 1.0 / 1024},
	} {
		for _, sym := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/symmetric=%v", tc.comp, sym), func(t *testing.T) {
				cs := world(t, 3)
				sizes := []int{70_000, 1000, 17}
				rs := reducers(t, cs, sizes, &ddp.Config{Compression: tc.comp, Symmetric: sym, FirstBucketBytes: 4000})
				require.Len(t, rs[0].Buckets(), 2)
				for s := range 2 {
					step(t, cs, rs, s)
					checkReduced(t, rs, s, 0, 2*tc.tol)
				}
				require.EqualValues(t, 2*2*(70_000+1000+17), rs[0].Stats().Bytes, "compressed bytes, two steps")
			})
		}
	}
}

// Symmetric buckets (Comm.Alloc memory) of 64 KiB or more take the
// zero-copy all-reduce; the result is the same as on the heap.
func TestSymmetric(t *testing.T) {
	for _, scale := range []float64{0, 1} {
		t.Run(fmt.Sprintf("scale=%v", scale), func(t *testing.T) {
			cs := world(t, 2)
			sizes := []int{40_000, 30_000, 5}
			rs := reducers(t, cs, sizes, &ddp.Config{Symmetric: true, Scale: scale, FirstBucketBytes: 100_000})
			require.True(t, ddp.InSymmetricMemory(rs[0]))
			for s := range 3 {
				step(t, cs, rs, s)
				checkReduced(t, rs, s, scale, 0)
			}
		})
	}
}

// lockstep runs op on ranks 1..n-1 in goroutines each time the returned
// function runs it on rank 0, so that testing.AllocsPerRun (which counts
// every goroutine's allocations) measures whole steps.
func lockstep(t testing.TB, n int, op func(rank int) error) (run func(), stop func()) {
	start := make([]chan struct{}, n)
	done := make(chan error, n)
	for r := 1; r < n; r++ {
		start[r] = make(chan struct{})
		go func() {
			for range start[r] {
				done <- op(r)
			}
		}()
	}
	run = func() {
		for r := 1; r < n; r++ {
			start[r] <- struct{}{}
		}
		err := op(0)
		for r := 1; r < n; r++ {
			err = errors.Join(err, <-done)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	stop = func() {
		for r := 1; r < n; r++ {
			close(start[r])
		}
	}
	return run, stop
}

// A step allocates nothing: MarkReady, the bucket all-reduces, compression,
// the agreement round and Wait, on every rank.
func TestStepAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	sizes := []int{20_000, 300, 50_000, 7, 1000}
	for _, tc := range []struct {
		name string
		cfg  ddp.Config
	}{
		{"avg", ddp.Config{FirstBucketBytes: 1000, BucketBytes: 100_000}},
		{"scale", ddp.Config{Scale: 0.25}},
		{"bf16", ddp.Config{Compression: ddp.BFloat16, FirstBucketBytes: 1000}},
		{"symmetric", ddp.Config{Symmetric: true, FirstBucketBytes: 1000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 3
			cs := world(t, n)
			rs := reducers(t, cs, sizes, &tc.cfg)
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			run, stop := lockstep(t, n, func(rank int) error {
				r := rs[rank]
				for i := len(sizes) - 1; i >= 0; i-- {
					if err := r.MarkReady(i); err != nil {
						return err
					}
				}
				return r.Wait(ctx)
			})
			defer stop()
			run() // warm up: connections, plans, scratch
			require.Zero(t, testing.AllocsPerRun(20, run), "allocations per step")
		})
	}
}

func TestBroadcastAndCheckReplicas(t *testing.T) {
	cs := world(t, 3)
	sizes := []int{10, 70_000, 3}
	rs := reducers(t, cs, sizes, &ddp.Config{Symmetric: true, FirstBucketBytes: 64})
	params := make([][][]float32, len(cs))
	for r := range params {
		params[r] = make([][]float32, len(sizes))
		for i, n := range sizes {
			params[r][i] = make([]float32, n)
			fill(params[r][i], r, 9, i)
		}
	}
	check := func() []error {
		return onAll(t, cs, func(c *comm.Comm) error { return rs[c.Rank()].CheckReplicas(bg, params[c.Rank()]) })
	}
	for r, err := range check() {
		require.ErrorIs(t, err, comm.ErrMismatch, "rank %d", r)
		require.ErrorContains(t, err, "parameter 0 differs between rank 0 and rank 1")
	}
	noErrors(t, onAll(t, cs, func(c *comm.Comm) error { return rs[c.Rank()].BroadcastParams(bg, params[c.Rank()]) }))
	for r := range params {
		require.Equal(t, params[0], params[r], "rank %d", r)
	}
	for i := range sizes {
		want := make([]float32, sizes[i])
		fill(want, 0, 9, i)
		require.Equal(t, want, params[1][i])
	}
	noErrors(t, check())

	// One rank's mistake fails every rank, naming it.
	params[2][1][5]++
	for r, err := range check() {
		require.ErrorIs(t, err, comm.ErrMismatch, "rank %d", r)
		require.ErrorContains(t, err, "parameter 1 differs between rank 0 and rank 2")
	}
	errs := onAll(t, cs, func(c *comm.Comm) error {
		p := params[c.Rank()]
		if c.Rank() == 1 {
			p = p[:2]
		}
		return rs[c.Rank()].BroadcastParams(bg, p)
	})
	for r, err := range errs {
		require.ErrorIs(t, err, comm.ErrInvalidArgument, "rank %d", r)
	}
	require.ErrorContains(t, errs[0], "rank 1's arguments are invalid")
	require.ErrorContains(t, errs[1], "2 parameters for 3 registered")

	// The gradients still reduce after the buckets served the broadcast.
	step(t, cs, rs, 0)
	checkReduced(t, rs, 0, 0, 0)
}

func TestMisuse(t *testing.T) {
	cs := world(t, 1)
	_, err := ddp.New(bg, cs[0], nil, nil)
	require.ErrorIs(t, err, comm.ErrInvalidArgument)
	_, err = ddp.New(bg, cs[0], []int{3, 0}, nil)
	require.ErrorIs(t, err, comm.ErrInvalidArgument)
	require.ErrorContains(t, err, "parameter 1 has 0 elements")
	_, err = ddp.New(bg, cs[0], []int{3}, &ddp.Config{Names: []string{"a", "b"}})
	require.ErrorIs(t, err, comm.ErrInvalidArgument)

	r, err := ddp.New(bg, cs[0], []int{3, 4}, nil)
	require.NoError(t, err)
	require.NoError(t, r.MarkReady(0))
	require.ErrorIs(t, r.BroadcastParams(bg, [][]float32{make([]float32, 3), make([]float32, 4)}), comm.ErrInvalidArgument)

	// A canceled Wait returns at once and can be resumed.
	ctx, cancel := context.WithCancel(bg)
	cancel()
	require.ErrorIs(t, r.Wait(ctx), context.Canceled)
	require.ErrorIs(t, r.MarkReady(1), comm.ErrInvalidArgument)
	require.ErrorContains(t, r.Wait(bg), "did not mark parameter 1")
	require.NoError(t, r.Close())
	require.NoError(t, r.Close())
	require.ErrorIs(t, r.MarkReady(0), comm.ErrClosed)
	require.ErrorIs(t, r.Wait(bg), comm.ErrClosed)
}

// Named parameters appear in the errors; unnamed ones by index.
func TestErrorNamesParameter(t *testing.T) {
	cs := world(t, 1)
	r, err := ddp.New(bg, cs[0], []int{3}, &ddp.Config{Names: []string{"dense/weights"}})
	require.NoError(t, err)
	defer r.Close()
	require.NoError(t, r.MarkReady(0))
	err = r.MarkReady(0)
	require.ErrorContains(t, err, `ddp: rank 0: step 0: MarkReady(0): gccl: invalid argument: parameter 0 ("dense/weights") marked ready twice in one step`)
	require.ErrorContains(t, r.Wait(bg), `rank 0 marked parameter 0 ("dense/weights") ready twice`)
	require.False(t, math.IsNaN(r.Stats().Overlap()))
}
