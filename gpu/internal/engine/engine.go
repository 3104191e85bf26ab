// Package engine is the GPU's collective engine: it moves and reduces data
// directly between the GPUs of one host for gccl's device collectives.
// Processes export their device buffers as CUDA IPC handles, peers map them
// (over NVLink or PCIe peer-to-peer where the GPUs differ; on one GPU,
// within its memory), and an Engine reduces with gccl's kernels
// (internal/kernels) and copies with the copy engines, straight between the
// mapped buffers. It implements device.Engine, and device.StreamEngine on
// the caller's streams (stream.go); package gpu gives every Device one,
// and is its only user.
package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/gccl/gccl/device"
	"github.com/gccl/gccl/dtype"
	"github.com/gccl/gccl/internal/cuda"
	"github.com/gccl/gccl/internal/errs"
	"github.com/gccl/gccl/internal/kernels"
	"github.com/gccl/gccl/internal/reduce"
)

// maxImports bounds the cache of peers' mapped allocations; past it the
// least recently used half is closed. The mappings an operation under way
// imported are among the most recent, so they stay open while its kernels
// read them.
const maxImports = 1024

// imported is one cached mapping of a peer's allocation: this engine's
// reference to the process's mapping (cuda.Shared), which p2p agents and
// the other engines on the context share.
type imported struct {
	imp  *cuda.Import
	used uint64 // Import's clock at the last use
	// The allocation in its exporter: a new one there that overlaps it
	// means it was freed (staleImportsLocked).
	pid        uint32
	base, size uint64
}

// Engine is one device's engine: a stream for its work, the kernels
// (a module per element type, loaded with the context's first engine and
// shared with the others on it), and the peers' allocations mapped here.
// Its methods are safe for concurrent use; ranks sharing a device share its
// stream.
type Engine struct {
	sh      *cuda.Shared // the process's driver, context and IPC mappings
	ctx     *cuda.Context
	ordinal int
	busID   string
	sms     int
	ccMajor int
	ccMinor int
	pid     uint32

	mu      sync.Mutex
	stream  cuda.Stream
	funcs   map[kernelKey]cuda.Function // the context's kernels (ctxKernels), copied at NewEngine
	imports map[cuda.IPCHandle]imported
	clock   uint64
	// args is its own allocation: cgo checks that the memory passed to C
	// holds no Go pointers, and the rest of Engine does.
	args   *kernels.ReduceArgs
	closed bool
	// follow is the event Follow records on one stream for another to
	// wait for, made at the first Follow (stream.go).
	follow cuda.Event
	// memOps is Flags' batch, made at its first call: its own allocation,
	// as args is.
	memOps *[device.MaxFlagOps]cuda.MemOp

	// busKey is busID as descriptions carry it; mps says whether the
	// device's contexts are shared through MPS (or the driver cannot say).
	busKey [busIDLen]byte
	mps    bool
	// timeSliced describes the first process seen sharing the device
	// without MPS (Contention).
	timeSliced atomic.Pointer[string]

	holds  holdState // callers' streams held by calls (hold.go)
	shared *ctxState // what the engines on ctx share: holds, kernels (hold.go)
}

var (
	_ device.Engine    = (*Engine)(nil)
	_ device.Contender = (*Engine)(nil)
)

