package tcp

import (
	"io"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// The data path owns its sockets' descriptors. The net package is used to
// listen, dial and run the handshake; then the descriptor is taken out of
// Go's netpoller, because an idle runtime thread blocked in the netpoller
// (there is one whenever the process has a pending timer) would be woken by
// every segment that arrives, costing a context switch per message while the
// rank is busy polling the socket itself. Background progress instead goes
// through one epoll set per endpoint, armed only when it is needed.

const supported = true

// detachFD takes the socket of c out of the net package: it returns a
// duplicate of its descriptor (non-blocking, close-on-exec) and closes c,
// which removes the original from Go's netpoller without ending the
// connection.
func detachFD(c *net.TCPConn) (int, error) {
	raw, err := c.SyscallConn()
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
	c.Close()
	// O_NONBLOCK lives in the open file, which the duplicate shares; set it
	// anyway so the data path can never block.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

func closeFD(fd int) { _ = unix.Close(fd) }

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
// descriptor.
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

// Interest bits for poller.arm.
const (
	wantRead  = unix.EPOLLIN | unix.EPOLLRDHUP
	wantWrite = unix.EPOLLOUT
)

// poller is an endpoint's epoll set plus an eventfd that stops its wait.
// Every socket is registered one-shot: after an event fires, the socket
// reports nothing until it is armed again, so a socket whose data nobody
// can take yet (a full receive window) never spins the watcher.
type poller struct {
	epfd, evfd int
	events     []unix.EpollEvent
}

// pollEvent is what wait reports: the peer and stream of a socket, and
// whether it is readable, writable or broken.
type pollEvent struct {
	peer, stream       int
	readable, writable bool
	hangup             bool
	wake               bool // the eventfd: stop or re-check
}

func newPoller() (*poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	evfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, err
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: -1}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, evfd, &ev); err != nil {
		unix.Close(epfd)
		unix.Close(evfd)
		return nil, err
	}
	return &poller{epfd: epfd, evfd: evfd, events: make([]unix.EpollEvent, 64)}, nil
}

// add registers a socket, disarmed.
func (p *poller) add(fd, peer, stream int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLONESHOT, Fd: int32(peer), Pad: int32(stream)}
	return unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, fd, &ev)
}

// arm sets a registered socket's interest (wantRead, wantWrite or both) for
// one event. Errors and hang-ups are reported whenever it is armed.
func (p *poller) arm(fd, peer, stream int, want uint32) error {
	ev := unix.EpollEvent{Events: want | unix.EPOLLONESHOT, Fd: int32(peer), Pad: int32(stream)}
	return unix.EpollCtl(p.epfd, unix.EPOLL_CTL_MOD, fd, &ev)
}

// wait blocks until sockets have events, and returns them.
func (p *poller) wait(out []pollEvent) ([]pollEvent, error) {
	for {
		n, err := unix.EpollWait(p.epfd, p.events, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return out, err
		}
		for _, ev := range p.events[:n] {
			if ev.Fd < 0 {
				var buf [8]byte
				_, _ = unix.Read(p.evfd, buf[:])
				out = append(out, pollEvent{wake: true})
				continue
			}
			out = append(out, pollEvent{
				peer: int(ev.Fd), stream: int(ev.Pad),
				readable: ev.Events&(unix.EPOLLIN|unix.EPOLLRDHUP) != 0,
				writable: ev.Events&unix.EPOLLOUT != 0,
				hangup:   ev.Events&(unix.EPOLLHUP|unix.EPOLLERR) != 0,
			})
		}
		return out, nil
	}
}

// wake makes a wait return with a wake event.
func (p *poller) wake() {
	one := [8]byte{1}
	_, _ = unix.Write(p.evfd, one[:])
}

func (p *poller) close() {
	unix.Close(p.epfd)
	unix.Close(p.evfd)
}
