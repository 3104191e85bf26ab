//go:build !linux || !cgo

package topo

import "github.com/gccl/gccl/internal/errs"

// NewNVMLSource reports ErrNotSupported: NVML needs cgo on Linux.
func NewNVMLSource() (GPUSource, error) {
	return nil, errs.Errorf(errs.ErrNotSupported, "gccl was built without cgo, which NVML needs")
}