// NewEngine makes the engine of device ordinal on the process's shared
// CUDA state sh, which must stay open until the engine is closed.
func NewEngine(sh *cuda.Shared, ordinal int, busID string) (*Engine, error) {
	ctx, err := sh.Context(ordinal)
	if err != nil {
		return nil, err
	}
	e := &Engine{sh: sh, ctx: ctx, ordinal: ordinal, busID: busID, pid: uint32(os.Getpid()),
		args:    new(kernels.ReduceArgs),
		imports: map[cuda.IPCHandle]imported{}}
	copy(e.busKey[:], busID)
	d := sh.Driver()
	// A driver too old to answer cannot say: assume MPS rather than warn
	// wrongly.
	mps, err := d.Attribute(ordinal, cuda.AttrMPSEnabled)
	e.mps = err != nil || mps != 0
	if e.sms, err = d.Attribute(ordinal, cuda.AttrMultiProcessorCount); err != nil {
		return nil, err
	}
	if e.ccMajor, err = d.Attribute(ordinal, cuda.AttrComputeCapabilityMajor); err != nil {
		return nil, err
	}
	if e.ccMinor, err = d.Attribute(ordinal, cuda.AttrComputeCapabilityMinor); err != nil {
		return nil, err
	}
	if e.stream, err = ctx.NewStream(); err != nil {
		return nil, err
	}
	if err := joinContext(e); err != nil {
		ctx.DestroyStream(e.stream)
		return nil, err
	}
	if err := e.loadKernels(); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// noteTimeSliced records that process pid shares the engine's device
// without MPS, the first time.
func (e *Engine) noteTimeSliced(pid uint32) {
	if e.timeSliced.Load() != nil {
		return
	}
	msg := fmt.Sprintf("device %d (%s) is shared with process %d without MPS: the GPU time-slices the "+
		"processes' contexts, so each collective with device work in both waits for their time slices "+
		"(about 300 us per call on an H200); start NVIDIA's MPS (nvidia-cuda-mps-control -d) or give each "+
		"process its own GPU", e.ordinal, e.busID, pid)
	e.timeSliced.CompareAndSwap(nil, &msg)
}

// Contention says whether another process shares the device without MPS
// (device.Contender).
func (e *Engine) Contention() string {
	if m := e.timeSliced.Load(); m != nil {
		return *m
	}
	return ""
}

// Name says what the engine is.
func (e *Engine) Name() string {
	return fmt.Sprintf("CUDA IPC (device %d, %s, sm_%d%d)", e.ordinal, e.busID, e.ccMajor, e.ccMinor)
}

// Ready waits for all work queued in the device's context, by the caller
// on any stream included. While a call of this process holds a stream of
// the context (stream-bound buffers, another rank's perhaps), it fails
// with errs.ErrNotSupported instead: the driver can only wait for the
// whole context (cuCtxSynchronize), held stream included, which waits for
// that call to complete on every rank, and the call may need this one.
func (e *Engine) Ready() error {
	if n := e.shared.active.Load(); n > 0 {
		return fmt.Errorf("engine: %w: a call on device %d buffers not bound to a stream, while %d calls of this process hold streams of the device: waiting for the device's work would wait for those calls (which may need this one); bind the buffers of every rank on this device to streams (gpu.Buffer.OnStream), or none", errs.ErrNotSupported, e.ordinal, n)
	}
	return e.ctx.Synchronize()
}

// A description of exported memory: magic, exporter's pid, the
// allocation's base and size, the offset of the memory in it, the
// allocation's IPC handle, and the exporter's device (its PCI bus ID,
// zero-padded).
const (
	descMagic = "GNV2"
	busIDLen  = 16 // cuDeviceGetPCIBusId's longest: "00000000:00:00.0"
	descLen   = 4 + 4 + 8 + 8 + 8 + 64 + busIDLen
)

// AppendExport appends to dst a description of n bytes at device address
// ptr for Import in a peer.
func (e *Engine) AppendExport(dst []byte, ptr uintptr, n int) ([]byte, error) {
	base, size, err := e.ctx.AddressRange(cuda.DevicePtr(ptr))
	if err != nil {
		return nil, fmt.Errorf("engine: device memory at %#x: %w", ptr, err)
	}
	off := uint64(ptr) - uint64(base)
	if n < 0 || off+uint64(n) > uint64(size) {
		return nil, fmt.Errorf("engine: %d bytes at %#x run past their allocation [%#x, +%d): %w", n, ptr, base, size, errs.ErrInvalidArgument)
	}
	h, err := e.ctx.IPCHandle(base)
	if err != nil {
		return nil, fmt.Errorf("engine: exporting device memory at %#x: %w", ptr, err)
	}
	le := binary.LittleEndian
	dst = append(dst, descMagic...)
	dst = le.AppendUint32(dst, e.pid)
	dst = le.AppendUint64(dst, uint64(base))
	dst = le.AppendUint64(dst, uint64(size))
	dst = le.AppendUint64(dst, off)
	dst = append(dst, h[:]...)
	return append(dst, e.busKey[:]...), nil
}

// Import returns the address here of n bytes a peer exported. Memory of
// this same process is used as it is (one address space); another
// process's allocation is opened once and cached by its handle.
func (e *Engine) Import(desc []byte, n int) (uintptr, error) {
	if len(desc) != descLen || !bytes.HasPrefix(desc, []byte(descMagic)) {
		return 0, fmt.Errorf("engine: not a device memory description (%d bytes)", len(desc))
	}
	le := binary.LittleEndian
	pid, base, size, off := le.Uint32(desc[4:]), le.Uint64(desc[8:]), le.Uint64(desc[16:]), le.Uint64(desc[24:])
	if n < 0 || off > size || uint64(n) > size-off {
		return 0, fmt.Errorf("engine: peer's %d bytes at offset %d run past its %d-byte allocation", n, off, size)
	}
	if pid == e.pid {
		return uintptr(base + off), nil
	}
	var h cuda.IPCHandle
	copy(h[:], desc[32:])
	if !e.mps && [busIDLen]byte(desc[32+len(h):]) == e.busKey {
		e.noteTimeSliced(pid)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return 0, errClosed
	}
	e.clock++
	m, ok := e.imports[h]
	if !ok {
		e.closeStaleImportsLocked(pid, base, size)
		if len(e.imports) >= maxImports {
			e.evictImportsLocked()
		}
		imp, err := e.sh.Import(e.ordinal, h)
		if err != nil {
			return 0, fmt.Errorf("engine: opening process %d's device memory: %w", pid, err)
		}
		m = imported{imp: imp, pid: pid, base: base, size: size}
	}
	m.used = e.clock
	e.imports[h] = m
	return uintptr(uint64(m.imp.Base()) + off), nil
}

// closeStaleImportsLocked closes the mappings of process pid's allocations
// that overlap its allocation [base, base+size), which has a handle not
// cached: a process's live allocations never overlap, so those were freed.
// A mapping keeps its allocation's memory alive, so without this a peer
// that frees and allocates buffers call after call (no caching allocator)
// would run out of device memory long before the cache is full.
func (e *Engine) closeStaleImportsLocked(pid uint32, base, size uint64) {
	for h, m := range e.imports {
		if m.pid == pid && m.base < base+size && base < m.base+m.size {
			e.dropImportLocked(h, m)
		}
	}
}

// dropImportLocked removes a mapping from the cache and drops the engine's
// reference to it. The last reference's close is left for the end of the
// context's holds (cuda.Shared.BeginDeferral, taken by Hold): closing a
// mapping may synchronize the device, and a held stream waits for the call.
func (e *Engine) dropImportLocked(h cuda.IPCHandle, m imported) {
	delete(e.imports, h)
	m.imp.Close()
}

// evictImportsLocked closes the least recently used half of the mappings.
func (e *Engine) evictImportsLocked() {
	used := make([]uint64, 0, len(e.imports))
	for _, m := range e.imports {
		used = append(used, m.used)
	}
	slices.Sort(used)
	cut := used[len(used)/2]
	for h, m := range e.imports {
		if m.used < cut {
			e.dropImportLocked(h, m)
		}
	}
}

func (e *Engine) closeImportsLocked() {
	for h, m := range e.imports {
		e.dropImportLocked(h, m)
	}
}

// kernelOp maps a comm reduction to a kernel operator and its scalar.
func kernelOp(r *device.Reduce) (kernels.Op, float64) {
	switch r.Op.Kind {
	case dtype.OpProd:
		return kernels.OpProd, 0
	case dtype.OpMin:
		return kernels.OpMin, 0
	case dtype.OpMax:
		return kernels.OpMax, 0
	case dtype.OpAvg:
		if r.DataType.IsFloat() {
			return kernels.OpPreMulSum, 1 / float64(r.Ranks)
		}
		return kernels.OpSumDiv, float64(r.Ranks)
	case dtype.OpPreMulSum:
		return kernels.OpPreMulSum, r.Op.Scalar
	}
	return kernels.OpSum, 0
}

// Reduce queues one reduction kernel on the engine's stream.
func (e *Engine) Reduce(r *device.Reduce) error { return e.launchReduce(e.stream, r) }

// launchReduce queues one reduction kernel on stream s.
func (e *Engine) launchReduce(s cuda.Stream, r *device.Reduce) error {
	if len(r.In) < 1 || len(r.In) > kernels.MaxInputs || len(r.Out) < 1 || len(r.Out) > kernels.MaxOutputs {
		return fmt.Errorf("engine: a reduction of %d inputs into %d outputs (at most %d and %d): %w",
			len(r.In), len(r.Out), kernels.MaxInputs, kernels.MaxOutputs, errs.ErrInvalidArgument)
	}
	if r.Count <= 0 {
		return nil
	}
	op, scalar := kernelOp(r)
	dt := reduce.DType(r.DataType)
	e.mu.Lock()
	defer e.mu.Unlock()
	f, err := e.function(dt, op)
	if err != nil {
		return err
	}
	a := e.args
	*a = kernels.ReduceArgs{Count: uint64(r.Count), NIn: int32(len(r.In)), NOut: int32(len(r.Out)), Scalar: scalar}
	for i, p := range r.In {
		a.In[i] = uint64(p)
	}
	for i, p := range r.Out {
		a.Out[i] = uint64(p)
	}
	grid, block := kernels.LaunchShape(r.Count, dt, e.sms)
	if err := e.ctx.Launch(f, grid, block, s, unsafe.Pointer(a)); err != nil {
		return fmt.Errorf("engine: %v %v reduction of %d elements: %w", r.DataType, r.Op, r.Count, err)
	}
	return nil
}

// kernelKey names a loaded kernel without building its entry's name,
// which would allocate on every reduction.
type kernelKey struct {
	dt reduce.DType
	op kernels.Op
}

// module is a loaded module of gccl's kernels.
type module struct {
	mod  cuda.Module
	arch string // what was loaded: "sm_90 machine code", "sm_90 PTX"
}

// loadKernels loads every reduction kernel on e's context, unless an
// engine on it did: each type's module concurrently (loadModule), then
// each kernel, which is when the driver loads it (lazy loading, the
// default since CUDA 12.2). Loading synchronizes the context, so it is done once,
// when the first engine opens, as NCCL does when a communicator is made:
// loading at a call's first reduction would wait for the streams calls
// hold, and so for those calls, which may need this one.
func (e *Engine) loadKernels() error {
	k := &e.shared.kernels
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.mods) > 0 {
		e.funcs = maps.Clone(k.funcs)
		return nil
	}
	var mods [maxDType + 1]module
	var errs [maxDType + 1]error
	var wg sync.WaitGroup
	for dt := reduce.Int8; dt <= maxDType; dt++ {
		wg.Go(func() { mods[dt], errs[dt] = e.loadModule(dt) })
	}
	wg.Wait()
	err := errors.Join(errs[:]...)
	for dt := reduce.Int8; dt <= maxDType && err == nil; dt++ {
		for op := kernels.OpSum; op <= kernels.OpSumDiv && err == nil; op++ {
			var name string
			if name, err = kernels.ReduceEntry(dt, op); err == nil {
				if k.funcs[kernelKey{dt, op}], err = e.ctx.Function(mods[dt].mod, name); err != nil {
					err = fmt.Errorf("engine: kernel %s in gccl's %s module: %w", name, mods[dt].arch, err)
				}
			}
		}
	}
	for dt := reduce.Int8; dt <= maxDType; dt++ {
		if mods[dt].mod == 0 {
			continue
		}
		if err != nil {
			e.ctx.UnloadModule(mods[dt].mod)
		} else {
			k.mods[dt] = mods[dt]
		}
	}
	if err != nil {
		clear(k.funcs)
		return err
	}
	// The engine's own copy: a reduction looks its kernel up under e.mu,
	// which it holds anyway, not under the context's lock.
	e.funcs = maps.Clone(k.funcs)
	return nil
}

