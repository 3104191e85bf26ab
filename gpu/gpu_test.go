//go:build linux && cgo

package gpu_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/gpu"
	"github.com/gccl/gccl/internal/commtest"
	"github.com/gccl/gccl/internal/cuda/cudatest"
	"github.com/gccl/gccl/internal/cuda/devtest"
	"github.com/gccl/gccl/internal/testutil"
)

// fakeDriver makes the driver loader use internal/cuda's fake driver
// library (device memory is host memory there): the paths above the driver
// run for real, the GPU does not exist.
// With GCCL_TEST_REAL_GPU=1 the tests run on the installed driver and GPU.
func fakeDriver(t *testing.T) { cudatest.Driver(t) }

func TestOpenWithoutDriver(t *testing.T) {
	t.Setenv("GCCL_CUDA_LIBRARY", "")
	d, err := gpu.Open(0)
	if err == nil {
		d.Close()
		t.Skip("a CUDA driver is installed here")
	}
	if !errors.Is(err, gpu.ErrNotSupported) {
		t.Fatalf("Open without a driver: %v", err)
	}
}

// A driver with no GPU (cuInit fails) is not supported either, so that a
// program can fall back to host memory on such a machine.
func TestOpenWithoutDevice(t *testing.T) {
	cudatest.Fake(t)
	t.Setenv("FAKECUDA_NO_DEVICE", "1")
	d, err := gpu.Open(0)
	if err == nil {
		d.Close()
		t.Fatal("Open succeeded on a driver without devices")
	}
	if !errors.Is(err, gpu.ErrNotSupported) || !strings.Contains(err.Error(), "CUDA_ERROR_NO_DEVICE") {
		t.Fatalf("Open without a device: %v, want ErrNotSupported naming CUDA_ERROR_NO_DEVICE", err)
	}
}

func f32(b []byte) []float32 { return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4) }

