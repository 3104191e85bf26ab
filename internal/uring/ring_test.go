package uring

import (
	"errors"
	"runtime"
	"testing"

	"github.com/gccl/gccl/internal/errs"
)

func TestNotSupportedOffLinux(t *testing.T) {
	if runtime.GOOS == "linux" {
		t.Skip("Linux has io_uring")
	}
	if _, err := New(4); !errors.Is(err, errs.ErrNotSupported) {
		t.Fatalf("New off Linux: %v", err)
	}
}
