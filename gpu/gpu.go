// Package gpu gives gccl GPU memory: device buffers that gccl's collectives
// and Send/Recv accept (comm.DeviceBuffer, declared in package device),
// allocated here or wrapping a device pointer another framework allocated.
//
// The CUDA driver is loaded at run time (internal/cuda), so this package
// builds everywhere; Open reports ErrNotSupported where there is no driver.
//
// Buffers are comm.PeerDeviceBuffers: when every rank of a communicator on
// one host passes them, every collective runs on the devices (the
// device's collective engine, gpu/internal/engine: CUDA IPC between the
// processes, gccl's reduction kernels, copy engines), and the call returns
// once the result is in device memory; a Send/Recv between two of them on
// one host is one device-to-device copy. An in-place all-to-all and jobs
// spanning hosts move device data through host staging. A call waits
// for all work queued in the device's context before it starts (the inputs
// are complete), staged or not, and returns after its own device work is
// complete; its async form completes its Request then. While another call
// of the process holds a stream of the device (below), a call on unbound
// buffers of it fails at once with ErrNotSupported: waiting for the
// whole context would wait for that call, which may need this one. Buffers
// bound to a stream (OnStream) order calls on that stream instead, as NCCL
// does: a call waits only for the stream's earlier work, and the stream's
// later work waits for the call.
package gpu

import (
	"fmt"
	"math"
	"sync/atomic"

	"github.com/gccl/gccl/device"
	"github.com/gccl/gccl/dtype"
	"github.com/gccl/gccl/gpu/internal/engine"
	"github.com/gccl/gccl/internal/cuda"
	"github.com/gccl/gccl/internal/errs"
)

// ErrNotSupported is wrapped by Open's error where no CUDA driver can be
// used.
var ErrNotSupported = cuda.ErrNotSupported

// ErrInvalidArgument is wrapped by the errors of calls with bad arguments.
var ErrInvalidArgument = errs.ErrInvalidArgument

// ErrClosed is wrapped by the errors of a Device's calls, and of its
// Buffers' and Streams', after the Device's Close.
var ErrClosed = cuda.ErrClosed

// Device is one GPU, with its primary context.
type Device struct {
	sh      *cuda.Shared // the process's driver, context and IPC mappings
	ctx     *cuda.Context
	ordinal int
	busID   string
	eng     *engine.Engine
	closed  atomic.Bool
}

// Open loads the driver and retains device ordinal's primary context, or
// shares them with the process's other Devices and p2p agents. The
// process's first Open of a device (or the first after every Device of it
// was closed) also loads gccl's kernels there: machine code on sm_70,
// sm_80 and sm_90 and their minor versions (10 ms on an H100), elsewhere
// PTX, which the driver compiles (seconds, cached on disk). Loading waits
// for the work queued on the device, as loading CUDA modules does.
func Open(ordinal int) (*Device, error) {
	sh, err := cuda.OpenShared()
	if err != nil {
		return nil, err
	}
	if n := sh.DeviceCount(); ordinal < 0 || ordinal >= n {
		err = fmt.Errorf("gpu: device %d of %d", ordinal, n)
	}
	var bus string
	if err == nil {
		bus, err = sh.PCIBusID(ordinal)
	}
	var ctx *cuda.Context
	if err == nil {
		ctx, err = sh.Context(ordinal)
	}
	var eng *engine.Engine
	if err == nil {
		eng, err = engine.NewEngine(sh, ordinal, bus)
	}
	if err != nil {
		sh.Close()
		return nil, err
	}
	return &Device{sh: sh, ctx: ctx, ordinal: ordinal, busID: bus, eng: eng}, nil
}

// Ordinal is the device's CUDA ordinal.
func (d *Device) Ordinal() int { return d.ordinal }

// PCIBusID is the device's PCI address, as topo and NCCL spell it.
func (d *Device) PCIBusID() string { return d.busID }

