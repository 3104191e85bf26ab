//go:build unix

package netfd

import (
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

func dup(c net.Conn) (int, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1, fmt.Errorf("netfd: %T has no descriptor", c)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := raw.Control(func(f uintptr) {
		fd, derr = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, derr
	}
	// O_NONBLOCK lives in the open file, which the duplicate shares with
	// the original; set it anyway, so that a caller's raw system calls can
	// never block, whatever the net package did to it.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}
