package engine

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/gccl/gccl/device"
	"github.com/gccl/gccl/internal/cuda"
	"github.com/gccl/gccl/internal/errs"
)

// The stream path (device.StreamEngine): a collective queued on the
// caller's stream, its ranks ordered by flag words in host memory that
// every rank maps and the streams write and wait for (stream memory
// operations), so that the host returns once the work is queued. Streams
// are the caller's CUDA streams (cuda.Stream) of the engine's context.

var _ device.StreamEngine = (*Engine)(nil)

// MapFlags pins host memory b and maps it for the device
// (cuda.Context.HostRegisterMapped), returning its device address; on a
// driver that cannot write memory from a stream it fails with
// errs.ErrNotSupported. b must
// stay mapped, outside the Go heap (mmap), until UnmapFlags, which must
// come before Close: after it, UnmapFlags fails and b stays registered.
func (e *Engine) MapFlags(b []byte) (uintptr, error) {
	if e.isClosed() {
		return 0, errClosed
	}
	if len(b) == 0 {
		return 0, fmt.Errorf("engine: mapping no flags: %w", errs.ErrInvalidArgument)
	}
	// Flags are only useful to streams that can write them: refuse here,
	// where the caller can do without, not at a collective's first flag.
	if err := e.ctx.CanBatchMemOps(); err != nil {
		return 0, fmt.Errorf("engine: flags for device %d: %w", e.ordinal, err)
	}
	key := uintptr(unsafe.Pointer(&b[0]))
	hostFlags.Lock()
	defer hostFlags.Unlock()
	if r, ok := hostFlags.m[key]; ok {
		if r.n != len(b) {
			return 0, fmt.Errorf("engine: flags of %d bytes at %#x, mapped before with %d: %w", len(b), key, r.n, errs.ErrInvalidArgument)
		}
		r.refs++
		return r.dev, nil
	}
	p, err := e.ctx.HostRegisterMapped(b)
	if err != nil {
		return 0, fmt.Errorf("engine: mapping %d bytes of flags for device %d: %w", len(b), e.ordinal, err)
	}
	hostFlags.m[key] = &flagReg{n: len(b), refs: 1, dev: uintptr(p)}
	return uintptr(p), nil
}

// hostFlags counts the process's mappings of flag memory. The driver
// registers host memory once per process, for every device (portable),
// and the ranks of one process map the same pages (their own and each
// other's): the first MapFlags registers, the last UnmapFlags unregisters.
var hostFlags = struct {
	sync.Mutex
	m map[uintptr]*flagReg
}{m: map[uintptr]*flagReg{}}

type flagReg struct {
	n, refs int
	dev     uintptr // the memory's device address (the same on every device)
}

// UnmapFlags undoes MapFlags; the last of the process's unregisters the
// memory. The driver first waits for the device's work, so no stream may
// still wait for a word of b.
func (e *Engine) UnmapFlags(b []byte) error {
	if e.isClosed() {
		return errClosed
	}
	if len(b) == 0 {
		return nil
	}
	key := uintptr(unsafe.Pointer(&b[0]))
	hostFlags.Lock()
	defer hostFlags.Unlock()
	r, ok := hostFlags.m[key]
	if !ok {
		return fmt.Errorf("engine: unmapping flags at %#x that MapFlags did not map: %w", key, errs.ErrInvalidArgument)
	}
	if r.refs--; r.refs > 0 {
		return nil
	}
	delete(hostFlags.m, key)
	if err := e.ctx.HostUnregister(b); err != nil {
		return fmt.Errorf("engine: unmapping %d bytes of flags from device %d: %w", len(b), e.ordinal, err)
	}
	return nil
}

// Flags queues ops on stream s in their order, in one driver call
// (cuda.Context.BatchMemOps): a store is cuStreamWriteValue32's with its
// memory barrier, a wait cuStreamWaitValue32's GEQ (wrapping order). A
// driver older than CUDA 11.7 has neither: MapFlags refuses it first.
func (e *Engine) Flags(s uintptr, ops []device.FlagOp) error {
	if len(ops) == 0 {
		return nil
	}
	if len(ops) > device.MaxFlagOps {
		return fmt.Errorf("engine: %d flag operations at once, at most %d: %w", len(ops), device.MaxFlagOps, errs.ErrInvalidArgument)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errClosed
	}
	if e.memOps == nil {
		e.memOps = new([device.MaxFlagOps]cuda.MemOp)
	}
	batch := e.memOps[:len(ops)]
	for i, op := range ops {
		if op.Wait {
			batch[i] = cuda.WaitValueOp(cuda.DevicePtr(op.Addr), op.Value, cuda.WaitGEQ)
		} else {
			batch[i] = cuda.WriteValueOp(cuda.DevicePtr(op.Addr), op.Value)
		}
	}
	if err := e.ctx.BatchMemOps(cuda.Stream(s), batch); err != nil {
		return fmt.Errorf("engine: %d flag operations on stream %#x (the first on the word at %#x): %w", len(ops), s, ops[0].Addr, err)
	}
	return nil
}

// ReduceOn queues the reduction kernel on stream s, as Reduce does on the
// engine's stream.
func (e *Engine) ReduceOn(s uintptr, r *device.Reduce) error {
	if e.isClosed() { // launchReduce finds it only when it has a kernel to launch
		return errClosed
	}
	return e.launchReduce(cuda.Stream(s), r)
}

// CopyOn queues a copy of n bytes on stream s (copy engines).
func (e *Engine) CopyOn(s, dst, src uintptr, n int) error {
	if e.isClosed() {
		return errClosed
	}
	if n < 0 {
		return fmt.Errorf("engine: a copy of %d bytes: %w", n, errs.ErrInvalidArgument)
	}
	if err := e.ctx.CopyAsync(cuda.DevicePtr(dst), cuda.DevicePtr(src), n, cuda.Stream(s)); err != nil {
		return fmt.Errorf("engine: copying %d bytes from %#x to %#x on stream %#x: %w", n, src, dst, s, err)
	}
	return nil
}

// Follow queues on stream s a wait for the work queued on stream prev so
// far: an event recorded on prev, which s waits for. One event serves
// every call: the wait is for the record made last when it was queued,
// which a later record does not change; e.mu keeps another Follow from
// recording in between.
func (e *Engine) Follow(s, prev uintptr) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errClosed
	}
	if s == prev {
		return nil // a stream's work already runs in order
	}
	if e.follow == 0 {
		ev, err := e.ctx.NewEvent()
		if err != nil {
			return fmt.Errorf("engine: an event to order streams: %w", err)
		}
		e.follow = ev
	}
	if err := e.ctx.RecordEvent(e.follow, cuda.Stream(prev)); err != nil {
		return fmt.Errorf("engine: recording stream %#x's work for stream %#x to follow: %w", prev, s, err)
	}
	if err := e.ctx.StreamWaitEvent(cuda.Stream(s), e.follow); err != nil {
		return fmt.Errorf("engine: making stream %#x follow stream %#x: %w", s, prev, err)
	}
	return nil
}
