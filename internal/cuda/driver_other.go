//go:build !linux || !cgo

package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"
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

func (d *Driver) Version() int                                       { return 0 }
func (d *Driver) DeviceCount() (int, error)                          { return 0, ErrNotSupported }
func (d *Driver) PCIBusID(int) (string, error)                       { return "", ErrNotSupported }
func (d *Driver) Retain(int) (*Context, error)                       { return nil, ErrNotSupported }
func (d *Driver) Close() error                                       { return nil }
func (c *Context) Handle() uintptr                                   { return 0 }
func (c *Context) Release() error                                    { return ErrNotSupported }
func (c *Context) Do(func() error) error                             { return ErrNotSupported }
func (c *Context) Alloc(int) (DevicePtr, error)                      { return 0, ErrNotSupported }
func (c *Context) Free(DevicePtr) error                              { return ErrNotSupported }
func (c *Context) CopyToDevice(DevicePtr, []byte) error              { return ErrNotSupported }
func (c *Context) CopyFromDevice([]byte, DevicePtr) error            { return ErrNotSupported }
func (c *Context) IPCHandle(DevicePtr) (IPCHandle, error)            { return IPCHandle{}, ErrNotSupported }
func (d *Driver) Attribute(int, Attr) (int, error)                   { return 0, ErrNotSupported }
func (c *Context) Synchronize() error                                { return ErrNotSupported }
func (c *Context) NewStream() (Stream, error)                        { return 0, ErrNotSupported }
func (c *Context) DestroyStream(Stream) error                        { return ErrNotSupported }
func (c *Context) SyncStream(Stream) error                           { return ErrNotSupported }
func (c *Context) NewEvent() (Event, error)                          { return 0, ErrNotSupported }
func (c *Context) DestroyEvent(Event) error                          { return ErrNotSupported }
func (c *Context) RecordEvent(Event, Stream) error                   { return ErrNotSupported }
func (c *Context) SyncEvent(Event) error                             { return ErrNotSupported }
func (c *Context) EventDone(Event) (bool, error)                     { return false, ErrNotSupported }
func (c *Context) StreamWaitEvent(Stream, Event) error               { return ErrNotSupported }
func (c *Context) CopyAsync(DevicePtr, DevicePtr, int, Stream) error { return ErrNotSupported }
func (c *Context) CopyToDeviceAsync(DevicePtr, []byte, Stream) error { return ErrNotSupported }
func (c *Context) CopyFromDeviceAsync([]byte, DevicePtr, Stream) error {
	return ErrNotSupported
}
func (c *Context) MemsetAsync(DevicePtr, byte, int, Stream) error { return ErrNotSupported }
func (c *Context) AllocHost(int) ([]byte, error)                  { return nil, ErrNotSupported }
func (c *Context) FreeHost([]byte) error                          { return ErrNotSupported }
func (c *Context) AllocHostMapped(int) ([]byte, DevicePtr, error) { return nil, 0, ErrNotSupported }
func (c *Context) WaitValue32(Stream, DevicePtr, uint32, WaitCond) error {
	return ErrNotSupported
}
func (c *Context) HostRegister([]byte) error                      { return ErrNotSupported }
func (c *Context) CanBatchMemOps() error                          { return ErrNotSupported }
func (c *Context) BatchMemOps(Stream, []MemOp) error              { return ErrNotSupported }
func (c *Context) HostRegisterMapped([]byte) (DevicePtr, error)   { return 0, ErrNotSupported }
func (c *Context) HostUnregister([]byte) error                    { return ErrNotSupported }
func (c *Context) OpenIPC(IPCHandle) (DevicePtr, error)           { return 0, ErrNotSupported }
func (c *Context) CloseIPC(DevicePtr) error                       { return ErrNotSupported }
func (c *Context) AddressRange(DevicePtr) (DevicePtr, int, error) { return 0, 0, ErrNotSupported }
func (c *Context) LoadModule([]byte) (Module, error)              { return 0, ErrNotSupported }
func (c *Context) PointerInfo(DevicePtr) (PointerInfo, error)     { return PointerInfo{}, ErrNotSupported }
func (c *Context) UnloadModule(Module) error                      { return ErrNotSupported }
func (c *Context) Function(Module, string) (Function, error)      { return 0, ErrNotSupported }
func (c *Context) Launch(Function, uint32, uint32, Stream, unsafe.Pointer) error {
	return ErrNotSupported
}

// DmaBufFD reports that this build has no driver.
func (c *Context) DmaBufFD(DevicePtr, int) (int, error) { return -1, ErrNotSupported }
