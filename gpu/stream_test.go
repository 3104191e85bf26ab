//go:build linux && cgo

package gpu_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/gpu"
	"github.com/gccl/gccl/internal/cuda"
	"github.com/gccl/gccl/internal/cuda/devtest"
	"github.com/gccl/gccl/internal/testutil"
)

// newDelayedStream makes a stream on which the fake driver delays every
// operation by delay (microseconds, "" for none). The stream tests slow
// either the caller's stream (20 ms an operation, far longer than a call's
// own work), so that a call that does not wait for the stream's earlier
// work reads a stale input, or the devices' engines, so that a stream that
// does not wait for the call reads a stale result. (The delay is read from
// the environment when a stream is made; the lock keeps the other ranks'
// streams at theirs.)
func newDelayedStream(dev *gpu.Device, delay string) (*gpu.Stream, error) {
	slowMu.Lock()
	defer slowMu.Unlock()
	old, had := os.LookupEnv("FAKECUDA_STREAM_DELAY_US")
	os.Setenv("FAKECUDA_STREAM_DELAY_US", delay)
	defer func() {
		if had {
			os.Setenv("FAKECUDA_STREAM_DELAY_US", old)
		} else {
			os.Unsetenv("FAKECUDA_STREAM_DELAY_US")
		}
	}()
	return dev.NewStream()
}

var slowMu sync.Mutex

// streamRank is one rank's buffers for the stream tests: src holds the
// rank's data, the stream copies it into send, the call runs on send and
// recv (bound to the stream), and the stream copies recv into check.
type streamRank struct {
	dev                  *gpu.Device
	s                    *gpu.Stream
	src, send, recv, chk *gpu.Buffer
	sendS, recvS         *gpu.StreamBuffer
	host                 []byte
}

func newStreamRank(dev *gpu.Device, count int, delay string, fill func(i int) float32) (*streamRank, error) {
	sr := &streamRank{dev: dev, host: make([]byte, 4*count)}
	var err error
	if sr.s, err = newDelayedStream(dev, delay); err != nil {
		return nil, err
	}
	for _, b := range []**gpu.Buffer{&sr.src, &sr.send, &sr.recv, &sr.chk} {
		if *b, err = dev.Alloc(comm.Float32, count); err != nil {
			sr.close()
			return nil, err
		}
	}
	v := f32(sr.host)
	for i := range v {
		v[i] = fill(i)
	}
	if err = sr.src.CopyFromHost(sr.host); err == nil {
		clear(sr.host)
		err = sr.recv.CopyFromHost(sr.host) // zeros: a result read too early shows
	}
	if err == nil {
		err = sr.chk.CopyFromHost(sr.host)
	}
	if err == nil {
		sr.sendS, err = sr.send.OnStream(sr.s)
	}
	if err == nil {
		sr.recvS, err = sr.recv.OnStream(sr.s)
	}
	if err != nil {
		sr.close()
		return nil, err
	}
	return sr, nil
}

func (sr *streamRank) close() {
	for _, b := range []*gpu.Buffer{sr.src, sr.send, sr.recv, sr.chk} {
		if b != nil {
			b.Free()
		}
	}
	sr.s.Close()
}

// verify waits for the stream and checks what it copied into chk after
// the call.
func (sr *streamRank) verify(want func(i int) float32) error {
	if err := sr.s.Synchronize(); err != nil {
		return err
	}
	if err := sr.chk.CopyToHost(sr.host); err != nil {
		return err
	}
	for i, v := range f32(sr.host) {
		if v != want(i) {
			return fmt.Errorf("element %d copied by the stream after the call = %v, want %v", i, v, want(i))
		}
	}
	return nil
}

// A call on buffers bound to a stream is ordered on it both ways, blocking
// and async, on the devices and through host staging: it reads the input
// the stream produced before the call was issued, and the stream's work
// queued right after the call was issued (before its Request completed)
// reads the result.
func TestCallsOrderedOnStreams(t *testing.T) {
	t.Run("slow stream", func(t *testing.T) { testCallsOrderedOnStreams(t, "20000", "") })
	t.Run("slow devices", func(t *testing.T) { testCallsOrderedOnStreams(t, "", "20000") })
}

