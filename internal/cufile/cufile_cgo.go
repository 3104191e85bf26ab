//go:build linux && cgo

package cufile

/*
#include <errno.h>
#include <stdint.h>
#include <sys/types.h>

// cufile.h's types, declared here so that no header is needed to build.
typedef struct { int err; int cu_err; } cufile_error;
typedef struct {
	int type; // CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1
	union { int fd; void *handle; } handle;
	const void *fs_ops;
} cufile_descr;

static cufile_error f_void(void *f) { return ((cufile_error (*)(void))f)(); }
typedef struct { void *handle; cufile_error e; } register_result;
static register_result f_register(void *f, int fd) {
	cufile_descr d = {1, {0}, NULL};
	d.handle.fd = fd;
	register_result r = {NULL, {0, 0}};
	r.e = ((cufile_error (*)(void **, cufile_descr *))f)(&r.handle, &d);
	return r;
}
static void f_deregister(void *f, uintptr_t h) { ((void (*)(void *))f)((void *)h); }
typedef struct { int64_t n; int err; } io_result;
static io_result f_io(void *f, uintptr_t h, uint64_t dev, size_t n, int64_t foff, int64_t doff) {
	errno = 0;
	io_result r;
	r.n = ((ssize_t (*)(void *, void *, size_t, off_t, off_t))f)((void *)h, (void *)(uintptr_t)dev, n, foff, doff);
	r.err = errno;
	return r;
}
*/
import "C"

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"github.com/gccl/gccl/internal/cuda"
	"github.com/gccl/gccl/internal/dl"
)

// Library is the loaded library, its driver open.
type Library struct {
	lib  *dl.Library
	fn   map[string]unsafe.Pointer
	mu   sync.Mutex
	done bool
}

// symbols are the entry points gccl uses; cuFileDriverClose_v2 (counted
// closes, CUDA 12.x) is preferred, cuFileDriverClose taken otherwise.
var symbols = []string{"cuFileDriverOpen", "cuFileHandleRegister", "cuFileHandleDeregister", "cuFileRead", "cuFileWrite"}

// Load opens the library and its driver (cuFileDriverOpen).
func Load() (*Library, error) {
	path := os.Getenv("GCCL_CUFILE_LIBRARY")
	if path == "" {
		path = DefaultLibrary
	}
	lib, err := dl.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: cannot load %s (GPUDirect Storage not installed?): %v", cuda.ErrNotSupported, path, err)
	}
	l := &Library{lib: lib, fn: map[string]unsafe.Pointer{}}
	for _, name := range symbols {
		if l.fn[name] = lib.Sym(name); l.fn[name] == nil {
			lib.Close()
			return nil, fmt.Errorf("%w: %s has no %s", cuda.ErrNotSupported, path, name)
		}
	}
	if l.fn["close"] = lib.Sym("cuFileDriverClose_v2"); l.fn["close"] == nil {
		if l.fn["close"] = lib.Sym("cuFileDriverClose"); l.fn["close"] == nil {
			lib.Close()
			return nil, fmt.Errorf("%w: %s has no cuFileDriverClose", cuda.ErrNotSupported, path)
		}
	}
	// From here on the library stays loaded, as the CUDA driver does (see
	// cuda.Driver): it may have started threads of its own.
	if err := check("cuFileDriverOpen", C.f_void(l.fn["cuFileDriverOpen"])); err != nil {
		return nil, fmt.Errorf("%w: %w", cuda.ErrNotSupported, err)
	}
	return l, nil
}

func check(call string, e C.cufile_error) error {
	if e.err == 0 && e.cu_err == 0 {
		return nil
	}
	return &Error{Call: call, Status: int(e.err), CUDA: int(e.cu_err)}
}

// Close closes the driver (cuFileDriverClose); the library stays loaded.
func (l *Library) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return nil
	}
	l.done = true
	return check("cuFileDriverClose", C.f_void(l.fn["close"]))
}

// Register registers an open file descriptor (opened with O_DIRECT for the
// direct path; the library stages others itself).
func (l *Library) Register(fd int) (Handle, error) {
	r := C.f_register(l.fn["cuFileHandleRegister"], C.int(fd))
	if err := check("cuFileHandleRegister", r.e); err != nil {
		return 0, err
	}
	return Handle(uintptr(r.handle)), nil
}

// Deregister releases a registration (the descriptor stays open).
func (l *Library) Deregister(h Handle) {
	C.f_deregister(l.fn["cuFileHandleDeregister"], C.uintptr_t(h))
}

// Read reads up to n bytes at file offset off into device memory at dev
// and returns how many it read (fewer at the end of the file). The calling
// thread's context must be current (cuda.Context.Do).
func (l *Library) Read(h Handle, dev cuda.DevicePtr, n int, off int64) (int, error) {
	return l.io("cuFileRead", h, dev, n, off)
}

// Write writes n bytes of device memory at dev to file offset off and
// returns how many it wrote.
func (l *Library) Write(h Handle, dev cuda.DevicePtr, n int, off int64) (int, error) {
	return l.io("cuFileWrite", h, dev, n, off)
}

func (l *Library) io(call string, h Handle, dev cuda.DevicePtr, n int, off int64) (int, error) {
	if n < 0 || off < 0 {
		return 0, fmt.Errorf("cufile: %s of %d bytes at offset %d", call, n, off)
	}
	r := C.f_io(l.fn[call], C.uintptr_t(h), C.uint64_t(dev), C.size_t(n), C.int64_t(off), 0)
	if r.n < 0 {
		return 0, ioError(call, int64(r.n), syscall.Errno(r.err))
	}
	return int(r.n), nil
}