// Close closes the device's engine and its reference to the process's CUDA
// state: the last reference releases the context and closes the driver
// (its library stays loaded, as the CUDA runtime leaves it). Buffers must
// be freed first. Calls after the first do nothing; the Device's (and its
// Buffers' and Streams') other calls then fail with ErrClosed.
func (d *Device) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	err := d.eng.Close()
	if cerr := d.sh.Close(); err == nil {
		err = cerr
	}
	return err
}

// check fails calls after Close: the context may live on for the
// process's other users.
func (d *Device) check() error {
	if d.closed.Load() {
		return fmt.Errorf("gpu: device %d: %w", d.ordinal, ErrClosed)
	}
	return nil
}

// Buffer is device memory holding Len elements of a type. It implements
// device.Buffer.
type Buffer struct {
	dev   *Device
	ptr   cuda.DevicePtr
	dt    dtype.DataType
	n     int
	owned bool
}

var _ device.PeerBuffer = (*Buffer)(nil)

// Alloc allocates count elements of dt on the device.
func (d *Device) Alloc(dt dtype.DataType, count int) (*Buffer, error) {
	if !dt.Valid() || count <= 0 || count > math.MaxInt/dt.Size() {
		return nil, fmt.Errorf("%w: Alloc of %d %v elements", errs.ErrInvalidArgument, count, dt)
	}
	if err := d.check(); err != nil {
		return nil, err
	}
	p, err := d.ctx.Alloc(count * dt.Size())
	if err != nil {
		return nil, err
	}
	return &Buffer{dev: d, ptr: p, dt: dt, n: count, owned: true}, nil
}

// Wrap makes a Buffer of device memory another framework allocated on this
// device (a PyTorch tensor's data_ptr, a cudaMalloc): count elements of dt
// at device address ptr. gccl never frees it. The driver must know the
// memory as this device's (allocated, mapped from a peer or managed), and
// the elements must lie inside one allocation: a wrong pointer fails here,
// with ErrInvalidArgument, and not in a kernel, where a bad address kills
// the whole context.
func (d *Device) Wrap(ptr uintptr, dt dtype.DataType, count int) (*Buffer, error) {
	// A byte size past MaxInt would wrap: Len and every size computed from
	// it (View's, the calls') must fit in an int.
	if !dt.Valid() || count <= 0 || count > math.MaxInt/dt.Size() {
		return nil, fmt.Errorf("%w: Wrap of %d %v elements", errs.ErrInvalidArgument, count, dt)
	}
	n := uint64(count) * uint64(dt.Size())
	if err := d.check(); err != nil {
		return nil, err
	}
	info, err := d.ctx.PointerInfo(cuda.DevicePtr(ptr))
	if err != nil {
		return nil, fmt.Errorf("%w: Wrap: %#x is not memory CUDA allocated, mapped or registered: %v", errs.ErrInvalidArgument, ptr, err)
	}
	if err := info.CheckRange(cuda.DevicePtr(ptr), n, d.ordinal); err != nil {
		return nil, fmt.Errorf("%w: Wrap: %v", errs.ErrInvalidArgument, err)
	}
	return &Buffer{dev: d, ptr: cuda.DevicePtr(ptr), dt: dt, n: count}, nil
}

// View returns count elements of dt that start off bytes into b, as a
// Buffer of its own (a tensor view: the same memory, not copied, not freed
// by the view's Free). Collectives take views as they take whole buffers;
// a view and b are in place when they start at the same address. A view
// must not be used after b is freed.
func (b *Buffer) View(off int, dt dtype.DataType, count int) (*Buffer, error) {
	size := b.n * b.dt.Size()
	if !dt.Valid() || count < 0 || off < 0 || off > size || count > (size-off)/dt.Size() {
		return nil, fmt.Errorf("%w: View of %d %v elements at byte %d of a %d-byte buffer", errs.ErrInvalidArgument, count, dt, off, size)
	}
	if b.ptr == 0 {
		return nil, fmt.Errorf("%w: View of a freed buffer", errs.ErrInvalidArgument)
	}
	return &Buffer{dev: b.dev, ptr: b.ptr + cuda.DevicePtr(off), dt: dt, n: count}, nil
}