func testCallsOrderedOnStreams(t *testing.T, streamDelay, engineDelay string) {
	fakeDriver(t)
	t.Setenv("FAKECUDA_STREAM_DELAY_US", engineDelay) // for the engines' streams, made by gpu.Open
	const n, count = 2, 1000
	var log testutil.SyncBuffer
	cfg := &comm.Config{Logger: slog.New(slog.NewTextHandler(&log, nil))}
	errs := runRanks(t, n, cfg, func(c *comm.Comm, dev *gpu.Device) error {
		ctx := context.Background()
		r := c.Rank()
		sum := func(i int) float32 { return float32(n*(n-1)/2 + n*i) }
		for _, mode := range []string{"all-reduce async", "all-reduce blocking", "all-reduce in place async", "send/recv async"} {
			sr, err := newStreamRank(dev, count, streamDelay, func(i int) float32 { return float32(i + r) })
			if err != nil {
				return err
			}
			err = func() error {
				if err := sr.s.Copy(sr.send, sr.src); err != nil { // the input, produced on the stream
					return err
				}
				var req *comm.Request
				want, out := sum, sr.recv
				switch mode {
				case "all-reduce async":
					req = c.AllReduceAsync(sr.sendS, sr.recvS, comm.Sum)
				case "all-reduce blocking":
					if err := c.AllReduce(ctx, sr.sendS, sr.recvS, comm.Sum); err != nil {
						return err
					}
				case "all-reduce in place async":
					req = c.AllReduceAsync(sr.sendS, sr.sendS, comm.Sum)
					out = sr.send
				case "send/recv async":
					// Rank 0 sends its input to rank 1, which receives it.
					if r == 0 {
						req = c.GroupAsync(comm.SendBuffer(1, sr.sendS))
						out = sr.send
					} else {
						req = c.GroupAsync(comm.RecvBuffer(0, sr.recvS))
					}
					want = func(i int) float32 { return float32(i) }
				}
				err := sr.s.Copy(sr.chk, out) // consuming the result, queued at once
				if err == nil {
					err = sr.verify(want)
				}
				if req != nil {
					// The buffers are freed next: the call must be over.
					if werr := req.Wait(ctx); err == nil {
						err = werr
					}
				}
				if err != nil {
					return fmt.Errorf("%s: %w", mode, err)
				}
				return nil
			}()
			// Freeing device memory waits for every stream of the device,
			// as the real driver's free does, so a rank freeing while its
			// peer's call still holds a stream would wait for a call that
			// waits for it (NCCL has the same rule): free after the peers'
			// calls, and before their next ones.
			if berr := c.Barrier(ctx); err == nil {
				err = berr
			}
			sr.close()
			if berr := c.Barrier(ctx); err == nil {
				err = berr
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if got := strings.Count(log.String(), "collectives run on the devices"); got != n {
		t.Errorf("%d ranks logged the device path, want %d:\n%s", got, n, log.String())
	}
}

// A call on stream-bound buffers waits only for its streams: another
// stream of the device, blocked until after the call, does not hold it up
// (a call on unbound buffers waits for the whole device).
func TestStreamCallDoesNotWaitForOtherStreams(t *testing.T) {
	fakeDriver(t)
	// The device's first Open loads gccl's kernels, which waits for the
	// device's work, the other stream's included: opened before that stream
	// waits, and open throughout, it spares the ranks' Opens the loading.
	keep, err := gpu.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close()
	cctx := devtest.Context(t)
	other, err := cctx.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer cctx.DestroyStream(other)
	word, wp, err := cctx.AllocHostMapped(4)
	if err != nil {
		t.Fatal(err)
	}
	defer cctx.FreeHost(word)
	unblock := func() { atomic.StoreUint32((*uint32)(unsafe.Pointer(&word[0])), 1) }
	if err := cctx.WaitValue32(other, wp, 1, cuda.WaitEQ); err != nil {
		t.Fatal(err)
	}
	// The ranks report when their calls returned; freeing their buffers
	// afterwards waits for every stream, as the real driver's free does.
	called := make(chan struct{}, 2)
	done := make(chan []error, 1)
	go func() {
		done <- runRanks(t, 2, nil, func(c *comm.Comm, dev *gpu.Device) error {
			sr, err := newStreamRank(dev, 64, "", func(i int) float32 { return 1 })
			if err != nil {
				called <- struct{}{}
				return err
			}
			defer sr.close()
			err = c.AllReduce(context.Background(), sr.sendS, sr.recvS, comm.Sum)
			called <- struct{}{}
			return err
		})
	}()
	timeout := time.After(20 * time.Second)
	for range 2 {
		select {
		case <-called:
		case <-timeout:
			unblock()
			<-done
			t.Fatal("the call on stream-bound buffers waited for another stream")
		}
	}
	unblock()
	for r, err := range <-done {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// The device buffers of one call are all bound to streams or none is.
func TestStreamAndUnboundBuffersRejected(t *testing.T) {
	fakeDriver(t)
	errs := runRanks(t, 2, nil, func(c *comm.Comm, dev *gpu.Device) error {
		sr, err := newStreamRank(dev, 64, "", func(i int) float32 { return 1 })
		if err != nil {
			return err
		}
		defer sr.close()
		err = c.AllReduce(context.Background(), sr.sendS, sr.recv, comm.Sum)
		if !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), "bound to streams") {
			return fmt.Errorf("mixed buffers: %v, want ErrInvalidArgument", err)
		}
		// Nothing was left holding the stream.
		return sr.s.Synchronize()
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// Two in-process ranks on one GPU: rank 1 binds its buffers to a stream,
// rank 0 does not (each rank's buffers are all bound or all unbound, as
// required). Rank 0 cannot wait for the device's work (cuCtxSynchronize
// would wait for rank 1's held stream, which waits for this very call): the
// call fails at once with ErrNotSupported, not at the timeout.
func TestBoundAndUnboundRanksOnOneGPUFailFast(t *testing.T) {
	fakeDriver(t)
	const n, count = 2, 256
	start := time.Now()
	errs := runRanks(t, n, &comm.Config{Timeout: 20 * time.Second}, func(c *comm.Comm, dev *gpu.Device) error {
		r := c.Rank()
		x, err := dev.Alloc(comm.Float32, count)
		if err != nil {
			return err
		}
		defer x.Free()
		var buf comm.Buffer = x
		if r == 1 {
			s, err := dev.NewStream()
			if err != nil {
				return err
			}
			defer s.Close()
			if buf, err = x.OnStream(s); err != nil {
				return err
			}
			defer s.Synchronize()
		} else {
			time.Sleep(300 * time.Millisecond) // rank 1 has issued (and holds its stream) by now
		}
		return c.AllReduce(context.Background(), buf, buf, comm.Sum)
	})
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("the ranks returned after %v: waited for the timeout", el)
	}
	if !errors.Is(errs[0], comm.ErrNotSupported) {
		t.Errorf("rank 0: %v, want ErrNotSupported", errs[0])
	}
	if errs[1] == nil {
		t.Error("rank 1 succeeded although rank 0 could not run its share")
	}
}
