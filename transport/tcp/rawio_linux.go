package tcp

import (
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gccl/gccl/internal/netfd"
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
	fd, err := netfd.Dup(c)
	if err != nil {
		return -1, err
	}
	c.Close()
	return fd, nil
}

func closeFD(fd int) { _ = unix.Close(fd) }

// readFD and writeFD make their system calls themselves rather than through
// unix.Read and unix.Writev, whose race annotations put the kernel's
// accesses outside the happens-before they record (the read of the sent
// buffer after the release, the write of the received one before the
// acquire): a message that comes back around a ring into the memory it was
// sent from, as in an in-place all-reduce, would show as a race. See
// raceSent and raceReceived.
//
// They are raw system calls, outside the scheduler's bookkeeping: the
// descriptors are non-blocking, so a call never waits, and a large write's
// copy is work like any other. Through entersyscall, a write of a slot
// (hundreds of µs on loopback) let the runtime's monitor take the rank's P
// and kept it waking every 20 µs, and the rank's thread was preempted on
// its way out of the call: about two context switches per 1 MiB broadcast
// (docs/PERFORMANCE.md, "Raw system calls on the TCP data path").

func readFD(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		n, _, errno := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		switch {
		case errno == 0 && n == 0:
			return 0, io.EOF
		case errno == 0:
			raceReceived(p[:n])
			return int(n), nil
		case errno == unix.EAGAIN:
			return 0, errWouldBlock
		case errno == unix.EINTR:
			continue
		}
		return 0, errno
	}
}

// writeFD writes hdr then payload with one system call.
func writeFD(fd int, hdr, payload []byte) (int, error) {
	var iov [2]unix.Iovec
	k := 0
	for _, b := range [2][]byte{hdr, payload} {
		if len(b) > 0 {
			iov[k].Base = &b[0]
			iov[k].SetLen(len(b))
			k++
		}
	}
	if k == 0 {
		return 0, nil
	}
	raceSent(hdr, payload)
	for {
		n, _, errno := unix.RawSyscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(k))
		switch errno {
		case 0:
			return int(n), nil
		case unix.EAGAIN:
			return 0, errWouldBlock
		case unix.EINTR:
			continue
		}
		return 0, errno
	}
}

// shutdownFD ends both directions of a socket without closing its
// descriptor.
func shutdownFD(fd int) { _ = unix.Shutdown(fd, unix.SHUT_RDWR) }

// TCP states as TCP_INFO reports them (include/net/tcp_states.h).
const (
	tcpFinWait2 = 5
	tcpTimeWait = 6
	tcpClose    = 7
)

// lingerFDs ends the sending direction of every socket, so each peer reads
// what was queued and then the end of the stream, and reads and discards
// what arrives until every socket is finished or the deadline passes. Only
// then may the sockets be closed: close(2) on a socket with unread data
// resets the connection (RST instead of FIN), which throws away what the
// socket still had to send, and so does data that arrives after close.
//
// A socket is finished when the peer ended its side (end of stream: it
// sends nothing more) or the connection broke, or when the peer's kernel has
// acknowledged everything this side sent, the end of stream included
// (FIN_WAIT2): from then on a reset can no longer take anything from the
// peer, which reads its queued data and the end of stream first.
func lingerFDs(fds []int, deadline time.Time) {
	buf := make([]byte, 64<<10)
	pending := make([]unix.PollFd, 0, len(fds))
	for _, fd := range fds {
		_ = unix.Shutdown(fd, unix.SHUT_WR)
		pending = append(pending, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP})
	}
	// Arriving data and the end of stream wake the poll; the peer's
	// acknowledgement does not (a socket shut for writing always polls
	// writable), so the poll also times out, more rarely as time goes on.
	pause := 50 * time.Microsecond
	for {
		keep := pending[:0]
		for _, pfd := range pending {
			if !lingerDone(int(pfd.Fd), buf) {
				keep = append(keep, pfd)
			}
		}
		pending = keep
		left := time.Until(deadline)
		if len(pending) == 0 || left <= 0 {
			break
		}
		ts := unix.NsecToTimespec(int64(min(pause, left)))
		_, _ = unix.Ppoll(pending, &ts, nil)
		pause = min(2*pause, 10*time.Millisecond)
	}
	// Past the deadline: leave nothing unread that would turn close into
	// a reset.
	for _, fd := range fds {
		discardFD(fd, buf)
	}
}

// lingerDone discards what socket fd has received and reports whether it
// is finished (see lingerFDs).
func lingerDone(fd int, buf []byte) bool {
	switch err := discardFD(fd, buf); err {
	case unix.EAGAIN:
	case nil:
		return false // the peer keeps sending; come back after the others
	default:
		return true // end of stream, or the connection broke
	}
	info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		return false // wait for the end of stream
	}
	switch info.State {
	case tcpFinWait2, tcpTimeWait, tcpClose:
		return true
	}
	return false
}

// discardFD reads and drops what socket fd has received, a bounded amount
// at a time. It returns unix.EAGAIN once nothing is left, io.EOF at the end
// of the stream, the error that broke the connection, or nil if data is
// still coming.
func discardFD(fd int, buf []byte) error {
	for range 64 {
		n, err := unix.Read(fd, buf)
		switch {
		case err == unix.EINTR:
		case err != nil:
			return err
		case n == 0:
			return io.EOF
		}
	}
	return nil
}

// setSocketBuffers asks for socketBufferSize kernel buffers where the kernel
// grants that much (net.core.wmem_max and rmem_max), so a whole slot fits in
// flight. Where it would grant less, the socket keeps the kernel's automatic
// sizing instead: asking for a size turns that off for the socket, and under
// the default caps (208 KiB) would pin each buffer far below what automatic
// sizing reaches (net.ipv4.tcp_wmem and tcp_rmem maxima, 4 and 6 MiB by
// default), too small for a fast link's bandwidth-delay product.
func setSocketBuffers(_, _ string, c syscall.RawConn) error {
	snd, rcv := socketBufferCaps()
	var opts []int
	if askBufferSize(snd) {
		opts = append(opts, unix.SO_SNDBUF)
	}
	if askBufferSize(rcv) {
		opts = append(opts, unix.SO_RCVBUF)
	}
	if len(opts) == 0 {
		return nil
	}
	var serr error
	err := c.Control(func(fd uintptr) {
		for _, opt := range opts {
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

// askBufferSize reports whether to ask for socketBufferSize given the
// kernel's cap on asked-for sizes (-1: unknown, then ask as before).
func askBufferSize(limit int) bool { return limit < 0 || limit >= socketBufferSize }

// socketBufferCaps returns net.core.wmem_max and rmem_max, -1 where
// unreadable. A variable so that tests can pretend other caps.
var socketBufferCaps = sync.OnceValues(func() (snd, rcv int) {
	return readSysctlInt("/proc/sys/net/core/wmem_max"), readSysctlInt("/proc/sys/net/core/rmem_max")
})

func readSysctlInt(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return n
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
