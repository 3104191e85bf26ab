//go:build unix && (!linux || race)

package p2p

import "syscall"

func rawRead(fd uintptr, b []byte) (int, error) { return syscall.Read(int(fd), b) }

// rawPeek reports whether the socket has bytes (or an end or error) to
// read, without taking them.
func rawPeek(fd uintptr) bool {
	var b [1]byte
	for {
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		if err != syscall.EINTR {
			return err != syscall.EAGAIN
		}
	}
}
