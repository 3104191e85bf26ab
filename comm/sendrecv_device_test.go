//go:build linux

package comm

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/gccl/gccl/device/devicetest"
)

// fill sets b's elements to base+i.
func fill(b *devicetest.Buffer, base float32) {
	for i := range b.Float32s() {
		b.Float32s()[i] = base + float32(i)
	}
}

// holds checks that b's elements are base+i.
func holds(b *devicetest.Buffer, what string, base float32) error {
	for i, v := range b.Float32s() {
		if v != base+float32(i) {
			return fmt.Errorf("%s: element %d = %v, want %v", what, i, v, base+float32(i))
		}
	}
	return nil
}

// Three device sends to one peer in one group, received into a device
// buffer, a host slice and a device buffer: the first and last go direct,
// the middle one is answered "send the data" and staged, all in order.
func TestDeviceSendsToMixedReceives(t *testing.T) {
	const count = 300
	var src [3]*devicetest.Buffer
	for i := range src {
		src[i] = newFakeDevBuf(t, count, fakeEngine())
		fill(src[i], float32(1000*i))
	}
	eng := fakeEngine() // its Waits count the receiver's direct copies
	dst0, dst2 := newFakeDevBuf(t, count, eng), newFakeDevBuf(t, count, eng)
	host := make([]float32, count)
	errs := runFakeRanks(t, 2, func(c *Comm) error {
		ctx := context.Background()
		if c.Rank() == 0 {
			return c.Group(ctx, SendBuffer(1, src[0]), SendBuffer(1, src[1]), SendBuffer(1, src[2]))
		}
		return c.Group(ctx, RecvBuffer(0, dst0), RecvFrom(0, host), RecvBuffer(0, dst2))
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if eng.Waits.Load() != 2 {
		t.Errorf("the receiver copied %d messages device to device, want 2", eng.Waits.Load())
	}
	for _, err := range []error{holds(dst0, "first", 0), holds(dst2, "third", 2000)} {
		if err != nil {
			t.Error(err)
		}
	}
	for i, v := range host {
		if v != float32(1000+i) {
			t.Fatalf("second, into host memory: element %d = %v, want %v", i, v, 1000+i)
		}
	}
}

// A sender whose memory has no IPC handle stages its send; the receiver's
// device buffer takes the data through host staging.
func TestDeviceSendExportFailureStages(t *testing.T) {
	const count = 100
	src := newFakeDevBuf(t, count, &devicetest.Engine{EngineName: "fake", FailExport: true})
	dst := newFakeDevBuf(t, count, fakeEngine())
	fill(src, 7)
	errs := runFakeRanks(t, 2, func(c *Comm) error {
		if c.Rank() == 0 {
			return c.Send(context.Background(), src, 1)
		}
		return c.Recv(context.Background(), dst, 0)
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if err := holds(dst, "received", 7); err != nil {
		t.Error(err)
	}
}

// A receiver that cannot map the sender's buffer fails, and the sender,
// waiting for its answer, fails too instead of hanging.
func TestDeviceRecvImportFailure(t *testing.T) {
	const count = 100
	src := newFakeDevBuf(t, count, fakeEngine())
	dst := newFakeDevBuf(t, count, &devicetest.Engine{EngineName: "fake", FailImport: true})
	errs := runFakeRanks(t, 2, func(c *Comm) error {
		if c.Rank() == 0 {
			return c.Send(context.Background(), src, 1)
		}
		return c.Recv(context.Background(), dst, 0)
	})
	if errs[1] == nil || !errors.As(errs[1], new(*OpError)) {
		t.Errorf("receiver: %v, want an *OpError for the mapping", errs[1])
	}
	if !errors.Is(errs[0], ErrPeerLost) {
		t.Errorf("sender: %v, want ErrPeerLost", errs[0])
	}
}

// A device send waiting for its answer that finds the peer's data, with no
// receive of the group to take it, fails with ErrMismatch (the ranks
// issued different operations).
func TestDeviceSendFindsUnexpectedData(t *testing.T) {
	src := newFakeDevBuf(t, 100, fakeEngine())
	errs := runFakeRanks(t, 2, func(c *Comm) error {
		if c.Rank() == 0 {
			return c.Send(context.Background(), src, 1)
		}
		return Send(context.Background(), c, make([]float32, 10), 0)
	})
	if !errors.Is(errs[0], ErrMismatch) {
		t.Errorf("rank 0: %v, want ErrMismatch", errs[0])
	}
}
