//go:build linux && cgo

package cuda

/*
#include <stdint.h>
#include <stdlib.h>

// Trampolines: the driver's entry points are function pointers from dlsym,
// called with the C signatures cuda.h declares (CUresult is an int, CUdevice
// an int, CUdeviceptr a 64-bit integer, handles are pointers).
static int c_init(void *f, unsigned flags) { return ((int (*)(unsigned))f)(flags); }
static int c_int_out(void *f, int *out) { return ((int (*)(int *))f)(out); }
static int c_err_name(void *f, int r, const char **s) { return ((int (*)(int, const char **))f)(r, s); }
static int c_dev_get(void *f, int *dev, int ordinal) { return ((int (*)(int *, int))f)(dev, ordinal); }
static int c_bus_id(void *f, char *buf, int len, int dev) { return ((int (*)(char *, int, int))f)(buf, len, dev); }
static int c_ctx_retain(void *f, void **ctx, int dev) { return ((int (*)(void **, int))f)(ctx, dev); }
static int c_ctx_release(void *f, int dev) { return ((int (*)(int))f)(dev); }
static int c_ctx_set(void *f, void *ctx) { return ((int (*)(void *))f)(ctx); }
static int c_mem_alloc(void *f, uint64_t *p, size_t n) { return ((int (*)(uint64_t *, size_t))f)(p, n); }
static int c_mem_free(void *f, uint64_t p) { return ((int (*)(uint64_t))f)(p); }
static int c_htod(void *f, uint64_t dst, const void *src, size_t n, void *stream) {
	return ((int (*)(uint64_t, const void *, size_t, void *))f)(dst, src, n, stream);
}
static int c_dtoh(void *f, void *dst, uint64_t src, size_t n, void *stream) {
	return ((int (*)(void *, uint64_t, size_t, void *))f)(dst, src, n, stream);
}
static int c_stream_sync(void *f, void *stream) { return ((int (*)(void *))f)(stream); }
// Results come back by value where a call is on the collectives' path: a
// Go pointer passed to C escapes to the heap, one allocation per call.
typedef struct { char handle[64]; int r; } ipc_get_result;
static ipc_get_result c_ipc_get(void *f, uint64_t p) {
	ipc_get_result res = {{0}, 0};
	res.r = ((int (*)(void *, uint64_t))f)(res.handle, p);
	return res;
}
static int c_ctx_sync(void *f) { return ((int (*)(void))f)(); }
static int c_attr(void *f, int *v, int attr, int dev) { return ((int (*)(int *, int, int))f)(v, attr, dev); }
static int c_stream_create(void *f, uintptr_t *s, unsigned flags) { return ((int (*)(uintptr_t *, unsigned))f)(s, flags); }
static int c_handle(void *f, uintptr_t h) { return ((int (*)(uintptr_t))f)(h); }
static int c_event_create(void *f, uintptr_t *e, unsigned flags) { return ((int (*)(uintptr_t *, unsigned))f)(e, flags); }
static int c_event_record(void *f, uintptr_t e, uintptr_t s) { return ((int (*)(uintptr_t, uintptr_t))f)(e, s); }
static int c_stream_wait_event(void *f, uintptr_t s, uintptr_t e) { return ((int (*)(uintptr_t, uintptr_t, unsigned))f)(s, e, 0); }
static int c_htod_s(void *f, uint64_t dst, const void *src, size_t n, uintptr_t s) {
	return ((int (*)(uint64_t, const void *, size_t, uintptr_t))f)(dst, src, n, s);
}
static int c_dtoh_s(void *f, void *dst, uint64_t src, size_t n, uintptr_t s) {
	return ((int (*)(void *, uint64_t, size_t, uintptr_t))f)(dst, src, n, s);
}
static int c_dtod(void *f, uint64_t dst, uint64_t src, size_t n, uintptr_t s) {
	return ((int (*)(uint64_t, uint64_t, size_t, uintptr_t))f)(dst, src, n, s);
}
static int c_memset8(void *f, uint64_t dst, unsigned char v, size_t n, uintptr_t s) {
	return ((int (*)(uint64_t, unsigned char, size_t, uintptr_t))f)(dst, v, n, s);
}
static int c_alloc_host(void *f, void **p, size_t n) { return ((int (*)(void **, size_t))f)(p, n); }
static int c_host_ptr(void *f, void *p) { return ((int (*)(void *))f)(p); }
static int c_host_register(void *f, void *p, size_t n, unsigned flags) { return ((int (*)(void *, size_t, unsigned))f)(p, n, flags); }
static int c_host_alloc(void *f, void **p, size_t n, unsigned flags) { return ((int (*)(void **, size_t, unsigned))f)(p, n, flags); }
static int c_host_dptr(void *f, uint64_t *d, void *p) { return ((int (*)(uint64_t *, void *, unsigned))f)(d, p, 0); }
static int c_wait_value(void *f, uintptr_t s, uint64_t addr, uint32_t v, unsigned flags) {
	return ((int (*)(uintptr_t, uint64_t, uint32_t, unsigned))f)(s, addr, v, flags);
}
static int c_batch_mem_op(void *f, uintptr_t s, unsigned n, void *ops) {
	return ((int (*)(uintptr_t, unsigned, void *, unsigned))f)(s, n, ops, 0);
}
// CUipcMemHandle is a struct of 64 bytes, passed by value.
typedef struct { char reserved[64]; } ipc_handle;
static int c_ipc_open(void *f, uint64_t *p, const void *h, unsigned flags) {
	return ((int (*)(uint64_t *, ipc_handle, unsigned))f)(p, *(const ipc_handle *)h, flags);
}
static int c_dptr(void *f, uint64_t p) { return ((int (*)(uint64_t))f)(p); }
typedef struct { uint64_t base; size_t size; int r; } addr_range_result;
static addr_range_result c_addr_range(void *f, uint64_t p) {
	addr_range_result res = {0, 0, 0};
	res.r = ((int (*)(uint64_t *, size_t *, uint64_t))f)(&res.base, &res.size, p);
	return res;
}
// cuPointerGetAttribute of the memory type (CUmemorytype, an unsigned
// int), the device ordinal (an int), the range start (a CUdeviceptr) and
// size (a size_t); r is the first failure.
typedef struct { unsigned type; int device; uint64_t base; size_t size; int r; } ptr_info_result;
static ptr_info_result c_ptr_info(void *f, uint64_t p) {
	int (*get)(void *, int, uint64_t) = f;
	ptr_info_result res = {0, 0, 0, 0, 0};
	if ((res.r = get(&res.type, 2, p)) || (res.r = get(&res.device, 9, p)) || (res.r = get(&res.base, 11, p)))
		return res;
	res.r = get(&res.size, 12, p);
	return res;
}
static int c_module_load(void *f, uintptr_t *m, const void *image) { return ((int (*)(uintptr_t *, const void *))f)(m, image); }
static int c_module_func(void *f, uintptr_t *fn, uintptr_t m, const char *name) {
	return ((int (*)(uintptr_t *, uintptr_t, const char *))f)(fn, m, name);
}
// One kernel parameter, a struct passed by value: kernelParams holds a
// pointer to it, and the driver copies it at launch.
static int c_launch(void *f, uintptr_t fn, unsigned grid, unsigned block, uintptr_t s, void *arg) {
	void *params[1] = {arg};
	return ((int (*)(uintptr_t, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, uintptr_t, void **, void **))f)(
		fn, grid, 1, 1, block, 1, 1, 0, s, params, NULL);
}
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/gccl/gccl/internal/dl"
)

// DefaultLibrary is the driver library Load opens unless GCCL_CUDA_LIBRARY
// names another.
const DefaultLibrary = "libcuda.so.1"

// Driver is the loaded driver library.
type Driver struct {
	mu      sync.Mutex
	lib     *dl.Library
	fn      map[string]unsafe.Pointer
	version int
	// closed is set by Close: every call after it fails with ErrClosed.
	closed atomic.Bool
}

// The library stays loaded for the life of the process once gccl has
// called into it, as the CUDA runtime and NCCL leave it: the driver starts
// threads and registers exit handlers of its own, and unloading their code
// under them crashes the process later (unloading it after a failed cuInit
// has crashed others' programs). Loading it again finds it mapped.

// DevicePtr is a device address (CUdeviceptr).
type DevicePtr uint64

// IPCHandle is a CUipcMemHandle: 64 opaque bytes another process on the
// host opens to map the same device memory.
type IPCHandle [64]byte

// Load opens the driver, resolves every entry point gccl uses and
// initializes it (cuInit). Its error wraps ErrNotSupported when the library
// is absent or incomplete, or when cuInit fails (no GPU, or the driver's
// kernel module not loaded), which is then also an *Error, with the
// driver's result.
func Load() (*Driver, error) {
	path := os.Getenv("GCCL_CUDA_LIBRARY")
	if path == "" {
		path = DefaultLibrary
	}
	d, err := open(path)
	if err != nil {
		return nil, err
	}
	if err := d.check("cuInit", C.c_init(d.fn["cuInit"], 0)); err != nil {
		return nil, fmt.Errorf("%w: %s loaded, but it cannot initialize (no GPU here, or its kernel module is not loaded): %w", ErrNotSupported, path, err)
	}
	var v C.int
	if err := d.check("cuDriverGetVersion", C.c_int_out(d.fn["cuDriverGetVersion"], &v)); err != nil {
		return nil, err
	}
	d.version = int(v)
	return d, nil
}

// open loads the library at path and resolves every entry point gccl
// uses, without initializing the driver.
func open(path string) (*Driver, error) {
	lib, err := dl.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: cannot load %s (no NVIDIA driver?): %v", ErrNotSupported, path, err)
	}
	d := &Driver{lib: lib, fn: map[string]unsafe.Pointer{}}
	for _, name := range symbols {
		p := lib.Sym(name)
		if p == nil {
			lib.Close()
			return nil, fmt.Errorf("%w: %s has no %s (a driver older than gccl needs?)", ErrNotSupported, path, name)
		}
		d.fn[name] = p
	}
	for _, name := range optionalSymbols {
		if p := lib.Sym(name); p != nil {
			d.fn[name] = p
		}
	}
	return d, nil
}

// errorName asks the driver for r's name (cuGetErrorName, which needs no
// cuInit).
func (d *Driver) errorName(r Result) (string, bool) {
	var s *C.char
	if C.c_err_name(d.fn["cuGetErrorName"], C.int(r), &s) != 0 || s == nil {
		return "", false
	}
	return C.GoString(s), true
}

// check turns a result into nil or an *Error named by the driver.
func (d *Driver) check(call string, r C.int) error {
	if r == 0 {
		return nil
	}
	res := Result(r)
	name, ok := d.errorName(res)
	if !ok {
		name = res.Name()
	}
	return &Error{Call: call, Result: res, Name: name}
}

// Version is the driver's CUDA version, 1000*major + 10*minor.
func (d *Driver) Version() int { return d.version }

// DeviceCount returns the number of CUDA devices.
func (d *Driver) DeviceCount() (int, error) {
	if d.closed.Load() {
		return 0, ErrClosed
	}
	var n C.int
	if err := d.check("cuDeviceGetCount", C.c_int_out(d.fn["cuDeviceGetCount"], &n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// PCIBusID returns device ordinal's PCI address, as "0000:3b:00.0".
func (d *Driver) PCIBusID(ordinal int) (string, error) {
	if d.closed.Load() {
		return "", ErrClosed
	}
	var dev C.int
	if err := d.check("cuDeviceGet", C.c_dev_get(d.fn["cuDeviceGet"], &dev, C.int(ordinal))); err != nil {
		return "", err
	}
	var buf [32]C.char
	if err := d.check("cuDeviceGetPCIBusId", C.c_bus_id(d.fn["cuDeviceGetPCIBusId"], &buf[0], C.int(len(buf)), dev)); err != nil {
		return "", err
	}
	return strings.ToLower(C.GoString(&buf[0])), nil
}

// Context is a device's primary context, current on the OS thread of each
// call made through it.
type Context struct {
	d   *Driver
	dev C.int
	ctx unsafe.Pointer
}

// Retain returns device ordinal's primary context (cuDevicePrimaryCtxRetain).
func (d *Driver) Retain(ordinal int) (*Context, error) {
	if d.closed.Load() {
		return nil, ErrClosed
	}
	var dev C.int
	if err := d.check("cuDeviceGet", C.c_dev_get(d.fn["cuDeviceGet"], &dev, C.int(ordinal))); err != nil {
		return nil, err
	}
	var ctx unsafe.Pointer
	if err := d.check("cuDevicePrimaryCtxRetain", C.c_ctx_retain(d.fn["cuDevicePrimaryCtxRetain"], &ctx, dev)); err != nil {
		return nil, err
	}
	return &Context{d: d, dev: dev, ctx: ctx}, nil
}

// Do runs f with the context current on a locked OS thread: the driver
// keeps the current context per thread, and goroutines move between them.
// gccl's own calls go through it, and so do those of libraries that use
// the calling thread's context (cuFile).
func (c *Context) Do(f func() error) error {
	if c.d.closed.Load() {
		return ErrClosed
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.d.check("cuCtxSetCurrent", C.c_ctx_set(c.d.fn["cuCtxSetCurrent"], c.ctx)); err != nil {
		return err
	}
	return f()
}

// Handle identifies the context in this process: two Retains of one
// device's primary context give the same handle.
func (c *Context) Handle() uintptr { return uintptr(c.ctx) }

// Release drops the primary context.
func (c *Context) Release() error {
	if c.d.closed.Load() {
		return ErrClosed
	}
	return c.d.check("cuDevicePrimaryCtxRelease_v2", C.c_ctx_release(c.d.fn["cuDevicePrimaryCtxRelease_v2"], c.dev))
}

// Alloc allocates n bytes of device memory.
func (c *Context) Alloc(n int) (DevicePtr, error) {
	if n <= 0 {
		return 0, &Error{Call: "cuMemAlloc_v2", Result: ErrInvalidValue, Name: ErrInvalidValue.Name()}
	}
	var p C.uint64_t
	err := c.Do(func() error {
		return c.d.check("cuMemAlloc_v2", C.c_mem_alloc(c.d.fn["cuMemAlloc_v2"], &p, C.size_t(n)))
	})
	return DevicePtr(p), err
}

// Free frees device memory from Alloc.
func (c *Context) Free(p DevicePtr) error {
	return c.Do(func() error { return c.d.check("cuMemFree_v2", C.c_mem_free(c.d.fn["cuMemFree_v2"], C.uint64_t(p))) })
}

// CopyToDevice copies src to device address dst and waits for the copy.
func (c *Context) CopyToDevice(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return c.Do(func() error {
		if err := c.d.check("cuMemcpyHtoDAsync_v2", C.c_htod(c.d.fn["cuMemcpyHtoDAsync_v2"], C.uint64_t(dst), unsafe.Pointer(&src[0]), C.size_t(len(src)), nil)); err != nil {
			return err
		}
		return c.d.check("cuStreamSynchronize", C.c_stream_sync(c.d.fn["cuStreamSynchronize"], nil))
	})
}

// CopyFromDevice copies len(dst) bytes from device address src and waits.
func (c *Context) CopyFromDevice(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	return c.Do(func() error {
		if err := c.d.check("cuMemcpyDtoHAsync_v2", C.c_dtoh(c.d.fn["cuMemcpyDtoHAsync_v2"], unsafe.Pointer(&dst[0]), C.uint64_t(src), C.size_t(len(dst)), nil)); err != nil {
			return err
		}
		return c.d.check("cuStreamSynchronize", C.c_stream_sync(c.d.fn["cuStreamSynchronize"], nil))
	})
}

// IPCHandle returns the handle another process opens to map p's allocation.
func (c *Context) IPCHandle(p DevicePtr) (IPCHandle, error) {
	var res C.ipc_get_result
	err := c.Do(func() error {
		res = C.c_ipc_get(c.d.fn["cuIpcGetMemHandle"], C.uint64_t(p))
		return c.d.check("cuIpcGetMemHandle", res.r)
	})
	return *(*IPCHandle)(unsafe.Pointer(&res.handle)), err
}

// Attribute returns a device attribute (cuDeviceGetAttribute), e.g.
// AttrMultiProcessorCount.
func (d *Driver) Attribute(ordinal int, attr Attr) (int, error) {
	if d.closed.Load() {
		return 0, ErrClosed
	}
	var dev C.int
	if err := d.check("cuDeviceGet", C.c_dev_get(d.fn["cuDeviceGet"], &dev, C.int(ordinal))); err != nil {
		return 0, err
	}
	var v C.int
	if err := d.check("cuDeviceGetAttribute", C.c_attr(d.fn["cuDeviceGetAttribute"], &v, C.int(attr), dev)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// Synchronize waits for all work in the context (cuCtxSynchronize).
func (c *Context) Synchronize() error {
	return c.Do(func() error { return c.d.check("cuCtxSynchronize", C.c_ctx_sync(c.d.fn["cuCtxSynchronize"])) })
}

// NewStream creates a stream that does not synchronize with the legacy
// default stream (CU_STREAM_NON_BLOCKING).
func (c *Context) NewStream() (Stream, error) {
	var s C.uintptr_t
	err := c.Do(func() error { return c.d.check("cuStreamCreate", C.c_stream_create(c.d.fn["cuStreamCreate"], &s, 1)) })
	return Stream(s), err
}

// DestroyStream destroys a stream from NewStream.
func (c *Context) DestroyStream(s Stream) error {
	return c.Do(func() error {
		return c.d.check("cuStreamDestroy_v2", C.c_handle(c.d.fn["cuStreamDestroy_v2"], C.uintptr_t(s)))
	})
}

// SyncStream waits for the work queued on s.
func (c *Context) SyncStream(s Stream) error {
	return c.Do(func() error {
		return c.d.check("cuStreamSynchronize", C.c_handle(c.d.fn["cuStreamSynchronize"], C.uintptr_t(s)))
	})
}

// NewEvent creates an event without timing (CU_EVENT_DISABLE_TIMING), the
// cheap kind used for ordering.
func (c *Context) NewEvent() (Event, error) {
	var e C.uintptr_t
	err := c.Do(func() error { return c.d.check("cuEventCreate", C.c_event_create(c.d.fn["cuEventCreate"], &e, 2)) })
	return Event(e), err
}

// DestroyEvent destroys an event from NewEvent.
func (c *Context) DestroyEvent(e Event) error {
	return c.Do(func() error {
		return c.d.check("cuEventDestroy_v2", C.c_handle(c.d.fn["cuEventDestroy_v2"], C.uintptr_t(e)))
	})
}

// RecordEvent records e at the current end of s.
func (c *Context) RecordEvent(e Event, s Stream) error {
	return c.Do(func() error {
		return c.d.check("cuEventRecord", C.c_event_record(c.d.fn["cuEventRecord"], C.uintptr_t(e), C.uintptr_t(s)))
	})
}

// SyncEvent waits until the work before e's record is complete.
func (c *Context) SyncEvent(e Event) error {
	return c.Do(func() error {
		return c.d.check("cuEventSynchronize", C.c_handle(c.d.fn["cuEventSynchronize"], C.uintptr_t(e)))
	})
}

// EventDone reports whether the work before e's record is complete, without
// waiting.
func (c *Context) EventDone(e Event) (bool, error) {
	var r C.int
	if err := c.Do(func() error { r = C.c_handle(c.d.fn["cuEventQuery"], C.uintptr_t(e)); return nil }); err != nil {
		return false, err
	}
	if Result(r) == ErrNotReady {
		return false, nil
	}
	return r == 0, c.d.check("cuEventQuery", r)
}

// StreamWaitEvent makes work queued on s after this call wait for e.
func (c *Context) StreamWaitEvent(s Stream, e Event) error {
	return c.Do(func() error {
		return c.d.check("cuStreamWaitEvent", C.c_stream_wait_event(c.d.fn["cuStreamWaitEvent"], C.uintptr_t(s), C.uintptr_t(e)))
	})
}

// CopyAsync queues a device-to-device copy of n bytes on s (copy engines;
// src may be another process's memory from OpenIPC).
func (c *Context) CopyAsync(dst, src DevicePtr, n int, s Stream) error {
	if n == 0 {
		return nil
	}
	return c.Do(func() error {
		return c.d.check("cuMemcpyDtoDAsync_v2", C.c_dtod(c.d.fn["cuMemcpyDtoDAsync_v2"], C.uint64_t(dst), C.uint64_t(src), C.size_t(n), C.uintptr_t(s)))
	})
}

// CopyToDeviceAsync queues a host-to-device copy on s. src must be pinned
// (AllocHost or HostRegister) and stay unchanged until s has done it.
func (c *Context) CopyToDeviceAsync(dst DevicePtr, src []byte, s Stream) error {
	if len(src) == 0 {
		return nil
	}
	return c.Do(func() error {
		return c.d.check("cuMemcpyHtoDAsync_v2", C.c_htod_s(c.d.fn["cuMemcpyHtoDAsync_v2"], C.uint64_t(dst), unsafe.Pointer(&src[0]), C.size_t(len(src)), C.uintptr_t(s)))
	})
}

// CopyFromDeviceAsync queues a device-to-host copy on s. dst must be pinned
// (AllocHost or HostRegister) and not read until s has done it.
func (c *Context) CopyFromDeviceAsync(dst []byte, src DevicePtr, s Stream) error {
	if len(dst) == 0 {
		return nil
	}
	return c.Do(func() error {
		return c.d.check("cuMemcpyDtoHAsync_v2", C.c_dtoh_s(c.d.fn["cuMemcpyDtoHAsync_v2"], unsafe.Pointer(&dst[0]), C.uint64_t(src), C.size_t(len(dst)), C.uintptr_t(s)))
	})
}

// MemsetAsync queues setting n bytes at dst to v on s.
func (c *Context) MemsetAsync(dst DevicePtr, v byte, n int, s Stream) error {
	if n == 0 {
		return nil
	}
	return c.Do(func() error {
		return c.d.check("cuMemsetD8Async", C.c_memset8(c.d.fn["cuMemsetD8Async"], C.uint64_t(dst), C.uchar(v), C.size_t(n), C.uintptr_t(s)))
	})
}

// AllocHost allocates n bytes of pinned host memory (cuMemAllocHost), which
// copies reach by DMA. The slice is C memory: it must be released with
// FreeHost, never left to the garbage collector.
func (c *Context) AllocHost(n int) ([]byte, error) {
	if n <= 0 {
		return nil, &Error{Call: "cuMemAllocHost_v2", Result: ErrInvalidValue, Name: ErrInvalidValue.Name()}
	}
	var p unsafe.Pointer
	if err := c.Do(func() error {
		return c.d.check("cuMemAllocHost_v2", C.c_alloc_host(c.d.fn["cuMemAllocHost_v2"], &p, C.size_t(n)))
	}); err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), n), nil
}

// AllocHostMapped allocates n bytes of pinned host memory that kernels and
// stream memory operations of every device reach at the returned device
// address (cuMemHostAlloc, portable and device-mapped;
// cuMemHostGetDevicePointer_v2). Release it with FreeHost.
func (c *Context) AllocHostMapped(n int) ([]byte, DevicePtr, error) {
	if n <= 0 {
		return nil, 0, &Error{Call: "cuMemHostAlloc", Result: ErrInvalidValue, Name: ErrInvalidValue.Name()}
	}
	var p unsafe.Pointer
	var d C.uint64_t
	err := c.Do(func() error {
		if err := c.d.check("cuMemHostAlloc", C.c_host_alloc(c.d.fn["cuMemHostAlloc"], &p, C.size_t(n), 3)); err != nil {
			return err
		}
		if err := c.d.check("cuMemHostGetDevicePointer_v2", C.c_host_dptr(c.d.fn["cuMemHostGetDevicePointer_v2"], &d, p)); err != nil {
			C.c_host_ptr(c.d.fn["cuMemFreeHost"], p)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	return unsafe.Slice((*byte)(p), n), DevicePtr(d), nil
}

// WaitValue32 makes work queued on s after this call wait until the 32-bit
// word at device address p satisfies cond against v
// (cuStreamWaitValue32_v2). p is typically AllocHostMapped memory that the
// host writes.
func (c *Context) WaitValue32(s Stream, p DevicePtr, v uint32, cond WaitCond) error {
	return c.Do(func() error {
		return c.d.check("cuStreamWaitValue32_v2", C.c_wait_value(c.d.fn["cuStreamWaitValue32_v2"], C.uintptr_t(s), C.uint64_t(p), C.uint32_t(v), C.uint(cond)))
	})
}

// CanBatchMemOps says why BatchMemOps cannot work here (a driver older
// than CUDA 11.7), or nil.
func (c *Context) CanBatchMemOps() error {
	if c.d.fn["cuStreamBatchMemOp_v2"] == nil {
		return fmt.Errorf("%w: the driver has no cuStreamBatchMemOp_v2 (CUDA 11.7 or later writes memory from a stream)", ErrNotSupported)
	}
	return nil
}

// BatchMemOps queues ops on s in their order, in one driver call
// (cuStreamBatchMemOp_v2): the driver and the device pay less for a batch
// than for its operations one by one. At most MaxBatchMemOps; none is
// queued if the driver refuses one. A driver without the call (older than
// CUDA 11.7) returns an error wrapping ErrNotSupported.
func (c *Context) BatchMemOps(s Stream, ops []MemOp) error {
	if len(ops) == 0 {
		return nil
	}
	if len(ops) > MaxBatchMemOps {
		return &Error{Call: "cuStreamBatchMemOp_v2", Result: ErrInvalidValue, Name: ErrInvalidValue.Name()}
	}
	if err := c.CanBatchMemOps(); err != nil {
		return err
	}
	f := c.d.fn["cuStreamBatchMemOp_v2"]
	return c.Do(func() error {
		// ops holds no Go pointer: C may read it during the call.
		return c.d.check("cuStreamBatchMemOp_v2", C.c_batch_mem_op(f, C.uintptr_t(s), C.uint(len(ops)), unsafe.Pointer(&ops[0])))
	})
}

// FreeHost releases memory from AllocHost or AllocHostMapped.
func (c *Context) FreeHost(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return c.Do(func() error {
		return c.d.check("cuMemFreeHost", C.c_host_ptr(c.d.fn["cuMemFreeHost"], unsafe.Pointer(&b[0])))
	})
}

// HostRegister pins existing host memory (cuMemHostRegister, portable).
// The memory must not be Go heap memory the collector could free while
// registered: use memory from mmap or that the caller keeps alive.
func (c *Context) HostRegister(b []byte) error {
	if len(b) == 0 {
		return &Error{Call: "cuMemHostRegister_v2", Result: ErrInvalidValue, Name: ErrInvalidValue.Name()}
	}
	return c.Do(func() error {
		return c.d.check("cuMemHostRegister_v2", C.c_host_register(c.d.fn["cuMemHostRegister_v2"], unsafe.Pointer(&b[0]), C.size_t(len(b)), 1))
	})
}

// HostRegisterMapped pins existing host memory and maps it for every
// device (cuMemHostRegister_v2, portable and device-mapped), returning the
// address at which kernels and stream memory operations reach it
// (cuMemHostGetDevicePointer_v2). The memory rules of HostRegister apply;
// HostUnregister undoes it.
func (c *Context) HostRegisterMapped(b []byte) (DevicePtr, error) {
	if len(b) == 0 {
		return 0, &Error{Call: "cuMemHostRegister_v2", Result: ErrInvalidValue, Name: ErrInvalidValue.Name()}
	}
	var d C.uint64_t
	err := c.Do(func() error {
		p := unsafe.Pointer(&b[0])
		if err := c.d.check("cuMemHostRegister_v2", C.c_host_register(c.d.fn["cuMemHostRegister_v2"], p, C.size_t(len(b)), 3)); err != nil {
			return err
		}
		if err := c.d.check("cuMemHostGetDevicePointer_v2", C.c_host_dptr(c.d.fn["cuMemHostGetDevicePointer_v2"], &d, p)); err != nil {
			C.c_host_ptr(c.d.fn["cuMemHostUnregister"], p)
			return err
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return DevicePtr(d), nil
}

// HostUnregister unpins memory from HostRegister or HostRegisterMapped.
func (c *Context) HostUnregister(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return c.Do(func() error {
		return c.d.check("cuMemHostUnregister", C.c_host_ptr(c.d.fn["cuMemHostUnregister"], unsafe.Pointer(&b[0])))
	})
}

// OpenIPC maps the allocation behind another process's IPCHandle into this
// context and returns its base address; peer access is enabled on demand
// (CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) when it lies on another device. The
// driver refuses handles from this same process.
func (c *Context) OpenIPC(h IPCHandle) (DevicePtr, error) {
	var p C.uint64_t
	err := c.Do(func() error {
		return c.d.check("cuIpcOpenMemHandle_v2", C.c_ipc_open(c.d.fn["cuIpcOpenMemHandle_v2"], &p, unsafe.Pointer(&h[0]), 1))
	})
	return DevicePtr(p), err
}

// CloseIPC unmaps memory from OpenIPC.
func (c *Context) CloseIPC(p DevicePtr) error {
	return c.Do(func() error {
		return c.d.check("cuIpcCloseMemHandle", C.c_dptr(c.d.fn["cuIpcCloseMemHandle"], C.uint64_t(p)))
	})
}

// AddressRange returns the base and size of the allocation holding p: IPC
// handles name whole allocations, so a peer adds p-base to what it opens.
func (c *Context) AddressRange(p DevicePtr) (DevicePtr, int, error) {
	var res C.addr_range_result
	err := c.Do(func() error {
		res = C.c_addr_range(c.d.fn["cuMemGetAddressRange_v2"], C.uint64_t(p))
		return c.d.check("cuMemGetAddressRange_v2", res.r)
	})
	return DevicePtr(res.base), int(res.size), err
}

// PointerInfo says what memory p is in, as the driver knows it: memory no
// context allocated, mapped or registered is an error (CUDA_ERROR_INVALID_VALUE).
func (c *Context) PointerInfo(p DevicePtr) (PointerInfo, error) {
	var res C.ptr_info_result
	err := c.Do(func() error {
		res = C.c_ptr_info(c.d.fn["cuPointerGetAttribute"], C.uint64_t(p))
		return c.d.check("cuPointerGetAttribute", res.r)
	})
	if err != nil {
		return PointerInfo{}, err
	}
	return PointerInfo{Type: MemoryType(res._type), Device: int(res.device), Base: DevicePtr(res.base), Size: int(res.size)}, nil
}

// LoadModule loads a PTX (or cubin) image; the driver compiles PTX for the
// device on load.
func (c *Context) LoadModule(image []byte) (Module, error) {
	if len(image) == 0 {
		return 0, &Error{Call: "cuModuleLoadData", Result: ErrInvalidValue, Name: ErrInvalidValue.Name()}
	}
	img := C.CBytes(append(image[:len(image):len(image)], 0)) // PTX must end in NUL
	defer C.free(img)
	var m C.uintptr_t
	err := c.Do(func() error {
		return c.d.check("cuModuleLoadData", C.c_module_load(c.d.fn["cuModuleLoadData"], &m, img))
	})
	return Module(m), err
}

// UnloadModule unloads a module from LoadModule.
func (c *Context) UnloadModule(m Module) error {
	return c.Do(func() error { return c.d.check("cuModuleUnload", C.c_handle(c.d.fn["cuModuleUnload"], C.uintptr_t(m))) })
}

// Function looks up a kernel of m by name.
func (c *Context) Function(m Module, name string) (Function, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var f C.uintptr_t
	err := c.Do(func() error {
		return c.d.check("cuModuleGetFunction", C.c_module_func(c.d.fn["cuModuleGetFunction"], &f, C.uintptr_t(m), cname))
	})
	return Function(f), err
}

// Launch queues kernel f on s with a one-dimensional grid of blocks. arg
// points to the kernel's single parameter, a struct passed by value that
// holds no Go pointers; the driver copies it before Launch returns.
func (c *Context) Launch(f Function, grid, block uint32, s Stream, arg unsafe.Pointer) error {
	return c.Do(func() error {
		return c.d.check("cuLaunchKernel", C.c_launch(c.d.fn["cuLaunchKernel"], C.uintptr_t(f), C.uint(grid), C.uint(block), C.uintptr_t(s), arg))
	})
}

// Close ends the use of the driver: later calls fail with ErrClosed.
// Contexts and memory must be released first. The library stays loaded
// (see Driver).
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.lib == nil {
		return nil
	}
	d.closed.Store(true)
	d.lib = nil // d.fn stays, unwritten: a late call reads it without a race, and stops at closed
	return nil
}
