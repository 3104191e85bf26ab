// Package cufile is NVIDIA's GPUDirect Storage library (libcufile.so.0),
// loaded at run time as internal/cuda loads the driver: reads and writes
// between a file and device memory with no host bounce buffer where the
// file system and the nvidia-fs driver allow it (the library falls back to
// its own staging, "compatibility mode", elsewhere). Without the library,
// Load returns an error wrapping cuda.ErrNotSupported and the build and
// tests still pass.
//
// The library works on the calling thread's CUDA context: callers run
// Read and Write inside cuda.Context.Do.
package cufile

import (
	"fmt"
)

// DefaultLibrary is the library Load opens unless GCCL_CUFILE_LIBRARY
// names another (the tests' fake).
const DefaultLibrary = "libcufile.so.0"

// Handle is a file registered with the library.
type Handle uintptr

// opBase is CUFILEOP_BASE_ERR: the library's own error codes start above it.
const opBase = 5000

// Error is a failed call: the library's status (CUfileOpError) and, when
// the CUDA driver failed underneath, its CUresult.
type Error struct {
	Call   string
	Status int
	CUDA   int
}

func (e *Error) Error() string {
	if e.CUDA != 0 {
		return fmt.Sprintf("cufile: %s: status %d (CUDA driver error %d)", e.Call, e.Status, e.CUDA)
	}
	if what, ok := statusText[e.Status]; ok {
		return fmt.Sprintf("cufile: %s: status %d (%s)", e.Call, e.Status, what)
	}
	return fmt.Sprintf("cufile: %s: status %d", e.Call, e.Status)
}

// Some of the library's statuses (cufile.h's CUfileOpError).
const (
	StatusDriverNotInitialized = opBase + 1  // CU_FILE_DRIVER_NOT_INITIALIZED
	StatusIONotSupported       = opBase + 8  // CU_FILE_IO_NOT_SUPPORTED
	StatusInvalidFileType      = opBase + 18 // CU_FILE_INVALID_FILE_TYPE
	StatusInvalidFileOpenFlag  = opBase + 19 // CU_FILE_INVALID_FILE_OPEN_FLAG
	StatusDIONotSet            = opBase + 20 // CU_FILE_DIO_NOT_SET
	StatusHandleNotRegistered  = opBase + 27 // CU_FILE_HANDLE_NOT_REGISTERED
)

var statusText = map[int]string{
	StatusDriverNotInitialized: "the nvidia-fs driver is not loaded",
	StatusIONotSupported:       "GPUDirect Storage does not support this file",
	StatusInvalidFileType:      "a file type cuFile does not support",
	StatusInvalidFileOpenFlag:  "the file's open flags are not supported",
	StatusDIONotSet:            "the file was not opened with O_DIRECT",
	// Seen on a VM without udev (docs/HARDWARE.md): cuFile could not
	// read the attributes of the file's block device.
	StatusHandleNotRegistered: "cuFile could not take the file; its log says why",
}

// ioError is the error of a read or write that returned r < 0: -1 with
// errno set, or the negated status.
func ioError(call string, r int64, errno error) error {
	if r == -1 {
		return fmt.Errorf("cufile: %s: %w", call, errno)
	}
	return &Error{Call: call, Status: int(-r)}
}
