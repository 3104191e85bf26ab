//go:build unix

package main

import (
	"io"
	"net"
	"syscall"
)

// nonblocking returns non-blocking duplicates of the connections'
// descriptors (they stay open with the connections).
func nonblocking(conns []net.Conn) ([]int, error) {
	fds := make([]int, len(conns))
	for i, c := range conns {
		f, err := c.(*net.TCPConn).File()
		if err != nil {
			return nil, err
		}
		fds[i] = int(f.Fd())
		if err := syscall.SetNonblock(fds[i], true); err != nil {
			return nil, err
		}
	}
	return fds, nil
}

// pollParts reads one message, each socket's part into its place in buf,
// polling every socket whose part is incomplete until all are.
func pollParts(fds []int, buf []byte) error {
	var offs [64]int
	left := len(fds)
	for left > 0 {
		for i, fd := range fds {
			p := part(buf, len(fds), i)
			if offs[i] == len(p) {
				continue
			}
			n, err := syscall.Read(fd, p[offs[i]:])
			switch {
			case err == syscall.EAGAIN || err == syscall.EINTR:
				continue
			case err != nil:
				return err
			case n == 0:
				return io.ErrUnexpectedEOF
			}
			if offs[i] += n; offs[i] == len(p) {
				left--
			}
		}
	}
	return nil
}
