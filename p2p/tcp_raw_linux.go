//go:build linux && !race

package p2p

import (
	"syscall"
	"unsafe"
)

// rawRead and rawPeek never block (the socket is nonblocking), so they
// skip the scheduler's system-call bookkeeping: a poll in a spin is one
// such call per round, and going through entersyscall kept the runtime's
// monitor thread waking every 20 µs to look at it (15% of the CPU of a
// 4 KiB round-trip benchmark on a 2-vCPU VM). Race builds use the
// syscall package instead: its reads and writes tell the race detector
// that what one side wrote before sending is seen by the side that read.

func rawRead(fd uintptr, b []byte) (int, error) {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(p), uintptr(len(b)))
	if e != 0 {
		return -1, e
	}
	return int(n), nil
}

// rawPeek reports whether the socket has bytes (or an end or error) to
// read, without taking them.
func rawPeek(fd uintptr) bool {
	var b [1]byte
	for {
		_, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
			syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		if e != syscall.EINTR {
			return e != syscall.EAGAIN
		}
	}
}
