//go:build !linux || !cgo

package cuda

import (
	"errors"
	"fmt"
	"runtime"
)

// DefaultLibrary is the driver library Load would open.
const DefaultLibrary = "libcuda.so.1"

// Driver is the loaded driver library; without cgo on Linux there is none.
type Driver struct{}

// DevicePtr is a device address (CUdeviceptr).
type DevicePtr uint64

// IPCHandle is a CUipcMemHandle.
type IPCHandle [64]byte

// Context is a device's primary context.
type Context struct{}

var errNoLoader = errors.New("the CUDA driver is loaded through cgo on Linux")

// Load reports why the driver cannot be loaded in this build.
func Load() (*Driver, error) {
	return nil, fmt.Errorf("%w: %v (this build: %s/%s, cgo off or not Linux)", ErrNotSupported, errNoLoader, runtime.GOOS, runtime.GOARCH)
}

func (d *Driver) Version() int                            { return 0 }
func (d *Driver) DeviceCount() (int, error)               { return 0, ErrNotSupported }
func (d *Driver) PCIBusID(int) (string, error)            { return "", ErrNotSupported }
func (d *Driver) Retain(int) (*Context, error)            { return nil, ErrNotSupported }
func (d *Driver) Close() error                            { return nil }
func (c *Context) Release() error                         { return ErrNotSupported }
func (c *Context) Alloc(int) (DevicePtr, error)           { return 0, ErrNotSupported }
func (c *Context) Free(DevicePtr) error                   { return ErrNotSupported }
func (c *Context) CopyToDevice(DevicePtr, []byte) error   { return ErrNotSupported }
func (c *Context) CopyFromDevice([]byte, DevicePtr) error { return ErrNotSupported }
func (c *Context) IPCHandle(DevicePtr) (IPCHandle, error) { return IPCHandle{}, ErrNotSupported }
