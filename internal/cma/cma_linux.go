package cma

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// vectors are one transfer's local and remote ranges, kept so that a
// transfer allocates nothing.
type vectors struct {
	local  [1]unix.Iovec
	remote [1]unix.RemoteIovec
}

// move copies between local and the remote range at addr, in the direction
// write says, resuming after partial transfers.
func (v *vectors) move(pid int, local []byte, addr uintptr, write bool) error {
	call := "process_vm_readv"
	if write {
		call = "process_vm_writev"
	}
	for done := 0; done < len(local); {
		rest := local[done:]
		v.local[0] = unix.Iovec{Base: &rest[0]}
		v.local[0].SetLen(len(rest))
		v.remote[0] = unix.RemoteIovec{Base: addr + uintptr(done), Len: len(rest)}
		var n int
		var err error
		if write {
			n, err = unix.ProcessVMWritev(pid, v.local[:], v.remote[:], 0)
		} else {
			n, err = unix.ProcessVMReadv(pid, v.local[:], v.remote[:], 0)
		}
		v.local[0].Base = nil // local need not stay reachable from v
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("cma: %s of %d bytes at %#x of pid %d: %w", call, len(rest), addr+uintptr(done), pid, err)
		}
		if n <= 0 {
			return fmt.Errorf("cma: %s of %d bytes at %#x of pid %d moved nothing", call, len(rest), addr+uintptr(done), pid)
		}
		done += n
	}
	return nil
}

// Supported: the system call exists on this kernel (a sandbox may still
// refuse it for some processes: see Refused).
const Supported = true