// DataType is the element type.
func (b *Buffer) DataType() dtype.DataType { return b.dt }

// Len is the number of elements.
func (b *Buffer) Len() int { return b.n }

// HostBytes is nil: device memory.
func (b *Buffer) HostBytes() []byte { return nil }

// Ptr is the device address.
func (b *Buffer) Ptr() uintptr { return uintptr(b.ptr) }

// Engine is the device's engine for device collectives (CUDA IPC and
// gccl's kernels): collectives whose every rank passes Buffers on one host
// run on the devices.
func (b *Buffer) Engine() device.Engine { return b.dev.eng }

// CopyToHost copies the buffer into dst, which must hold it exactly.
func (b *Buffer) CopyToHost(dst []byte) error {
	if err := b.checkHost("CopyToHost", dst); err != nil {
		return err
	}
	return b.dev.ctx.CopyFromDevice(dst, b.ptr)
}

// CopyFromHost copies src, which must be the buffer's size, into it.
func (b *Buffer) CopyFromHost(src []byte) error {
	if err := b.checkHost("CopyFromHost", src); err != nil {
		return err
	}
	return b.dev.ctx.CopyToDevice(b.ptr, src)
}

// checkHost checks that the device is open and that host memory h is the
// buffer's size.
func (b *Buffer) checkHost(call string, h []byte) error {
	if err := b.dev.check(); err != nil {
		return err
	}
	if len(h) != b.n*b.dt.Size() {
		return fmt.Errorf("%w: %s with %d bytes of host memory for a %d-byte buffer", errs.ErrInvalidArgument, call, len(h), b.n*b.dt.Size())
	}
	return nil
}

// Free releases memory from Alloc; for wrapped memory it does nothing.
// While a call of this process holds a stream of the device (buffers
// bound to streams), the memory is freed once no call does: freeing
// synchronizes the device, which waits for the held stream, and the
// driver stops the process's other calls on the device meanwhile, the
// call's own included. (Freeing with cudaFree, or another framework's
// allocator, during such a call can hang so, as with NCCL.)
func (b *Buffer) Free() error {
	if !b.owned || b.ptr == 0 {
		return nil
	}
	if err := b.dev.check(); err != nil {
		return err
	}
	// Through the engine, which defers the free while a call of this
	// process holds a stream of the device.
	err := b.dev.eng.Free(b.ptr)
	b.ptr = 0
	return err
}

// DeviceCount returns the number of CUDA devices.
func DeviceCount() (int, error) {
	sh, err := cuda.OpenShared()
	if err != nil {
		return 0, err
	}
	defer sh.Close()
	return sh.DeviceCount(), nil
}

// Copy copies src into dst (same size, any devices of this process) with
// the copy engines, and waits for it.
func (d *Device) Copy(dst, src *Buffer) error {
	if dst.n*dst.dt.Size() != src.n*src.dt.Size() {
		return fmt.Errorf("%w: Copy of %d bytes into %d", errs.ErrInvalidArgument, src.n*src.dt.Size(), dst.n*dst.dt.Size())
	}
	if err := d.eng.Copy(uintptr(dst.ptr), uintptr(src.ptr), dst.n*dst.dt.Size()); err != nil {
		return err
	}
	return d.eng.Wait()
}

// Stream is a CUDA stream of a device: one gccl made (NewStream) or
// another framework's (WrapStream). Buffers bound to it (OnStream) order
// gccl's calls on it.
type Stream struct {
	dev   *Device
	s     cuda.Stream
	owned bool
}