// Collectives and Send/Recv on device buffers across three in-process ranks:
// in place, out of place, async, a Reduce whose non-roots' receive buffers
// must stay as they were (all on the devices), and a ring of Send/Recv
// (device to device).
func TestCollectivesOnDeviceBuffers(t *testing.T) {
	fakeDriver(t)
	const n, count = 3, 1000
	var log testutil.SyncBuffer
	errs := runRanks(t, n, &comm.Config{Logger: slog.New(slog.NewTextHandler(&log, nil))}, func(c *comm.Comm, dev *gpu.Device) error {
		return rankWork(c, dev, count)
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	// Every rank took the device path (and said so once).
	if got := strings.Count(log.String(), "collectives run on the devices"); got != n {
		t.Errorf("%d ranks logged the device path, want %d:\n%s", got, n, log.String())
	}
}

// runRanks runs f on n in-process ranks configured by cfg (nil: defaults,
// with a 10 s timeout), each with its own Device, and
// returns their errors.
func runRanks(t *testing.T, n int, cfg *comm.Config, f func(c *comm.Comm, dev *gpu.Device) error) []error {
	t.Helper()
	if cfg == nil {
		cfg = &comm.Config{}
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	cs, err := comm.InitLocal(n, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dev, err := gpu.Open(0)
			if err != nil {
				errs[c.Rank()] = err
				return
			}
			defer dev.Close()
			errs[c.Rank()] = f(c, dev)
		}()
	}
	wg.Wait()
	return errs
}

// A rank passing host buffers while its peers pass device buffers fails
// the call on every rank, with ErrMismatch where the mismatch is seen.
func TestDeviceAndHostBuffersMismatch(t *testing.T) {
	fakeDriver(t)
	errs := runRanks(t, 3, nil, func(c *comm.Comm, dev *gpu.Device) error {
		if c.Rank() == 0 {
			h := make([]float32, 4096)
			return comm.AllReduce(context.Background(), c, h, h, comm.Sum)
		}
		b, err := dev.Alloc(comm.Float32, 4096)
		if err != nil {
			return err
		}
		defer b.Free()
		return c.AllReduce(context.Background(), b, b, comm.Sum)
	})
	commtest.WantMismatch(t, errs)
}

// Different pre-multipliers on different ranks: the kernels take one, so
// every rank agrees at arrival to run the call through host staging, and
// the result is still right.
func TestDevicePreMulSumPerRankScalars(t *testing.T) {
	fakeDriver(t)
	const n, count = 3, 777
	errs := runRanks(t, n, nil, func(c *comm.Comm, dev *gpu.Device) error {
		r := c.Rank()
		b, err := dev.Alloc(comm.Float64, count)
		if err != nil {
			return err
		}
		defer b.Free()
		host := make([]float64, count)
		for i := range host {
			host[i] = float64(i + r)
		}
		if err := b.CopyFromHost(unsafe.Slice((*byte)(unsafe.Pointer(&host[0])), 8*count)); err != nil {
			return err
		}
		if err := c.AllReduce(context.Background(), b, b, comm.PreMulSum(float64(r+1))); err != nil {
			return err
		}
		if err := b.CopyToHost(unsafe.Slice((*byte)(unsafe.Pointer(&host[0])), 8*count)); err != nil {
			return err
		}
		for i, v := range host {
			want := 0.0
			for p := 0; p < n; p++ {
				want += float64(p+1) * float64(i+p)
			}
			if v != want {
				return fmt.Errorf("element %d = %v, want %v", i, v, want)
			}
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

func rankWork(c *comm.Comm, dev *gpu.Device, count int) error {
	ctx := context.Background()
	n, r := c.Size(), c.Rank()
	alloc := func() (*gpu.Buffer, error) { return dev.Alloc(comm.Float32, count) }
	x, err := alloc()
	if err != nil {
		return err
	}
	defer x.Free()
	y, err := alloc()
	if err != nil {
		return err
	}
	defer y.Free()
	host := make([]byte, 4*count)
	set := func(b *gpu.Buffer, f func(i int) float32) error {
		v := f32(host)
		for i := range v {
			v[i] = f(i)
		}
		return b.CopyFromHost(host)
	}
	check := func(what string, b *gpu.Buffer, f func(i int) float32) error {
		if err := b.CopyToHost(host); err != nil {
			return err
		}
		for i, v := range f32(host) {
			if v != f(i) {
				return fmt.Errorf("%s: element %d = %v, want %v", what, i, v, f(i))
			}
		}
		return nil
	}
	sum := func(i int) float32 { return float32(n*(n-1)/2 + n*i) } // sum over ranks of r+i

	// In place.
	if err := set(x, func(i int) float32 { return float32(r + i) }); err != nil {
		return err
	}
	if err := c.AllReduce(ctx, x, x, comm.Sum); err != nil {
		return err
	}
	if err := check("in-place AllReduce", x, sum); err != nil {
		return err
	}
	// Out of place, async.
	if err := set(x, func(i int) float32 { return float32(r + i) }); err != nil {
		return err
	}
	if err := c.AllReduceAsync(x, y, comm.Sum).Wait(ctx); err != nil {
		return err
	}
	if err := check("async AllReduce", y, sum); err != nil {
		return err
	}
	if err := check("AllReduce's send buffer", x, func(i int) float32 { return float32(r + i) }); err != nil {
		return err
	}
	// Reduce to rank 1: the others' receive buffers keep their contents.
	if err := set(y, func(i int) float32 { return -1 }); err != nil {
		return err
	}
	if err := c.Reduce(ctx, x, y, comm.Sum, 1); err != nil {
		return err
	}
	want := sum
	if r != 1 {
		want = func(int) float32 { return -1 }
	}
	if err := check("Reduce", y, want); err != nil {
		return err
	}
	// A ring of Send/Recv on device buffers.
	if err := set(x, func(i int) float32 { return float32(100*r + i) }); err != nil {
		return err
	}
	next, prev := (r+1)%n, (r+n-1)%n
	if err := c.Group(ctx, comm.SendBuffer(next, x), comm.RecvBuffer(prev, y)); err != nil {
		return err
	}
	return check("Send/Recv", y, func(i int) float32 { return float32(100*prev + i) })
}

// Wrap takes only memory the driver knows as the device's, inside one
// allocation; anything else fails with ErrInvalidArgument at Wrap, before a
// kernel could touch a bad address.
func TestWrapChecksThePointer(t *testing.T) {
	fakeDriver(t)
	dev := openDevice(t, 0)
	b := alloc(t, dev, comm.Float32, 100)

	// A sub-range of an allocation, as another framework's tensor view.
	w, err := dev.Wrap(b.Ptr()+40, comm.Float32, 90)
	if err != nil {
		t.Fatalf("Wrap of the last 90 elements: %v", err)
	}
	if err := w.CopyFromHost(make([]byte, 360)); err != nil {
		t.Fatal(err)
	}

	host := make([]byte, 64)
	pinned := pinnedHost(t, 64)
	bad := []struct {
		name  string
		ptr   uintptr
		dt    comm.DataType
		count int
		why   string
	}{
		{"no elements", b.Ptr(), comm.Float32, 0, "0 float32 elements"},
		{"unknown type", b.Ptr(), comm.DataType(99), 1, "elements"},
		{"past the end", b.Ptr() + 40, comm.Float32, 91, "past the end of its allocation"},
		{"Go memory", uintptr(unsafe.Pointer(&host[0])), comm.Uint8, 64, "not memory CUDA allocated"},
		{"null", 0, comm.Uint8, 1, "not memory CUDA allocated"},
		{"pinned host memory", uintptr(unsafe.Pointer(&pinned[0])), comm.Uint8, 64, "pinned host memory"},
	}
	for _, tc := range bad {
		if _, err := dev.Wrap(tc.ptr, tc.dt, tc.count); !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("Wrap of %s: %v, want ErrInvalidArgument saying %q", tc.name, err, tc.why)
		}
	}

	// Another device's memory (the fake has two; an H100 machine has one).
	dev1, err := gpu.Open(1)
	if err != nil {
		t.Logf("no second device: %v", err)
		return
	}
	defer dev1.Close()
	if _, err := dev1.Wrap(b.Ptr(), comm.Float32, 100); !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), "memory of device 0, not of device 1") {
		t.Errorf("Wrap of device 0's memory on device 1: %v", err)
	}
}

// openDevice opens device ordinal, closed when t ends.
func openDevice(t *testing.T, ordinal int) *gpu.Device {
	t.Helper()
	dev, err := gpu.Open(ordinal)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

// alloc allocates count elements of dt on dev, freed when t ends.
func alloc(t *testing.T, dev *gpu.Device, dt comm.DataType, count int) *gpu.Buffer {
	t.Helper()
	b, err := dev.Alloc(dt, count)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free() })
	return b
}

// pinnedHost allocates n bytes of pinned host memory, freed when t ends.
func pinnedHost(t *testing.T, n int) []byte {
	t.Helper()
	ctx := devtest.Context(t)
	h, err := ctx.AllocHost(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.FreeHost(h) })
	return h
}

// A View is a range of its buffer: its copies touch only that range, and
// ranges outside the buffer are refused.
func TestView(t *testing.T) {
	fakeDriver(t)
	b := alloc(t, openDevice(t, 0), comm.Uint8, 64)
	v, err := b.View(8, comm.Float32, 4) // bytes 8..23
	if err != nil {
		t.Fatal(err)
	}
	if v.Ptr() != b.Ptr()+8 || v.Len() != 4 || v.DataType() != comm.Float32 {
		t.Fatalf("view at %#x of %d %v; want %#x, 4 float32", v.Ptr(), v.Len(), v.DataType(), b.Ptr()+8)
	}
	if err := b.CopyFromHost(make([]byte, 64)); err != nil {
		t.Fatal(err)
	}
	if err := v.CopyFromHost(bytes.Repeat([]byte{7}, 16)); err != nil {
		t.Fatal(err)
	}
	if err := v.Free(); err != nil { // a view's Free leaves the memory alone
		t.Fatal(err)
	}
	got := make([]byte, 64)
	if err := b.CopyToHost(got); err != nil {
		t.Fatal(err)
	}
	want := append(append(make([]byte, 8), bytes.Repeat([]byte{7}, 16)...), make([]byte, 40)...)
	if !bytes.Equal(got, want) {
		t.Fatalf("buffer after writing its view: %v", got)
	}
	if e, err := b.View(64, comm.Uint8, 0); err != nil || e.Len() != 0 {
		t.Errorf("empty view at the end: %v", err)
	}
	for _, bad := range []struct {
		off, count int
		dt         comm.DataType
	}{{-1, 1, comm.Uint8}, {0, 65, comm.Uint8}, {60, 2, comm.Float32}, {65, 0, comm.Uint8}, {0, -1, comm.Uint8}, {0, 1, comm.DataType(99)}} {
		if _, err := b.View(bad.off, bad.dt, bad.count); !errors.Is(err, comm.ErrInvalidArgument) {
			t.Errorf("View(%d, %v, %d): %v, want ErrInvalidArgument", bad.off, bad.dt, bad.count, err)
		}
	}
	b.Free()
	if _, err := b.View(0, comm.Uint8, 1); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Errorf("View of a freed buffer: %v", err)
	}
}

