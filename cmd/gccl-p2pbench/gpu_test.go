package main

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gccl/gccl/internal/cuda"
)

// Without a CUDA driver -gpu fails at once, saying why.
func TestGPUWithoutDriver(t *testing.T) {
	t.Setenv("GCCL_CUDA_LIBRARY", filepath.Join(t.TempDir(), "libcuda-absent.so"))
	o, err := parseFlags([]string{"-gpu", "-b", "1M", "-e", "1M", "-n", "1"})
	if err != nil {
		t.Fatal(err)
	}
	err = runGPU(o)
	if !errors.Is(err, cuda.ErrNotSupported) || !strings.Contains(err.Error(), "-gpu needs a CUDA driver") {
		t.Fatalf("-gpu without a driver: %v", err)
	}
	t.Log(err)
	if _, err := parseFlags([]string{"-gpu", "-dev", "-1"}); err == nil {
		t.Fatal("-dev -1 accepted")
	}
}
