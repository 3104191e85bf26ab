//go:build linux

package comm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gccl/gccl/device/devicetest"
)

// fakeEngine is a devicetest engine: "device" memory is host memory, the
// work runs at once.
func fakeEngine() *devicetest.Engine { return devicetest.NewEngine("fake") }

// newFakeDevBuf maps count float32 elements of "device" memory on eng.
func newFakeDevBuf(t *testing.T, count int, eng DeviceEngine) *devicetest.Buffer {
	return devicetest.NewBuffer(t, eng, Float32, count)
}

// runFakeRanks runs f on n in-process ranks and returns their errors.
func runFakeRanks(t *testing.T, n int, f func(c *Comm) error) []error {
	t.Helper()
	cs, err := InitLocal(n, &Config{Timeout: 5 * time.Second})
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
			errs[c.Rank()] = f(c)
		}()
	}
	wg.Wait()
	return errs
}

// A rank that cannot map its peers' buffers fails the call, and so must
// every rank; it must not return while its peers still read and write its
// buffers (its caller may free or reuse them at once).
func TestDeviceImportFailureFailsEveryRank(t *testing.T) {
	const n, count = 3, 64
	var after [n]int64
	var bufs [n]*devicetest.Buffer
	var engs [n]*devicetest.Engine
	waits := func() (w int64) { // device work finished, on every rank
		for _, e := range engs {
			w += e.Waits.Load()
		}
		return w
	}
	for r := range bufs {
		engs[r] = &devicetest.Engine{EngineName: "fake", FailImport: r == 1, WaitDelay: 100 * time.Millisecond}
		bufs[r] = newFakeDevBuf(t, count, engs[r])
	}
	errs := runFakeRanks(t, n, func(c *Comm) error {
		r := c.Rank()
		x := bufs[r]
		for i := range x.Float32s() {
			x.Float32s()[i] = float32(r + i)
		}
		err := c.AllReduce(context.Background(), x, x, Sum)
		after[r] = waits()
		return err
	})
	for r, err := range errs {
		if err == nil {
			t.Errorf("rank %d succeeded, its peer 1 could not run its share", r)
		}
		var oe *OpError
		if !errors.As(err, &oe) {
			t.Errorf("rank %d: %v, not an *OpError", r, err)
		}
	}
	if after[1] != n-1 {
		t.Errorf("rank 1 returned when %d of its %d peers had finished their device work", after[1], n-1)
	}
}

// Device memory that cannot be exported (cuIpcGetMemHandle refuses memory
// from cuMemCreate or stream-ordered pools, as PyTorch's allocator may
// hand out) is still memory the host path can stage: the call succeeds
// through host staging on every rank instead of aborting the Comm.
func TestDeviceExportFailureStages(t *testing.T) {
	const n, count = 3, 100
	var bufs [n]*devicetest.Buffer
	for r := range bufs {
		bufs[r] = newFakeDevBuf(t, count, &devicetest.Engine{EngineName: "fake", FailExport: r == 2})
	}
	errs := runFakeRanks(t, n, func(c *Comm) error {
		r := c.Rank()
		x := bufs[r]
		for i := range x.Float32s() {
			x.Float32s()[i] = float32(r + i)
		}
		if err := c.AllReduce(context.Background(), x, x, Sum); err != nil {
			return err
		}
		for i, v := range x.Float32s() {
			if want := float32(n*(n-1)/2 + n*i); v != want {
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
