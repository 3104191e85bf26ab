package main

import (
	"strings"
	"testing"
	"time"

	"github.com/gccl/gccl/gpu"
)

// noDriver names a CUDA driver library that does not exist (in a build
// without cgo no library is loaded at all): either way gpu reports
// ErrNotSupported.
const noDriver = "GCCL_CUDA_LIBRARY=/nonexistent/libcuda.so.1"

// Without a driver, -M device stops before any rank exists, with one line
// that says why.
func TestDeviceMemoryWithoutDriver(t *testing.T) {
	k, v, _ := strings.Cut(noDriver, "=")
	t.Setenv(k, v)
	out, errOut, status := runMain(t, testEnvironment(), "all_reduce -g 2 -M device -b 8 -e 64")
	if status != 1 {
		t.Errorf("exit status %d, want 1", status)
	}
	if out != "" {
		t.Errorf("printed a report:\n%s", out)
	}
	if !strings.HasPrefix(errOut, "gccl-perf: -M device: ") || strings.Count(errOut, "\n") != 1 ||
		!strings.Contains(errOut, gpu.ErrNotSupported.Error()) {
		t.Errorf("stderr %q: want one line starting with -M device that quotes %q", errOut, gpu.ErrNotSupported)
	}
}

// Across processes every rank fails at once, before joining the job, so
// that none waits for the others until a timeout.
func TestDeviceMemoryWithoutDriverMultiProcess(t *testing.T) {
	res := perf(t, []string{noDriver}, "all_reduce -np 2 -M device -b 8 -e 64")
	if res.status != 1 {
		t.Errorf("exit status %d, want 1\nstderr:\n%s", res.status, res.stderr)
	}
	if res.stdout != "" {
		t.Errorf("printed a report:\n%s", res.stdout)
	}
	if !strings.Contains(res.stderr, ": -M device: "+gpu.ErrNotSupported.Error()) {
		t.Errorf("stderr does not say why -M device failed:\n%s", res.stderr)
	}
	if res.took > 20*time.Second {
		t.Errorf("took %v to fail", res.took)
	}
}