// NewStream makes a stream on the device (non-blocking: it does not
// synchronize with the legacy default stream).
func (d *Device) NewStream() (*Stream, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	s, err := d.ctx.NewStream()
	if err != nil {
		return nil, err
	}
	return &Stream{dev: d, s: s, owned: true}, nil
}

// WrapStream makes a Stream of a CUstream (cudaStream_t) handle another
// framework made on this device, such as PyTorch's
// torch.cuda.current_stream().cuda_stream; 0 is the legacy default stream.
// gccl never destroys it.
func (d *Device) WrapStream(handle uintptr) *Stream {
	return &Stream{dev: d, s: cuda.Stream(handle)}
}

// Handle is the CUstream handle.
func (s *Stream) Handle() uintptr { return uintptr(s.s) }

// Synchronize waits until the work queued on the stream is complete.
func (s *Stream) Synchronize() error {
	if err := s.dev.check(); err != nil {
		return err
	}
	return s.dev.ctx.SyncStream(s.s)
}

// Close destroys a stream from NewStream; for a wrapped one it does
// nothing.
func (s *Stream) Close() error {
	if !s.owned || s.s == 0 {
		return nil
	}
	if err := s.dev.check(); err != nil {
		return err
	}
	err := s.dev.ctx.DestroyStream(s.s)
	s.s = 0
	return err
}

// StreamBuffer is a Buffer bound to a Stream (device.StreamBuffer): a call on
// it waits for the work queued on the stream before the call was issued,
// and the stream's work queued after it, async calls included, waits until
// the call is complete on every rank, as with NCCL. A call's device buffers
// must all be bound to streams, or none. CopyToHost and CopyFromHost do not
// wait for the stream: synchronize it first.
type StreamBuffer struct {
	*Buffer
	stream *Stream
}

var (
	_ device.StreamBuffer = (*StreamBuffer)(nil)
	_ device.PeerBuffer   = (*StreamBuffer)(nil)
)

// OnStream binds the buffer to s, which must be of the buffer's device.
func (b *Buffer) OnStream(s *Stream) (*StreamBuffer, error) {
	if s == nil || s.dev != b.dev {
		return nil, fmt.Errorf("%w: OnStream with a stream of another device", errs.ErrInvalidArgument)
	}
	return &StreamBuffer{Buffer: b, stream: s}, nil
}

// Stream identifies the buffer's stream.
func (b *StreamBuffer) Stream() uintptr { return uintptr(b.stream.s) }

// HoldStream claims the stream for a call (device.StreamBuffer).
func (b *StreamBuffer) HoldStream() (device.Hold, error) { return b.dev.eng.Hold(b.stream.s) }

// CopyToHost copies the buffer into dst on gccl's own stream of the device,
// so that it runs while a call holds the buffer's stream.
func (b *StreamBuffer) CopyToHost(dst []byte) error {
	if err := b.checkHost("CopyToHost", dst); err != nil {
		return err
	}
	return b.dev.eng.CopyToHost(dst, uintptr(b.ptr))
}

// CopyFromHost copies src into the buffer on gccl's own stream of the
// device.
func (b *StreamBuffer) CopyFromHost(src []byte) error {
	if err := b.checkHost("CopyFromHost", src); err != nil {
		return err
	}
	return b.dev.eng.CopyFromHost(uintptr(b.ptr), src)
}

// Copy queues a copy of src into dst (same size) on the stream, without
// waiting for it.
func (s *Stream) Copy(dst, src *Buffer) error {
	if dst.n*dst.dt.Size() != src.n*src.dt.Size() {
		return fmt.Errorf("%w: Copy of %d bytes into %d", errs.ErrInvalidArgument, src.n*src.dt.Size(), dst.n*dst.dt.Size())
	}
	if err := s.dev.check(); err != nil {
		return err
	}
	return s.dev.ctx.CopyAsync(dst.ptr, src.ptr, dst.n*dst.dt.Size(), s.s)
}
