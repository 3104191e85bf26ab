package p2p

import (
	"bytes"
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// probePVM checks that process_vm_readv reads the peer's token at the
// address its metadata gives: permission (same user and Yama's
// ptrace_scope, or CAP_SYS_PTRACE) and the right process at once.
func probePVM(pid int, addr uint64, token []byte) error {
	if pid <= 0 || addr == 0 {
		return errors.New("no probe address")
	}
	got := make([]byte, len(token))
	liov := []unix.Iovec{{Base: &got[0]}}
	liov[0].SetLen(len(got))
	n, err := unix.ProcessVMReadv(pid, liov,
		[]unix.RemoteIovec{{Base: uintptr(addr), Len: len(got)}}, 0)
	if err != nil {
		return fmt.Errorf("process_vm_readv: %w", err)
	}
	if n != len(token) || !bytes.Equal(got, token) {
		return errors.New("process_vm_readv read another process's memory (pid reused or not the same host)")
	}
	return nil
}

// pvmCopy copies between local memory and the peer's, in one system call
// per batch of up to 1024 pieces. write: local to remote.
func pvmCopy(pid int, write bool, local [][]byte, remote []uint64) error {
	const batch = 1024
	liov := make([]unix.Iovec, 0, min(batch, len(local)))
	riov := make([]unix.RemoteIovec, 0, min(batch, len(local)))
	for start := 0; start < len(local); start += batch {
		end := min(start+batch, len(local))
		liov, riov = liov[:0], riov[:0]
		want := 0
		for i := start; i < end; i++ {
			if len(local[i]) == 0 {
				continue
			}
			v := unix.Iovec{Base: &local[i][0]}
			v.SetLen(len(local[i]))
			liov = append(liov, v)
			riov = append(riov, unix.RemoteIovec{Base: uintptr(remote[i]), Len: len(local[i])})
			want += len(local[i])
		}
		for want > 0 {
			var n int
			var err error
			if write {
				n, err = unix.ProcessVMWritev(pid, liov, riov, 0)
			} else {
				n, err = unix.ProcessVMReadv(pid, liov, riov, 0)
			}
			if err != nil {
				return fmt.Errorf("process_vm_%sv: %w", map[bool]string{true: "write", false: "read"}[write], err)
			}
			if n == 0 {
				return errors.New("process_vm: no progress")
			}
			want -= n
			liov, riov = advanceIov(liov, riov, n)
		}
	}
	return nil
}

// advanceIov drops n copied bytes from the front of both lists (a partial
// transfer stops at an iovec boundary, but be general).
func advanceIov(l []unix.Iovec, r []unix.RemoteIovec, n int) ([]unix.Iovec, []unix.RemoteIovec) {
	for n > 0 && len(l) > 0 {
		k := min(n, r[0].Len)
		if k == r[0].Len {
			l, r = l[1:], r[1:]
		} else {
			l[0].Base = (*byte)(unsafe.Add(unsafe.Pointer(l[0].Base), k))
			l[0].SetLen(r[0].Len - k)
			r[0].Base += uintptr(k)
			r[0].Len -= k
		}
		n -= k
	}
	return l, r
}