// loadModule loads dt's kernels: the embedded machine code for the
// device's architecture, or where there is none (or the driver refuses
// it), the PTX, which the driver JIT-compiles as it loads it.
func (e *Engine) loadModule(dt reduce.DType) (module, error) {
	arch, cubin, err := kernels.Cubin(e.ccMajor, e.ccMinor, dt)
	if err != nil {
		return module{}, err
	}
	if cubin != nil {
		if mod, err := e.ctx.LoadModule(cubin); err == nil {
			return module{mod, arch + " machine code"}, nil
		}
	}
	arch, ptx, err := kernels.PTX(e.ccMajor, e.ccMinor, dt)
	if err != nil {
		return module{}, err
	}
	mod, err := e.ctx.LoadModule(ptx)
	if err != nil {
		return module{}, fmt.Errorf("engine: loading gccl's %s %v kernels: %w", arch, dt, err)
	}
	return module{mod, arch + " PTX"}, nil
}

// maxDType is the last type the kernels reduce.
const maxDType = reduce.Float8E5M2

// function returns the kernel for dt and op (e.mu held).
func (e *Engine) function(dt reduce.DType, op kernels.Op) (cuda.Function, error) {
	if e.closed {
		return 0, errClosed
	}
	if f, ok := e.funcs[kernelKey{dt, op}]; ok {
		return f, nil
	}
	if _, err := kernels.ReduceEntry(dt, op); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("engine: no %v %v kernel loaded", dt, op)
}

