//go:build linux && cgo

package gpu_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/gpu"
	"github.com/gccl/gccl/internal/commtest"
	"github.com/gccl/gccl/internal/testutil"
)

// unmapped is a device buffer comm cannot reach through an engine (only
// comm.DeviceBuffer's methods): its Send/Recv are staged.
type unmapped struct{ b *gpu.Buffer }

func (u unmapped) DataType() comm.DataType     { return u.b.DataType() }
func (u unmapped) Len() int                    { return u.b.Len() }
func (u unmapped) HostBytes() []byte           { return nil }
func (u unmapped) CopyToHost(h []byte) error   { return u.b.CopyToHost(h) }
func (u unmapped) CopyFromHost(h []byte) error { return u.b.CopyFromHost(h) }

// Send/Recv between device buffers copies device to device, straight
// into the receiver's buffer: no host copy on any rank, a ring, several
// messages each way between two ranks in one group (the answers of one
// direction interleave with the descriptions of the other), async, and
// every rank logs the path once. In place (a send overlapping the group's
// receive), the send is staged and the result still right.
func TestSendRecvOnDevices(t *testing.T) {
	fakeDriver(t)
	const n, count = 3, 1000
	var log testutil.SyncBuffer
	errs := runRanks(t, n, &comm.Config{Logger: slog.New(slog.NewTextHandler(&log, nil))}, func(c *comm.Comm, dev *gpu.Device) error {
		ctx := context.Background()
		r := c.Rank()
		next, prev := (r+1)%n, (r+n-1)%n
		var copies atomic.Int64
		bufs := make([]counted, 4)
		for i := range bufs {
			b, err := dev.Alloc(comm.Float32, count)
			if err != nil {
				return err
			}
			defer b.Free()
			bufs[i] = counted{b, &copies}
		}
		x, y, z, w := bufs[0], bufs[1], bufs[2], bufs[3]
		value := func(rank, msg int) func(int) float32 {
			return func(i int) float32 { return float32(10000*rank + 1000*msg + i) }
		}

		if err := setF32(x.Buffer, value(r, 0)); err != nil {
			return err
		}
		if err := onDevices(&copies, "ring", func() error {
			return c.Group(ctx, comm.SendBuffer(next, x), comm.RecvBuffer(prev, y))
		}); err != nil {
			return err
		}
		if err := checkF32("ring", y.Buffer, value(prev, 0)); err != nil {
			return err
		}

		// Two messages each way between ranks 0 and 1, in opposite
		// orders of sends and receives on the two ranks.
		if r < 2 {
			peer := 1 - r
			if err := setF32(x.Buffer, value(r, 1)); err != nil {
				return err
			}
			if err := setF32(y.Buffer, value(r, 2)); err != nil {
				return err
			}
			ops := []comm.P2P{comm.SendBuffer(peer, x), comm.SendBuffer(peer, y), comm.RecvBuffer(peer, z), comm.RecvBuffer(peer, w)}
			if r == 1 {
				ops = []comm.P2P{ops[2], ops[3], ops[0], ops[1]}
			}
			if err := onDevices(&copies, "two each way", func() error { return c.Group(ctx, ops...) }); err != nil {
				return err
			}
			if err := checkF32("first of two", z.Buffer, value(peer, 1)); err != nil {
				return err
			}
			if err := checkF32("second of two", w.Buffer, value(peer, 2)); err != nil {
				return err
			}
		}

		if err := setF32(x.Buffer, value(r, 3)); err != nil {
			return err
		}
		if err := onDevices(&copies, "async ring", func() error {
			return c.GroupAsync(comm.SendBuffer(next, x), comm.RecvBuffer(prev, y)).Wait(ctx)
		}); err != nil {
			return err
		}
		if err := checkF32("async ring", y.Buffer, value(prev, 3)); err != nil {
			return err
		}

		// In place: the send is staged before anything lands.
		if err := setF32(x.Buffer, value(r, 4)); err != nil {
			return err
		}
		if err := c.Group(ctx, comm.SendBuffer(next, x), comm.RecvBuffer(prev, x)); err != nil {
			return fmt.Errorf("in-place ring: %w", err)
		}
		return checkF32("in-place ring", x.Buffer, value(prev, 4))
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if got := strings.Count(log.String(), "Send/Recv copies straight"); got != n {
		t.Errorf("%d ranks logged the direct path, want %d:\n%s", got, n, log.String())
	}
}

// A device send matches any receive, and a device receive any send: a
// host slice, or a device buffer no engine reaches, gets the data staged
// through host memory, in one group with a direct pair.
func TestSendRecvDeviceAndHostMix(t *testing.T) {
	fakeDriver(t)
	const count = 777
	value := func(rank int) func(int) float32 { return func(i int) float32 { return float32(1000*rank + i) } }
	errs := runRanks(t, 3, nil, func(c *comm.Comm, dev *gpu.Device) error {
		ctx := context.Background()
		r := c.Rank()
		a, err := dev.Alloc(comm.Float32, count)
		if err != nil {
			return err
		}
		defer a.Free()
		b, err := dev.Alloc(comm.Float32, count)
		if err != nil {
			return err
		}
		defer b.Free()
		if err := setF32(a, value(r)); err != nil {
			return err
		}
		switch r {
		case 0:
			// Device to host and back from host, device to unmapped and
			// back from unmapped; the same receive buffer in turn.
			if err := c.Group(ctx, comm.SendBuffer(1, a), comm.RecvBuffer(1, b)); err != nil {
				return err
			}
			if err := checkF32("from host", b, value(1)); err != nil {
				return err
			}
			if err := c.Group(ctx, comm.SendBuffer(2, a), comm.RecvBuffer(2, b)); err != nil {
				return err
			}
			return checkF32("from unmapped", b, value(2))
		case 1:
			h := make([]float32, count)
			for i := range h {
				h[i] = value(1)(i)
			}
			got := make([]float32, count)
			if err := c.Group(ctx, comm.RecvFrom(0, got), comm.SendTo(0, h)); err != nil {
				return err
			}
			for i, v := range got {
				if v != value(0)(i) {
					return fmt.Errorf("host receive: element %d = %v, want %v", i, v, value(0)(i))
				}
			}
			return nil
		default:
			if err := c.Group(ctx, comm.RecvBuffer(0, unmapped{b}), comm.SendBuffer(0, unmapped{a})); err != nil {
				return err
			}
			return checkF32("unmapped receive", b, value(0))
		}
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// A device send longer than the receive fails with ErrMismatch, whether the
// receive is a device buffer (the description says the length) or a host
// slice; no rank hangs.
func TestSendRecvDeviceLengthMismatch(t *testing.T) {
	fakeDriver(t)
	for _, hostRecv := range []bool{false, true} {
		t.Run(fmt.Sprintf("host receive %v", hostRecv), func(t *testing.T) {
			errs := runRanks(t, 2, nil, func(c *comm.Comm, dev *gpu.Device) error {
				ctx := context.Background()
				if c.Rank() == 0 {
					b, err := dev.Alloc(comm.Float32, 100)
					if err != nil {
						return err
					}
					defer b.Free()
					return c.Send(ctx, b, 1)
				}
				if hostRecv {
					return comm.Recv(ctx, c, make([]float32, 50), 0)
				}
				b, err := dev.Alloc(comm.Float32, 50)
				if err != nil {
					return err
				}
				defer b.Free()
				return c.Recv(ctx, b, 0)
			})
			commtest.WantMismatch(t, errs)
		})
	}
}
