//go:build linux

package comm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gccl/gccl/device"
	"github.com/gccl/gccl/device/devicetest"
)

// onStream binds a devicetest buffer to stream 7.
func onStream(b *devicetest.Buffer) *devicetest.StreamBuffer {
	return &devicetest.StreamBuffer{Buffer: b, StreamID: 7}
}

// windowRanks makes n in-process ranks with the given timeout, each with a
// registered window of count float32s on a devicetest engine of its own,
// and closes them when t ends.
func windowRanks(t *testing.T, n, count int, timeout time.Duration) ([]*Comm, []*devicetest.Buffer) {
	t.Helper()
	cs, err := InitLocal(n, &Config{Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range cs {
			c.Close()
		}
	})
	arenas := make([]*devicetest.Buffer, n)
	errs := make(chan error, n)
	for r := range n {
		arenas[r] = devicetest.NewBuffer(t, devicetest.NewEngine("fake"), Float32, count)
		go func() {
			_, err := cs[r].RegisterDevice(context.Background(), arenas[r])
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	return cs, arenas
}

// Every collective on StreamBuffers inside registered windows runs
// stream-ordered (flags written and waited for, no stream held, no arrival
// round), in and out of place, and gets the right result.
func TestStreamOrderedDeviceCollectives(t *testing.T) {
	const n, count = 3, 257
	engs := make([]*devicetest.Engine, n)
	arenas := make([]*devicetest.Buffer, n)
	for r := range n {
		engs[r] = devicetest.NewEngine("fake")
		arenas[r] = devicetest.NewBuffer(t, engs[r], Float32, 2*n*count)
	}
	val := func(r, i int) float32 { return float32(r*1000 + i) }
	errs := runFakeRanks(t, n, func(c *Comm) error {
		ctx := context.Background()
		r := c.Rank()
		w, err := c.RegisterDevice(ctx, arenas[r])
		if err != nil {
			return err
		}
		defer w.Deregister()
		in := arenas[r].View(0, n*count)
		out := arenas[r].View(n*count, n*count)
		fill := func(b *devicetest.Buffer, f func(i int) float32) {
			for i := range b.Float32s() {
				b.Float32s()[i] = f(i)
			}
		}
		check := func(what string, b *devicetest.Buffer, f func(i int) float32) error {
			for i, got := range b.Float32s() {
				if want := f(i); got != want {
					return fmt.Errorf("%s: element %d is %v, want %v", what, i, got, want)
				}
			}
			return nil
		}
		sum := func(i int) (s float32) {
			for p := range n {
				s += val(p, i)
			}
			return s
		}
		mine := func(i int) float32 { return val(r, i) }

		fill(in, mine)
		if err := c.AllReduce(ctx, onStream(in.View(0, count)), onStream(out.View(0, count)), Sum); err != nil {
			return err
		}
		if err := check("AllReduce", out.View(0, count), sum); err != nil {
			return err
		}
		fill(in, mine)
		if err := c.AllReduce(ctx, onStream(in.View(0, count)), onStream(in.View(0, count)), Sum); err != nil {
			return err
		}
		if err := check("AllReduce in place", in.View(0, count), sum); err != nil {
			return err
		}
		fill(in, mine)
		if err := c.AllGather(ctx, onStream(in.View(0, count)), onStream(out)); err != nil {
			return err
		}
		if err := check("AllGather", out, func(i int) float32 { return val(i/count, i%count) }); err != nil {
			return err
		}
		fill(in, mine)
		if err := c.ReduceScatter(ctx, onStream(in), onStream(out.View(0, count)), Sum); err != nil {
			return err
		}
		if err := check("ReduceScatter", out.View(0, count), func(i int) float32 { return sum(r*count + i) }); err != nil {
			return err
		}
		fill(in, mine)
		fill(out, func(int) float32 { return -1 })
		if err := c.Broadcast(ctx, onStream(in.View(0, count)), onStream(out.View(0, count)), 1); err != nil {
			return err
		}
		if err := check("Broadcast", out.View(0, count), func(i int) float32 { return val(1, i) }); err != nil {
			return err
		}
		fill(in, mine)
		fill(out, func(int) float32 { return -1 })
		if err := c.Reduce(ctx, onStream(in.View(0, count)), onStream(out.View(0, count)), Max, 2); err != nil {
			return err
		}
		if r == 2 {
			if err := check("Reduce", out.View(0, count), func(i int) float32 { return val(n-1, i) }); err != nil {
				return err
			}
		}
		fill(in, mine)
		if err := c.Gather(ctx, onStream(in.View(0, count)), onStream(out), 0); err != nil {
			return err
		}
		if r == 0 {
			if err := check("Gather", out, func(i int) float32 { return val(i/count, i%count) }); err != nil {
				return err
			}
		}
		fill(in, mine)
		if err := c.Scatter(ctx, onStream(in), onStream(out.View(0, count)), 2); err != nil {
			return err
		}
		if err := check("Scatter", out.View(0, count), func(i int) float32 { return val(2, r*count+i) }); err != nil {
			return err
		}
		fill(in, mine)
		if err := c.AllToAll(ctx, onStream(in), onStream(out)); err != nil {
			return err
		}
		// Block p of the output is block r of rank p's input.
		if err := check("AllToAll", out, func(i int) float32 { return val(i/count, r*count+i%count) }); err != nil {
			return err
		}
		// Async: queued at once, complete.
		fill(in, mine)
		if err := c.AllReduceAsync(onStream(in.View(0, count)), onStream(out.View(0, count)), Sum).Wait(ctx); err != nil {
			return err
		}
		return check("AllReduceAsync", out.View(0, count), sum)
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	for r, e := range engs {
		// 10 calls, each 2(n-1) waits and 2(n-1)+1 writes, in two batches
		// (arrival; departure and done).
		if w, wr := e.StreamOps.Waits.Load(), e.StreamOps.Writes.Load(); w != 10*2*(n-1) || wr != 10*(2*(n-1)+1) {
			t.Errorf("rank %d: %d flag waits and %d writes, want %d and %d", r, w, wr, 10*2*(n-1), 10*(2*(n-1)+1))
		}
		if b := e.StreamOps.Batches.Load(); b != 10*2 {
			t.Errorf("rank %d: %d Flags calls for 10 collectives, want 20", r, b)
		}
		if e.Waits.Load() != 0 {
			t.Errorf("rank %d: the engine's own stream was waited for %d times: a host round ran", r, e.Waits.Load())
		}
	}
}

// Calls that do not qualify take the other device paths: buffers outside
// a window, buffers not bound to a stream, and pre-multiplied sums (whose
// scalars the ranks compare at arrival).
func TestStreamOrderedOnlyInWindows(t *testing.T) {
	const n, count = 2, 64
	engs := make([]*devicetest.Engine, n)
	arenas := make([]*devicetest.Buffer, n)
	others := make([]*devicetest.Buffer, n)
	for r := range n {
		engs[r] = devicetest.NewEngine("fake")
		arenas[r] = devicetest.NewBuffer(t, engs[r], Float32, count)
		others[r] = devicetest.NewBuffer(t, engs[r], Float32, count)
	}
	errs := runFakeRanks(t, n, func(c *Comm) error {
		ctx := context.Background()
		r := c.Rank()
		w, err := c.RegisterDevice(ctx, arenas[r])
		if err != nil {
			return err
		}
		outside := onStream(others[r])
		if err := c.AllReduce(ctx, outside, outside, Sum); err != nil {
			return err
		}
		if outside.Holds.Load() != 1 {
			return fmt.Errorf("a call outside the windows held its stream %d times, want 1", outside.Holds.Load())
		}
		if err := c.AllReduce(ctx, arenas[r], arenas[r], Sum); err != nil { // not on a stream
			return err
		}
		inside := onStream(arenas[r])
		if err := c.AllReduce(ctx, inside, inside, PreMulSum(2)); err != nil {
			return err
		}
		if inside.Holds.Load() != 1 {
			return fmt.Errorf("a pre-multiplied sum held its stream %d times, want 1", inside.Holds.Load())
		}
		if err := w.Deregister(); err != nil {
			return err
		}
		if err := c.AllReduce(ctx, inside, inside, Sum); err != nil {
			return err
		}
		if inside.Holds.Load() != 2 {
			return fmt.Errorf("a call after Deregister held its stream %d times in all, want 2", inside.Holds.Load())
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
		if w := engs[r].StreamOps.Waits.Load(); w != 0 {
			t.Errorf("rank %d: %d flag waits, want none", r, w)
		}
	}
}

// plainEngine is a device engine that cannot queue on streams.
type plainEngine struct{ device.Engine }

// unshared is device memory that peers cannot map (not a PeerBuffer).
type unshared struct{ device.Buffer }

// RegisterDevice fails on every rank when one rank cannot register (a
// buffer of another size, an engine without streams, memory peers cannot
// map), naming that rank,
// and the Comm goes on working.
func TestRegisterDeviceFailsOnEveryRank(t *testing.T) {
	const n = 3
	for _, tc := range []struct {
		name string
		buf  func(t *testing.T, r int) DeviceBuffer
		bad  int // the rank that cannot register; -1: every rank sees the mismatch
		want error
	}{
		{"size", func(t *testing.T, r int) DeviceBuffer {
			return devicetest.NewBuffer(t, fakeEngine(), Float32, 64+r/2)
		}, -1, ErrMismatch},
		{"engine", func(t *testing.T, r int) DeviceBuffer {
			if r == 2 {
				return devicetest.NewBuffer(t, plainEngine{fakeEngine()}, Float32, 64)
			}
			return devicetest.NewBuffer(t, fakeEngine(), Float32, 64)
		}, 2, ErrNotSupported},
		{"unshared", func(t *testing.T, r int) DeviceBuffer {
			if r == 0 {
				return unshared{devicetest.NewBuffer(t, fakeEngine(), Float32, 64)}
			}
			return devicetest.NewBuffer(t, fakeEngine(), Float32, 64)
		}, 0, ErrNotSupported},
		{"import", func(t *testing.T, r int) DeviceBuffer {
			return devicetest.NewBuffer(t, &devicetest.Engine{EngineName: "fake", FailImport: r == 1}, Float32, 64)
		}, 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bufs := make([]DeviceBuffer, n)
			for r := range bufs {
				bufs[r] = tc.buf(t, r)
			}
			errs := runFakeRanks(t, n, func(c *Comm) error {
				w, err := c.RegisterDevice(context.Background(), bufs[c.Rank()])
				if err == nil {
					w.Deregister()
					return errors.New("RegisterDevice succeeded")
				}
				var oe *OpError
				if !errors.As(err, &oe) || oe.Op != "RegisterDevice" {
					return fmt.Errorf("not a RegisterDevice *OpError: %v", err)
				}
				// The failing rank says why; the others name it.
				switch {
				case tc.bad < 0 || tc.bad == c.Rank():
					if tc.want != nil && !errors.Is(err, tc.want) {
						return fmt.Errorf("error %v is not %v", err, tc.want)
					}
				case oe.Peer != tc.bad:
					return fmt.Errorf("error %v names peer %d, not %d", err, oe.Peer, tc.bad)
				}
				x := []float32{1}
				if err := c.AllReduce(context.Background(), Host(x), Host(x), Sum); err != nil || x[0] != n {
					return fmt.Errorf("after the failed registration: %v, %v", err, x[0])
				}
				// The flag pages went with the failure; a good
				// registration makes them again.
				eng := devicetest.NewEngine("fake")
				b := devicetest.NewBuffer(t, eng, Float32, 64)
				if w, err = c.RegisterDevice(context.Background(), b); err != nil {
					return fmt.Errorf("registering after a failure: %w", err)
				}
				defer w.Deregister()
				b.Float32s()[0] = 1
				if err := c.AllReduce(context.Background(), onStream(b), onStream(b), Sum); err != nil {
					return err
				}
				if b.Float32s()[0] != n || eng.StreamOps.Waits.Load() == 0 {
					return fmt.Errorf("after registering again: %v, %d flag waits", b.Float32s()[0], eng.StreamOps.Waits.Load())
				}
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// A rank whose stream waits for a peer that never comes is released when
// its Comm aborts: the stream goes on (here, devicetest runs the stream's
// work in the call, so the call returns) and Close does not wait.
func TestAbortReleasesTheStream(t *testing.T) {
	const n, count = 2, 16
	cs, arenas := windowRanks(t, n, count, 5*time.Second)
	done := make(chan error, 1)
	b := onStream(arenas[0])
	go func() { done <- cs[0].AllReduce(context.Background(), b, b, Sum) }()
	select {
	case err := <-done:
		t.Fatalf("the call returned (%v) while its peer never arrived", err)
	case <-time.After(100 * time.Millisecond):
	}
	start := time.Now()
	cs[0].Abort(errors.New("test: peer gone"))
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the stream still waits 5 s after the abort")
	}
	if err := cs[0].Close(); err != nil && !errors.Is(err, ErrAborted) {
		t.Logf("close: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("abort to close took %v", d)
	}
}

// A stream-ordered call that a peer never reaches fails on the Comm's
// deadline, naming that peer, though no host call waits for it: the
// watchdog reads the flag pages. (devicetest runs the stream's waits in the
// call, so here the call itself returns the error; on a GPU the call has
// returned already and Err, or the next call, reports it.)
func TestStreamOrderedDeadlineNamesTheMissingRank(t *testing.T) {
	const n, count = 3, 16
	cs, arenas := windowRanks(t, n, count, 300*time.Millisecond)
	errs := make(chan error, n)
	for r := range n - 1 {
		go func() {
			b := onStream(arenas[r])
			errs <- cs[r].AllReduce(context.Background(), b, b, Sum)
		}()
	}
	for range n - 1 {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), fmt.Sprintf("(peer rank %d)", n-1)) {
				t.Errorf("got %v, want an ErrTimeout naming peer %d", err, n-1)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no deadline 10 s into a call with a 300 ms timeout")
		}
	}
}

// A stream-ordered call allocates nothing: queueing is the whole call.
func TestStreamOrderedAllocatesNothing(t *testing.T) {
	const n, count = 2, 64
	cs, arenas := windowRanks(t, n, count, 5*time.Second)
	bufs := []*devicetest.StreamBuffer{onStream(arenas[0]), onStream(arenas[1])}
	errs := make(chan error, 1)
	const runs = 50
	go func() {
		for range runs + 2 {
			if err := cs[1].AllReduce(context.Background(), bufs[1], bufs[1], Sum); err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	call := func() {
		if err := cs[0].AllReduce(context.Background(), bufs[0], bufs[0], Sum); err != nil {
			t.Fatal(err)
		}
	}
	call() // warm up: the log line, the watchdog
	if a := testing.AllocsPerRun(runs, call); a != 0 {
		t.Errorf("%v allocations per call", a)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}
