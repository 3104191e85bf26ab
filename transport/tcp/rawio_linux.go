//go:build unix

package tcp

import (
	"io"
	"syscall"

	"golang.org/x/sys/unix"
)

// The data path reads and writes the sockets' descriptors directly, without
// the net package's locks, so that the owner's inline polls and the
// background goroutines parked in the netpoller (which hold those locks
// while they wait) can share a socket. Every socket is non-blocking: the
// netpoller made it so.

// sockFD returns the descriptor of a connection. It stays valid until the
// connection is closed, which the peer only does once no pass can run.
func sockFD(raw syscall.RawConn) (int, error) {
	fd := -1
	if err := raw.Control(func(f uintptr) { fd = int(f) }); err != nil {
		return -1, err
	}
	return fd, nil
}

func readFD(fd int, p []byte) (int, error) {
	for {
		n, err := unix.Read(fd, p)
		switch {
		case err == nil && n == 0 && len(p) > 0:
			return 0, io.EOF
		case err == nil:
			return n, nil
		case err == unix.EAGAIN:
			return 0, errWouldBlock
		case err == unix.EINTR:
			continue
		}
		return 0, err
	}
}

// writeFD writes hdr then payload with one system call.
func writeFD(fd int, hdr, payload []byte) (int, error) {
	for {
		var n int
		var err error
		if len(hdr) == 0 {
			n, err = unix.Write(fd, payload)
		} else {
			n, err = unix.Writev(fd, [][]byte{hdr, payload})
		}
		switch {
		case err == nil:
			return n, nil
		case err == unix.EAGAIN:
			return 0, errWouldBlock
		case err == unix.EINTR:
			continue
		}
		return 0, err
	}
}

// shutdownFD ends both directions of a socket without closing its
// descriptor, which wakes every goroutine parked on it.
func shutdownFD(fd int) { _ = unix.Shutdown(fd, unix.SHUT_RDWR) }

// setSocketBuffers asks for large kernel buffers (capped by
// net.core.[rw]mem_max), so a whole slot fits in flight.
func setSocketBuffers(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		for _, opt := range []int{unix.SO_SNDBUF, unix.SO_RCVBUF} {
			if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, socketBufferSize); e != nil && serr == nil {
				serr = e
			}
		}
	})
	if err != nil {
		return err
	}
	return serr
}

const supported = true
