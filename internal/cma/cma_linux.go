package cma

import (
	"fmt"

	"golang.org/x/sys/unix"
)

type reader struct {
	local  [1]unix.Iovec
	remote [1]unix.RemoteIovec
}

func (r *reader) read(pid int, dst []byte, addr uintptr) error {
	for done := 0; done < len(dst); {
		rest := dst[done:]
		r.local[0] = unix.Iovec{Base: &rest[0]}
		r.local[0].SetLen(len(rest))
		r.remote[0] = unix.RemoteIovec{Base: addr + uintptr(done), Len: len(rest)}
		n, err := unix.ProcessVMReadv(pid, r.local[:], r.remote[:], 0)
		r.local[0].Base = nil // dst need not stay reachable from r
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("cma: process_vm_readv of %d bytes at %#x of pid %d: %w", len(rest), addr+uintptr(done), pid, err)
		}
		if n <= 0 {
			return fmt.Errorf("cma: process_vm_readv of %d bytes at %#x of pid %d read nothing", len(rest), addr+uintptr(done), pid)
		}
		done += n
	}
	return nil
}

// Supported: the system call exists on this kernel (a sandbox may still
// refuse it for some processes: see Refused).
const Supported = true
