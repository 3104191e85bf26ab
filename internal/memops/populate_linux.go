package memops

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// populate maps every page that holds a byte of b into this process's page
// tables, for writing (write) or for reading, without touching them.
func populate(b []byte, write bool) error {
	if len(b) == 0 {
		return nil
	}
	page := uintptr(unix.Getpagesize())
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	first := start &^ (page - 1)
	end := (start + uintptr(len(b)) + page - 1) &^ (page - 1)
	advice := unix.MADV_POPULATE_READ
	if write {
		advice = unix.MADV_POPULATE_WRITE
	}
	// Addresses, not pointers: the page-aligned range may start before b
	// and end after it; b keeps the memory alive through the call.
	_, _, errno := unix.Syscall(unix.SYS_MADVISE, first, end-first, uintptr(advice))
	runtime.KeepAlive(b)
	if errno != 0 {
		return errno
	}
	return nil
}
