//go:build !linux || !cgo

package cufile

import (
	"fmt"

	"github.com/gccl/gccl/internal/cuda"
)

// Library is the loaded library; without cgo on Linux there is none.
type Library struct{}

// Load reports that cuFile needs cgo on Linux.
func Load() (*Library, error) {
	return nil, fmt.Errorf("%w: cuFile needs cgo on Linux", cuda.ErrNotSupported)
}

func (l *Library) Close() error                 { return cuda.ErrNotSupported }
func (l *Library) Register(int) (Handle, error) { return 0, cuda.ErrNotSupported }
func (l *Library) Deregister(Handle)            {}
func (l *Library) Read(Handle, cuda.DevicePtr, int, int64) (int, error) {
	return 0, cuda.ErrNotSupported
}
func (l *Library) Write(Handle, cuda.DevicePtr, int, int64) (int, error) {
	return 0, cuda.ErrNotSupported
}
