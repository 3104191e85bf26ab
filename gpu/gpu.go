// Package gpu gives gccl GPU memory: device buffers that gccl's collectives
// and Send/Recv accept (comm.DeviceBuffer), allocated here or wrapping a
// device pointer another framework allocated.
//
// The CUDA driver is loaded at run time (internal/cuda), so this package
// builds everywhere; Open reports ErrNotSupported where there is no driver.
// Until gccl's own device paths exist (CUDA IPC between processes and
// reduction kernels), collectives on device buffers move the data through
// host memory (see comm.DeviceBuffer).
//
// Status: tested here against a fake driver library only; no GPU has run
// it yet (docs/HARDWARE.md).
package gpu

import (
	"fmt"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/internal/cuda"
)

// ErrNotSupported is wrapped by Open's error where no CUDA driver can be
// used.
var ErrNotSupported = cuda.ErrNotSupported

// Device is one GPU, with its primary context.
type Device struct {
	drv     *cuda.Driver
	ctx     *cuda.Context
	ordinal int
	busID   string
}

// Open loads the driver and retains device ordinal's primary context.
func Open(ordinal int) (*Device, error) {
	drv, err := cuda.Load()
	if err != nil {
		return nil, err
	}
	n, err := drv.DeviceCount()
	if err == nil && (ordinal < 0 || ordinal >= n) {
		err = fmt.Errorf("gpu: device %d of %d", ordinal, n)
	}
	var bus string
	if err == nil {
		bus, err = drv.PCIBusID(ordinal)
	}
	var ctx *cuda.Context
	if err == nil {
		ctx, err = drv.Retain(ordinal)
	}
	if err != nil {
		drv.Close()
		return nil, err
	}
	return &Device{drv: drv, ctx: ctx, ordinal: ordinal, busID: bus}, nil
}

// Ordinal is the device's CUDA ordinal.
func (d *Device) Ordinal() int { return d.ordinal }

// PCIBusID is the device's PCI address, as topo and NCCL spell it.
func (d *Device) PCIBusID() string { return d.busID }

// Close releases the context and unloads the driver. Buffers must be freed
// first.
func (d *Device) Close() error {
	err := d.ctx.Release()
	if cerr := d.drv.Close(); err == nil {
		err = cerr
	}
	return err
}

// Buffer is device memory holding Len elements of a type. It implements
// comm.DeviceBuffer.
type Buffer struct {
	dev   *Device
	ptr   cuda.DevicePtr
	dt    comm.DataType
	n     int
	owned bool
}

var _ comm.DeviceBuffer = (*Buffer)(nil)

// Alloc allocates count elements of dt on the device.
func (d *Device) Alloc(dt comm.DataType, count int) (*Buffer, error) {
	if !dt.Valid() || count <= 0 {
		return nil, fmt.Errorf("%w: Alloc of %d %v elements", comm.ErrInvalidArgument, count, dt)
	}
	p, err := d.ctx.Alloc(count * dt.Size())
	if err != nil {
		return nil, err
	}
	return &Buffer{dev: d, ptr: p, dt: dt, n: count, owned: true}, nil
}

// Wrap makes a Buffer of device memory another framework allocated on this
// device: count elements of dt at device address ptr. gccl never frees it.
func (d *Device) Wrap(ptr uintptr, dt comm.DataType, count int) *Buffer {
	return &Buffer{dev: d, ptr: cuda.DevicePtr(ptr), dt: dt, n: count}
}

// DataType is the element type.
func (b *Buffer) DataType() comm.DataType { return b.dt }

// Len is the number of elements.
func (b *Buffer) Len() int { return b.n }

// HostBytes is nil: device memory.
func (b *Buffer) HostBytes() []byte { return nil }

// Ptr is the device address.
func (b *Buffer) Ptr() uintptr { return uintptr(b.ptr) }

// CopyToHost copies the buffer into dst, which must hold it exactly.
func (b *Buffer) CopyToHost(dst []byte) error {
	if len(dst) != b.n*b.dt.Size() {
		return fmt.Errorf("%w: CopyToHost into %d bytes from a %d-byte buffer", comm.ErrInvalidArgument, len(dst), b.n*b.dt.Size())
	}
	return b.dev.ctx.CopyFromDevice(dst, b.ptr)
}

// CopyFromHost copies src, which must be the buffer's size, into it.
func (b *Buffer) CopyFromHost(src []byte) error {
	if len(src) != b.n*b.dt.Size() {
		return fmt.Errorf("%w: CopyFromHost of %d bytes into a %d-byte buffer", comm.ErrInvalidArgument, len(src), b.n*b.dt.Size())
	}
	return b.dev.ctx.CopyToDevice(b.ptr, src)
}

// Free releases memory from Alloc; for wrapped memory it does nothing.
func (b *Buffer) Free() error {
	if !b.owned || b.ptr == 0 {
		return nil
	}
	err := b.dev.ctx.Free(b.ptr)
	b.ptr = 0
	return err
}
