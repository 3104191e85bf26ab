//go:build linux && cgo

package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

// Trampolines: the driver's entry points are function pointers from dlsym,
// called with the C signatures cuda.h declares (CUresult is an int, CUdevice
// an int, CUdeviceptr a 64-bit integer, handles are pointers).
static void *g_open(const char *path, const char **err) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) *err = dlerror();
	return h;
}
static void *g_sym(void *h, const char *name) { return dlsym(h, name); }
static int g_close(void *h) { return dlclose(h); }
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
static int c_ipc_get(void *f, void *handle, uint64_t p) { return ((int (*)(void *, uint64_t))f)(handle, p); }
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// DefaultLibrary is the driver library Load opens unless GCCL_CUDA_LIBRARY
// names another.
const DefaultLibrary = "libcuda.so.1"

// Driver is the loaded driver library.
type Driver struct {
	mu      sync.Mutex
	lib     unsafe.Pointer
	fn      map[string]unsafe.Pointer
	version int
}

// DevicePtr is a device address (CUdeviceptr).
type DevicePtr uint64

// IPCHandle is a CUipcMemHandle: 64 opaque bytes another process on the
// host opens to map the same device memory.
type IPCHandle [64]byte

// Load opens the driver, resolves every entry point gccl uses and
// initializes it (cuInit). Its error wraps ErrNotSupported when the library
// is absent or incomplete, and is an *Error when cuInit fails (no device,
// for one).
func Load() (*Driver, error) {
	path := os.Getenv("GCCL_CUDA_LIBRARY")
	if path == "" {
		path = DefaultLibrary
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var cerr *C.char
	lib := C.g_open(cpath, &cerr)
	if lib == nil {
		return nil, fmt.Errorf("%w: cannot load %s (no NVIDIA driver?): %s", ErrNotSupported, path, C.GoString(cerr))
	}
	d := &Driver{lib: lib, fn: map[string]unsafe.Pointer{}}
	for _, name := range symbols {
		cname := C.CString(name)
		p := C.g_sym(lib, cname)
		C.free(unsafe.Pointer(cname))
		if p == nil {
			C.g_close(lib)
			return nil, fmt.Errorf("%w: %s has no %s (a driver older than gccl needs?)", ErrNotSupported, path, name)
		}
		d.fn[name] = p
	}
	if err := d.check("cuInit", C.c_init(d.fn["cuInit"], 0)); err != nil {
		C.g_close(lib)
		return nil, err
	}
	var v C.int
	if err := d.check("cuDriverGetVersion", C.c_int_out(d.fn["cuDriverGetVersion"], &v)); err != nil {
		C.g_close(lib)
		return nil, err
	}
	d.version = int(v)
	return d, nil
}

// check turns a result into nil or an *Error named by the driver.
func (d *Driver) check(call string, r C.int) error {
	if r == 0 {
		return nil
	}
	res := Result(r)
	name := res.Name()
	var s *C.char
	if f := d.fn["cuGetErrorName"]; f != nil && C.c_err_name(f, r, &s) == 0 && s != nil {
		name = C.GoString(s)
	}
	return &Error{Call: call, Result: res, Name: name}
}

// Version is the driver's CUDA version, 1000*major + 10*minor.
func (d *Driver) Version() int { return d.version }

// DeviceCount returns the number of CUDA devices.
func (d *Driver) DeviceCount() (int, error) {
	var n C.int
	if err := d.check("cuDeviceGetCount", C.c_int_out(d.fn["cuDeviceGetCount"], &n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// PCIBusID returns device ordinal's PCI address, as "0000:3b:00.0".
func (d *Driver) PCIBusID(ordinal int) (string, error) {
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

// do runs f with the context current on a locked OS thread: the driver
// keeps the current context per thread, and goroutines move between them.
func (c *Context) do(f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.d.check("cuCtxSetCurrent", C.c_ctx_set(c.d.fn["cuCtxSetCurrent"], c.ctx)); err != nil {
		return err
	}
	return f()
}

// Release drops the primary context.
func (c *Context) Release() error {
	return c.d.check("cuDevicePrimaryCtxRelease_v2", C.c_ctx_release(c.d.fn["cuDevicePrimaryCtxRelease_v2"], c.dev))
}

// Alloc allocates n bytes of device memory.
func (c *Context) Alloc(n int) (DevicePtr, error) {
	if n <= 0 {
		return 0, &Error{Call: "cuMemAlloc_v2", Result: ErrInvalidValue, Name: ErrInvalidValue.Name()}
	}
	var p C.uint64_t
	err := c.do(func() error {
		return c.d.check("cuMemAlloc_v2", C.c_mem_alloc(c.d.fn["cuMemAlloc_v2"], &p, C.size_t(n)))
	})
	return DevicePtr(p), err
}

// Free frees device memory from Alloc.
func (c *Context) Free(p DevicePtr) error {
	return c.do(func() error { return c.d.check("cuMemFree_v2", C.c_mem_free(c.d.fn["cuMemFree_v2"], C.uint64_t(p))) })
}

// CopyToDevice copies src to device address dst and waits for the copy.
func (c *Context) CopyToDevice(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return c.do(func() error {
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
	return c.do(func() error {
		if err := c.d.check("cuMemcpyDtoHAsync_v2", C.c_dtoh(c.d.fn["cuMemcpyDtoHAsync_v2"], unsafe.Pointer(&dst[0]), C.uint64_t(src), C.size_t(len(dst)), nil)); err != nil {
			return err
		}
		return c.d.check("cuStreamSynchronize", C.c_stream_sync(c.d.fn["cuStreamSynchronize"], nil))
	})
}

// IPCHandle returns the handle another process opens to map p's allocation.
func (c *Context) IPCHandle(p DevicePtr) (IPCHandle, error) {
	var h IPCHandle
	err := c.do(func() error {
		return c.d.check("cuIpcGetMemHandle", C.c_ipc_get(c.d.fn["cuIpcGetMemHandle"], unsafe.Pointer(&h[0]), C.uint64_t(p)))
	})
	return h, err
}

// Close unloads the driver library. Contexts and memory must be released
// first.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.lib == nil {
		return nil
	}
	C.g_close(d.lib)
	d.lib, d.fn = nil, nil
	return nil
}
