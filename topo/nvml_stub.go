//go:build !linux || !cgo

package topo

import "errors"

func newNVMLSource() (GPUSource, error) {
	return nil, errors.New("gccl was built without cgo, which NVML needs")
}
