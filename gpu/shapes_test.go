//go:build linux && cgo

package gpu_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"unsafe"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/gpu"
)

// devF32 sets or reads a float32 device buffer through the host.
func setF32(b *gpu.Buffer, f func(i int) float32) error {
	h := make([]float32, b.Len())
	for i := range h {
		h[i] = f(i)
	}
	return b.CopyFromHost(unsafe.Slice((*byte)(unsafe.Pointer(&h[0])), 4*len(h)))
}

func checkF32(what string, b *gpu.Buffer, f func(i int) float32) error {
	h := make([]float32, b.Len())
	if err := b.CopyToHost(unsafe.Slice((*byte)(unsafe.Pointer(&h[0])), 4*len(h))); err != nil {
		return err
	}
	for i, v := range h {
		if v != f(i) {
			return fmt.Errorf("%s: element %d = %v, want %v", what, i, v, f(i))
		}
	}
	return nil
}

// Sub-buffers (Wrap at an offset of an allocation), in-place
// reduce-scatter and all-gather (one buffer the rank's block of the other),
// roots with absent buffers elsewhere, and several async calls in flight,
// on 3 ranks (device path) and 9 (reductions through host staging).
func TestDeviceShapes(t *testing.T) {
	fakeDriver(t)
	for _, n := range []int{3, 9} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			errs := runRanks(t, n, nil, func(c *comm.Comm, dev *gpu.Device) error {
				return reviewShapes(c, dev)
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

func reviewShapes(c *comm.Comm, dev *gpu.Device) error {
	ctx := context.Background()
	n, r := c.Size(), c.Rank()
	const blk = 37
	big, err := dev.Alloc(comm.Float32, n*blk+11)
	if err != nil {
		return err
	}
	defer big.Free()
	// in: n*blk elements at offset 3 of big; out: its block r.
	in, err := dev.Wrap(big.Ptr()+3*4, comm.Float32, n*blk)
	if err != nil {
		return err
	}
	out, err := dev.Wrap(in.Ptr()+uintptr(4*r*blk), comm.Float32, blk)
	if err != nil {
		return err
	}
	if err := setF32(in, func(i int) float32 { return float32(r*1000 + i) }); err != nil {
		return err
	}
	if err := c.ReduceScatter(ctx, in, out, comm.Sum); err != nil {
		return fmt.Errorf("in-place ReduceScatter: %w", err)
	}
	if err := checkF32("in-place ReduceScatter", out, func(i int) float32 {
		s := float32(0)
		for p := 0; p < n; p++ {
			s += float32(p*1000 + r*blk + i)
		}
		return s
	}); err != nil {
		return err
	}
	// In-place all-gather: in is block r of out.
	agIn, err := dev.Wrap(in.Ptr()+uintptr(4*r*blk), comm.Float32, blk)
	if err != nil {
		return err
	}
	if err := setF32(agIn, func(i int) float32 { return float32(r*100 + i) }); err != nil {
		return err
	}
	if err := c.AllGather(ctx, agIn, in); err != nil {
		return fmt.Errorf("in-place AllGather: %w", err)
	}
	if err := checkF32("in-place AllGather", in, func(i int) float32 { return float32(i/blk*100 + i%blk) }); err != nil {
		return err
	}
	// Broadcast from the last rank; the others pass no send buffer.
	x, err := dev.Alloc(comm.Float32, 100)
	if err != nil {
		return err
	}
	defer x.Free()
	y, err := dev.Alloc(comm.Float32, 100)
	if err != nil {
		return err
	}
	defer y.Free()
	root := n - 1
	if err := setF32(x, func(i int) float32 { return float32(r + i) }); err != nil {
		return err
	}
	var send comm.Buffer
	if r == root {
		send = x
	}
	if err := c.Broadcast(ctx, send, y, root); err != nil {
		return fmt.Errorf("Broadcast: %w", err)
	}
	if err := checkF32("Broadcast", y, func(i int) float32 { return float32(root + i) }); err != nil {
		return err
	}
	// Reduce (Max) to rank 1; the others pass no receive buffer.
	var recv comm.Buffer
	if r == 1 {
		recv = y
	}
	if err := c.Reduce(ctx, x, recv, comm.Max, 1); err != nil {
		return fmt.Errorf("Reduce: %w", err)
	}
	if r == 1 {
		if err := checkF32("Reduce", y, func(i int) float32 { return float32(n - 1 + i) }); err != nil {
			return err
		}
	}
	// Two async all-reduces in flight.
	r1 := c.AllReduceAsync(x, y, comm.Sum)
	r2 := c.AllReduceAsync(x, x, comm.Min)
	if err := errors.Join(r1.Wait(ctx), r2.Wait(ctx)); err != nil {
		return fmt.Errorf("async: %w", err)
	}
	if err := checkF32("async AllReduce", y, func(i int) float32 { return float32(n*(n-1)/2 + n*i) }); err != nil {
		return err
	}
	return checkF32("async in-place AllReduce", x, func(i int) float32 { return float32(i) })
}
