//go:build linux && cgo

package gpu_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/gpu"
)

// counted is a gpu.Buffer that counts its host copies: comm stages a
// call's device buffers through host memory with them, and a call on the
// devices makes none.
type counted struct {
	*gpu.Buffer
	copies *atomic.Int64
}

func (b counted) CopyToHost(h []byte) error   { b.copies.Add(1); return b.Buffer.CopyToHost(h) }
func (b counted) CopyFromHost(h []byte) error { b.copies.Add(1); return b.Buffer.CopyFromHost(h) }

// onDevices runs call and fails if it made any host copy of a counted
// buffer sharing copies.
func onDevices(copies *atomic.Int64, what string, call func() error) error {
	before := copies.Load()
	if err := call(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if copies.Load() != before {
		return fmt.Errorf("%s went through host staging (%d host copies)", what, copies.Load()-before)
	}
	return nil
}

// All-to-all, gather and scatter of device buffers on one host run on the
// devices (copy engines into the peers' mapped buffers): right results, no
// host copy. Gather and scatter pass no buffer where a rank has none, and
// in place at the root; an in-place all-to-all goes through host staging
// on every rank, and is right too.
func TestAllToAllGatherScatterOnDevices(t *testing.T) {
	fakeDriver(t)
	const n, blk = 3, 100
	errs := runRanks(t, n, nil, func(c *comm.Comm, dev *gpu.Device) error {
		ctx := context.Background()
		r := c.Rank()
		var copies atomic.Int64 // this rank's
		newBuffer := func(count int) (counted, error) {
			b, err := dev.Alloc(comm.Float32, count)
			return counted{b, &copies}, err
		}
		in, err := newBuffer(n * blk)
		if err != nil {
			return err
		}
		defer in.Free()
		out, err := newBuffer(n * blk)
		if err != nil {
			return err
		}
		defer out.Free()
		mine := func(i int) float32 { return float32(r*1000 + i) }

		if err := setF32(in.Buffer, mine); err != nil {
			return err
		}
		if err := onDevices(&copies, "AllToAll", func() error { return c.AllToAll(ctx, in, out) }); err != nil {
			return err
		}
		// Block p of the output is block r of rank p's input.
		if err := checkF32("AllToAll", out.Buffer, func(i int) float32 { return float32(i/blk*1000 + r*blk + i%blk) }); err != nil {
			return err
		}

		const root = 1
		small, err := in.View(0, comm.Float32, blk)
		if err != nil {
			return err
		}
		send := comm.Buffer(counted{small, &copies})
		var recv comm.Buffer
		if r == root {
			recv = out
			// In place at the root: its input is its own block of the output.
			v, err := out.View(root*blk*4, comm.Float32, blk)
			if err != nil {
				return err
			}
			send = counted{v, &copies}
			if err := setF32(v, mine); err != nil {
				return err
			}
		}
		if err := onDevices(&copies, "Gather", func() error { return c.Gather(ctx, send, recv, root) }); err != nil {
			return err
		}
		if r == root {
			if err := checkF32("Gather", out.Buffer, func(i int) float32 { return float32(i/blk*1000 + i%blk) }); err != nil {
				return err
			}
		}

		const scatterRoot = 2
		send, recv = nil, counted{small, &copies}
		if r == scatterRoot {
			send = out // holds the gathered values on rank 1 only: set it
			if err := setF32(out.Buffer, func(i int) float32 { return float32(7 * i) }); err != nil {
				return err
			}
		}
		if err := onDevices(&copies, "Scatter", func() error { return c.Scatter(ctx, send, recv, scatterRoot) }); err != nil {
			return err
		}
		if err := checkF32("Scatter", small, func(i int) float32 { return float32(7 * (r*blk + i)) }); err != nil {
			return err
		}

		// In place, all-to-all needs host staging (a rank would overwrite
		// blocks its peer has not sent yet); every rank agrees to it.
		if err := setF32(in.Buffer, mine); err != nil {
			return err
		}
		before := copies.Load()
		if err := c.AllToAll(ctx, in, in); err != nil {
			return fmt.Errorf("in-place AllToAll: %w", err)
		}
		if copies.Load() == before {
			return fmt.Errorf("in-place AllToAll made no host copy")
		}
		return checkF32("in-place AllToAll", in.Buffer, func(i int) float32 { return float32(i/blk*1000 + r*blk + i%blk) })
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