// Copy queues a copy of n bytes on the engine's stream (copy engines).
func (e *Engine) Copy(dst, src uintptr, n int) error {
	if e.isClosed() {
		return errClosed
	}
	return e.ctx.CopyAsync(cuda.DevicePtr(dst), cuda.DevicePtr(src), n, e.stream)
}

// Wait waits until the engine's queued work is complete.
func (e *Engine) Wait() error {
	if e.isClosed() {
		return errClosed
	}
	return e.ctx.SyncStream(e.stream)
}

var errClosed = errs.New(errs.ErrClosed, "engine: closed")

func (e *Engine) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

// Close releases the streams calls still hold, and closes the peers'
// mappings, the modules, Follow's event and the stream.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.mu.Unlock()
	e.holds.mu.Lock()
	held, deferrals, err := e.holds.closeLocked(e)
	e.holds.mu.Unlock()
	e.shared.done(held)
	for range deferrals {
		e.sh.EndDeferral(e.ordinal)
	}
	last := leaveContext(e)
	if last {
		// The context's deferred frees are no other engine's. (An
		// engine that stays frees them with the same context: every
		// engine of the process on the device shares one.)
		e.shared.freeDeferred()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closeImportsLocked()
	clear(e.funcs)
	if last { // nor are its kernels
		k := &e.shared.kernels
		k.mu.Lock()
		for dt, m := range k.mods {
			if uerr := e.ctx.UnloadModule(m.mod); err == nil {
				err = uerr
			}
			delete(k.mods, dt)
		}
		clear(k.funcs)
		k.mu.Unlock()
	}
	if e.follow != 0 {
		if derr := e.ctx.DestroyEvent(e.follow); err == nil {
			err = derr
		}
		e.follow = 0
	}
	if serr := e.ctx.DestroyStream(e.stream); err == nil {
		err = serr
	}
	return err
}

// Free frees device memory allocated on the engine's context; while a
// call of this process holds a stream of the context, it is freed once no
// call does (ctxState.syncMu).
func (e *Engine) Free(p cuda.DevicePtr) error { return e.shared.free(e.ctx, p) }

// CopyToHost copies len(dst) bytes from device address src on the engine's
// stream and waits for it. Unlike the legacy default stream, which
// synchronizes with the other blocking streams, the engine's stream does
// not wait for a stream a call holds.
func (e *Engine) CopyToHost(dst []byte, src uintptr) error {
	if e.isClosed() {
		return errClosed
	}
	if err := e.ctx.CopyFromDeviceAsync(dst, cuda.DevicePtr(src), e.stream); err != nil {
		return err
	}
	return e.ctx.SyncStream(e.stream)
}

// CopyFromHost copies src to device address dst on the engine's stream and
// waits for it.
func (e *Engine) CopyFromHost(dst uintptr, src []byte) error {
	if e.isClosed() {
		return errClosed
	}
	if err := e.ctx.CopyToDeviceAsync(cuda.DevicePtr(dst), src, e.stream); err != nil {
		return err
	}
	return e.ctx.SyncStream(e.stream)
}
