//go:build linux && cgo

package gpu_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/gpu"
)

// A device collective (a Send/Recv ring included) in steady state
// allocates nothing on the Go heap, as
// the host collectives do; on stream-bound buffers, each rank allocates one
// hold (engine.Hold, never reused, so that a stale Release cannot let a
// later call's stream run early). Rank 0 counts with testing.AllocsPerRun
// (which counts every goroutine's allocations) while the other ranks run
// the same calls in step with it.
func TestDeviceCollectivesAllocateNothing(t *testing.T) {
	fakeDriver(t)
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	const n, count, runs = 3, 3000, 20
	ctx := context.Background()
	type op func(c *comm.Comm, in, out, big comm.Buffer) error
	ops := []struct {
		name string
		f    op
	}{
		{"AllReduce", func(c *comm.Comm, in, out, _ comm.Buffer) error { return c.AllReduce(ctx, in, out, comm.Sum) }},
		{"AllReduce/in-place/avg", func(c *comm.Comm, in, _, _ comm.Buffer) error { return c.AllReduce(ctx, in, in, comm.Avg) }},
		{"ReduceScatter", func(c *comm.Comm, _, out, big comm.Buffer) error { return c.ReduceScatter(ctx, big, out, comm.Max) }},
		{"AllGather", func(c *comm.Comm, in, _, big comm.Buffer) error { return c.AllGather(ctx, in, big) }},
		{"Broadcast", func(c *comm.Comm, in, out, _ comm.Buffer) error { return c.Broadcast(ctx, in, out, 1) }},
		{"Reduce", func(c *comm.Comm, in, out, _ comm.Buffer) error { return c.Reduce(ctx, in, out, comm.Sum, 2) }},
		{"Send/Recv ring", func(c *comm.Comm, in, out, _ comm.Buffer) error {
			r := c.Rank()
			return c.Group(ctx, comm.SendBuffer((r+1)%n, in), comm.RecvBuffer((r+n-1)%n, out))
		}},
	}
	// The same calls ordered on a stream (OnStream).
	for _, o := range ops[:len(ops):len(ops)] {
		ops = append(ops, struct {
			name string
			f    op
		}{o.name + "/on a stream", o.f})
	}
	onStream := func(name string) bool { return strings.HasSuffix(name, "/on a stream") }
	allocs := make([]float64, len(ops))
	errs := runRanks(t, n, nil, func(c *comm.Comm, dev *gpu.Device) error {
		s, err := dev.NewStream()
		if err != nil {
			return err
		}
		defer s.Close()
		var bufs, bound [3]comm.Buffer
		for i, size := range []int{count, count, n * count} {
			b, err := dev.Alloc(comm.Float32, size)
			if err != nil {
				return err
			}
			defer b.Free()
			if bound[i], err = b.OnStream(s); err != nil {
				return err
			}
			bufs[i] = b
		}
		for i, o := range ops {
			var err error
			b := &bufs
			if onStream(o.name) {
				b = &bound
			}
			call := func() {
				if e := o.f(c, b[0], b[1], b[2]); e != nil && err == nil {
					err = fmt.Errorf("%s: %w", o.name, e)
				}
			}
			call() // warm up: the engine's kernels, the peers' mappings
			// The warm-up's garbage is collected now, not inside the count:
			// a collection empties the runtime's caches of what a blocked
			// goroutine allocates (sudogs), and refilling them would count.
			if err := c.Barrier(ctx); err != nil {
				return err
			}
			if c.Rank() == 0 {
				runtime.GC()
			}
			if err := c.Barrier(ctx); err != nil {
				return err
			}
			call() // refills those caches
			if c.Rank() == 0 {
				allocs[i] = testing.AllocsPerRun(runs, call) // runs it runs+1 times
			} else {
				for range runs + 1 {
					call()
				}
			}
			if err != nil {
				return err
			}
			// No rank starts the next op's warm-up inside rank 0's count.
			if err := c.Barrier(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for i, o := range ops {
		limit := 0.0
		if onStream(o.name) {
			limit = n // a hold per rank
		}
		if allocs[i] > limit {
			t.Errorf("%s: %v allocations per call, want at most %v", o.name, allocs[i], limit)
		}
	}
}
