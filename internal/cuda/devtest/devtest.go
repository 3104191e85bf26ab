// Package devtest opens CUDA devices for the tests of the packages above
// internal/cuda, on whichever driver cudatest.Driver or cudatest.Fake set
// the loader to: the fake one, or the installed one with
// GCCL_TEST_REAL_GPU=1. It is not part of cudatest because internal/cuda's
// own tests use cudatest, which therefore cannot import internal/cuda.
package devtest

import (
	"testing"

	"github.com/gccl/gccl/internal/cuda"
	"github.com/gccl/gccl/internal/cuda/cudatest"
)

// Retain loads the driver and retains the primary contexts of its first n
// devices. When t ends, after the cleanups registered later (those of
// what the test builds on the contexts), it releases the contexts and
// closes the driver. Any failure is fatal: the caller chose a driver that
// must work.
func Retain(t testing.TB, n int) (*cuda.Driver, []*cuda.Context) {
	t.Helper()
	d, err := cuda.Load()
	if err != nil {
		if cudatest.RealGPU() {
			t.Fatalf("GCCL_TEST_REAL_GPU=1 and the CUDA driver does not load: %v", err)
		}
		t.Fatalf("loading the fake CUDA driver: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	ctxs := make([]*cuda.Context, n)
	for i := range ctxs {
		ctx, err := d.Retain(i)
		if err != nil {
			t.Fatalf("device %d: %v", i, err)
		}
		t.Cleanup(func() { ctx.Release() })
		ctxs[i] = ctx
	}
	return d, ctxs
}

// Context is Retain of one device: device 0's context.
func Context(t testing.TB) *cuda.Context {
	t.Helper()
	_, ctxs := Retain(t, 1)
	return ctxs[0]
}

// Shared opens a reference to the process's shared CUDA state on the
// driver the test chose, closed when t ends, after the cleanups registered
// later.
func Shared(t testing.TB) *cuda.Shared {
	t.Helper()
	sh, err := cuda.OpenShared()
	if err != nil {
		if cudatest.RealGPU() {
			t.Fatalf("GCCL_TEST_REAL_GPU=1 and the CUDA driver does not load: %v", err)
		}
		t.Fatalf("loading the fake CUDA driver: %v", err)
	}
	t.Cleanup(func() { sh.Close() })
	return sh
}
