//go:build linux && cgo

package main

import (
	"testing"

	"github.com/gccl/gccl/internal/cuda/cudatest"
)

// TestGPUFake runs -gpu end to end against the fake CUDA driver (the
// target process inherits it): every path runs and the data is checked;
// the figures mean nothing.
func TestGPUFake(t *testing.T) {
	cudatest.Fake(t, "-UGCCL_HOSTEMU")
	o, err := parseFlags([]string{"-gpu", "-dev", "1", "-b", "1M", "-e", "5M", "-f", "4", "-n", "2", "-w", "1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := runGPU(o); err != nil {
		t.Fatal(err)
	}
}