// gpu.go: "A collective waits for all work queued in the device's context
// before it starts (the inputs are complete)". Unbound buffers whose call
// goes through host staging (here: an in-place all-to-all) must see the
// copy queued on another stream of the device before the call.
func TestStagedCallWaitsForDeviceWork(t *testing.T) {
	fakeDriver(t)
	const n, count = 2, 64
	errs := runRanks(t, n, nil, func(c *comm.Comm, dev *gpu.Device) error {
		r := c.Rank()
		s, err := newDelayedStream(dev, "20000")
		if err != nil {
			return err
		}
		defer s.Close()
		src, err := dev.Alloc(comm.Float32, count)
		if err != nil {
			return err
		}
		defer src.Free()
		x, err := dev.Alloc(comm.Float32, count)
		if err != nil {
			return err
		}
		defer x.Free()
		if err := setF32(src, func(i int) float32 { return float32(100*r + i + 1) }); err != nil {
			return err
		}
		if err := setF32(x, func(i int) float32 { return 0 }); err != nil {
			return err
		}
		if err := s.Copy(x, src); err != nil { // queued, 20 ms late
			return err
		}
		if err := c.AllToAll(context.Background(), x, x); err != nil {
			return err
		}
		blk := count / n
		return checkF32(fmt.Sprintf("rank %d in-place AllToAll", r), x, func(i int) float32 {
			p, j := i/blk, i%blk
			return float32(100*p + r*blk + j + 1)
		})
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// Element counts whose byte size overflows must be refused, not wrap to a
// tiny allocation (Alloc) or a tiny range check (Wrap).
func TestSizeOverflow(t *testing.T) {
	fakeDriver(t)
	dev := openDevice(t, 0)
	if b, err := dev.Alloc(comm.Float32, 1<<62+1); err == nil {
		t.Errorf("Alloc of 2^62+1 float32 (2^64+4 bytes) succeeded: Len %d, %d bytes actually allocated", b.Len(), b.Len()*4)
		b.Free()
	}
	base := alloc(t, dev, comm.Float64, 1)
	if w, err := dev.Wrap(base.Ptr(), comm.Float64, 1<<61+1); err == nil {
		t.Errorf("Wrap of 2^61+1 float64 over an 8-byte allocation succeeded: Len %d", w.Len())
		if v, err := w.View(1<<40, comm.Uint8, 1); err == nil {
			t.Errorf("and a View 1 TiB past that 8-byte allocation succeeded: %#x (alloc %#x)", v.Ptr(), base.Ptr())
		}
	}
}

// Closing a Device twice (an explicit Close plus a deferred one) does
// nothing the second time, and its buffers' and streams' calls after Close
// fail with ErrClosed instead of calling the unloaded driver.
func TestCloseTwiceAndUseAfterClose(t *testing.T) {
	fakeDriver(t)
	dev, err := gpu.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := dev.Alloc(comm.Float32, 4)
	if err != nil {
		t.Fatal(err)
	}
	s, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	if err := dev.Close(); err != nil {
		t.Errorf("second Close: %v, want nil", err)
	}
	if err := b.Free(); !errors.Is(err, gpu.ErrClosed) {
		t.Errorf("Free after Close: %v, want ErrClosed", err)
	}
	if err := s.Close(); !errors.Is(err, gpu.ErrClosed) {
		t.Errorf("Stream.Close after Close: %v, want ErrClosed", err)
	}
	if _, err := dev.Alloc(comm.Float32, 4); !errors.Is(err, gpu.ErrClosed) {
		t.Errorf("Alloc after Close: %v, want ErrClosed", err)
	}
	if err := b.CopyToHost(make([]byte, 16)); !errors.Is(err, gpu.ErrClosed) {
		t.Errorf("CopyToHost after Close: %v, want ErrClosed", err)
	}
}

// Two ranks of one process on one GPU have two Devices (two engines, one
// context). Rank B's call holds its stream until the call completes on
// every rank, rank A among them. Rank A's Import, dropping a stale mapping
// of a third process's freed buffer, must not close it while that hold
// blocks the device (engine.go defers closes only for its own holds):
// otherwise A never reaches the call's end, and B's hold is never released.
func TestCrossEngineHoldDefersImportClose(t *testing.T) {
	cudatest.Fake(t)
	tid := otherTID(t)
	devA, devB := openDevice(t, 0), openDevice(t, 0)
	const size = 4096
	a := alloc(t, devA, comm.Uint8, size)
	engA := a.Engine()
	desc, err := engA.AppendExport(nil, a.Ptr(), size)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := engA.Import(foreign(desc, tid, 0), size); err != nil { // the peer's buffer, generation 0
		t.Fatal(err)
	}
	s, err := devB.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	bb := alloc(t, devB, comm.Uint8, size)
	bound, err := bb.OnStream(s)
	if err != nil {
		t.Fatal(err)
	}
	hold, err := bound.HoldStream() // rank B's call, in flight
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { // rank A's call: the peer reallocated its buffer (generation 1)
		_, err := engA.Import(foreign(desc, tid, 1), size)
		done <- err
	}()
	select {
	case err := <-done:
		hold.Release()
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Second):
		hold.Release() // only what unblocks it; in a job this waits for A itself
		<-done
		t.Fatal("engine A's Import blocked for 3 s on engine B's stream hold (closing the stale mapping synchronizes the device): a deadlock in a job, where B's hold is released only after A finishes the call")
	}
}
