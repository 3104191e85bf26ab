// Package cma copies memory out of, and into, another process of this host
// with one kernel copy: Linux's cross-memory attach (process_vm_readv and
// process_vm_writev), which Open MPI's shared-memory transport uses for
// large messages.
//
// The kernel allows it only where ptrace would be allowed (the same user
// and Yama's ptrace_scope, or CAP_SYS_PTRACE), and only on systems and
// sandboxes that let the system call through; Refused tells those
// failures from a peer that is gone or an address that is not mapped. A
// pid names a process only in its own pid namespace: callers check that a
// pid is the process they mean (by reading back a value the process
// published) before trusting it.
package cma

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/gccl/gccl/internal/errs"
)

// ErrNotSupported: no cross-memory attach on this system.
var ErrNotSupported error = errs.New(errs.ErrNotSupported, "cma: process_vm_readv is not available on this system")

// ErrRefused marks a caller's own finding that a process may not be read
// or written (a pid that turned out to be another process): Refused holds
// for it.
var ErrRefused = errors.New("cma: access to that process's memory is refused")

// Reader reads other processes' memory. Its vectors are made once, so a
// read allocates nothing; one goroutine at a time uses a Reader.
type Reader struct {
	v vectors // per platform
}

// Read copies len(dst) bytes at address addr of process pid into dst.
func (r *Reader) Read(pid int, dst []byte, addr uintptr) error {
	return r.v.transfer(pid, dst, addr, false)
}

// Writer writes other processes' memory, as Reader reads it.
type Writer struct {
	v vectors
}

// Write copies src to address addr of process pid.
func (w *Writer) Write(pid int, src []byte, addr uintptr) error {
	return w.v.transfer(pid, src, addr, true)
}

// transfer checks the arguments and copies local from (or, with write, to)
// the range at addr of process pid.
func (v *vectors) transfer(pid int, local []byte, addr uintptr, write bool) error {
	if len(local) == 0 {
		return nil
	}
	if pid <= 0 || addr == 0 {
		op := "read"
		if write {
			op = "write"
		}
		return fmt.Errorf("cma: %s of %d bytes at %#x of pid %d: no such process or address", op, len(local), addr, pid)
	}
	return v.move(pid, local, addr, write)
}

// Refused reports whether err says that this process may not read (or
// write) the other's memory at all (permission, the system call missing or
// filtered), as opposed to a process that is gone (ESRCH) or an address it
// does not map (EFAULT).
func Refused(err error) bool {
	return errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) ||
		errors.Is(err, syscall.ENOSYS) || errors.Is(err, ErrNotSupported) ||
		errors.Is(err, ErrRefused)
}
