//go:build linux

package p2p

import (
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gccl/gccl/internal/netfd"
)

// fdConn is a tcp backend connection taken out of Go's netpoller after
// its handshake. Why: the runtime keeps an idle thread blocked in
// epoll_pwait whenever a goroutine waits in the netpoller or a timer is
// armed, and every segment that reaches a socket in its set wakes that
// thread, even when nobody waits for the socket because a spinning
// goroutine reads it. On a 2-vCPU VM a 4 KiB round trip paid about 1.3
// such wake-ups, each taking a core from one of the two spinners
// (docs/P2P.md, "Out of the netpoller").
//
// The socket sits instead in two epoll sets of its own, one for read
// waits and one for write waits, with its interest switched on only while
// a goroutine waits on it, and it is those sets that are in the netpoller:
// a set polls readable only when its socket is ready for an interest that
// is on, so segments that a spinning goroutine reads wake nobody. A waiter
// that reads its answer itself (tcp_progress.go) switches the parked
// reader's interest off meanwhile (pauseReader), and back on after, level-
// triggered, so that bytes it left wake the reader then. Goroutines sleep
// in the netpoller as before, and deadlines are the netpoller's.
type fdConn struct {
	fd            int
	local, remote net.Addr
	rd, wr        waitSet

	// Operations hold refs for reading while they use fd; Close takes it
	// for writing to close fd once they are out.
	refs   sync.RWMutex
	closed atomic.Bool
	once   sync.Once

	mu      sync.Mutex // the read set's interest and what decides it
	pauses  int        // waiters that want the reading role
	parked  bool       // the reader waits for the role's next frame
	holding bool       // the role's holder waits for more bytes
}

// waitSet is an epoll set holding the socket, registered in the
// netpoller through an os.File.
type waitSet struct {
	ep     int
	file   *os.File
	raw    syscall.RawConn
	events uint32             // the socket's interest when on
	on     atomic.Bool        // the interest is on (written under fdConn.mu)
	ready  func(uintptr) bool // made once: a closure per wait would allocate
}

// keepNetpoll turns detaching off (GCCL_P2P_TCP_NETPOLL=1), to compare.
var keepNetpoll = os.Getenv("GCCL_P2P_TCP_NETPOLL") == "1"

// detachConn returns c as an fdConn, or c itself where it is not a plain
// socket (TLS, a pipe) or detaching is off.
func detachConn(c net.Conn) net.Conn {
	if keepNetpoll {
		return c
	}
	return detach(c)
}

func detach(c net.Conn) net.Conn {
	fd, err := netfd.Dup(c)
	if err != nil {
		return c
	}
	f, err := newFDConn(fd, c.LocalAddr(), c.RemoteAddr())
	if err != nil {
		unix.Close(fd)
		return c
	}
	// Closing c takes its descriptor out of the netpoller; the duplicate
	// keeps the connection.
	c.Close()
	return f
}

func asFDConn(c net.Conn) *fdConn {
	f, _ := c.(*fdConn)
	return f
}

func newFDConn(fd int, local, remote net.Addr) (*fdConn, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, err
	}
	f := &fdConn{fd: fd, local: local, remote: remote}
	if err := f.rd.open(fd, unix.EPOLLIN|unix.EPOLLRDHUP, "p2p-read-wait"); err != nil {
		return nil, err
	}
	if err := f.wr.open(fd, unix.EPOLLOUT, "p2p-write-wait"); err != nil {
		f.rd.close()
		return nil, err
	}
	return f, nil
}

func (w *waitSet) open(fd int, events uint32, name string) error {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	// Registered with no interest: only EPOLLHUP and EPOLLERR, which a
	// closed connection raises for its sleepers.
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Fd: int32(fd)}); err != nil {
		unix.Close(ep)
		return err
	}
	if err := unix.SetNonblock(ep, true); err != nil {
		unix.Close(ep)
		return err
	}
	w.ep, w.events = ep, events
	w.file = os.NewFile(uintptr(ep), name) // nonblocking: in the netpoller
	if w.raw, err = w.file.SyscallConn(); err != nil {
		w.file.Close()
		return err
	}
	w.ready = w.poll
	return nil
}

func (w *waitSet) close() { w.file.Close() }

// set switches the socket's interest in the set on or off.
func (w *waitSet) set(fd int, on bool) {
	if w.on.Load() == on {
		return
	}
	ev := unix.EpollEvent{Fd: int32(fd)}
	if on {
		ev.Events = w.events
	}
	_, _, e := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(w.ep), unix.EPOLL_CTL_MOD, uintptr(fd), uintptr(unsafe.Pointer(&ev)), 0, 0)
	if e == 0 {
		w.on.Store(on)
	}
}

// poll reports whether the set has an event (the socket is ready for an
// interest that is on, or hung up), without waiting.
func (w *waitSet) poll(uintptr) bool {
	var ev [1]unix.EpollEvent
	n, _, _ := unix.RawSyscall6(unix.SYS_EPOLL_WAIT, uintptr(w.ep), uintptr(unsafe.Pointer(&ev[0])), 1, 0, 0, 0)
	return int(n) > 0
}

// wait sleeps in the netpoller until the set polls ready, its deadline
// passes or the connection closes.
func (w *waitSet) wait() error { return w.raw.Read(w.ready) }

func (f *fdConn) LocalAddr() net.Addr  { return f.local }
func (f *fdConn) RemoteAddr() net.Addr { return f.remote }

// Close ends the connection: it wakes every sleeper, and closes the
// socket once no operation uses it.
func (f *fdConn) Close() error {
	f.once.Do(func() {
		f.closed.Store(true)
		unix.Shutdown(f.fd, unix.SHUT_RDWR)
		f.rd.close()
		f.wr.close()
		f.refs.Lock()
		unix.Close(f.fd)
		f.refs.Unlock()
	})
	return nil
}

func (f *fdConn) SetDeadline(t time.Time) error {
	f.SetReadDeadline(t)
	return f.SetWriteDeadline(t)
}

func (f *fdConn) SetReadDeadline(t time.Time) error {
	if f.closed.Load() {
		return net.ErrClosed
	}
	return f.rd.file.SetReadDeadline(t)
}

func (f *fdConn) SetWriteDeadline(t time.Time) error {
	if f.closed.Load() {
		return net.ErrClosed
	}
	return f.wr.file.SetReadDeadline(t)
}

// syncRead sets the read set's interest from what waits (under mu): the
// parked reader, unless a waiter reads for it, or the role's holder.
func (f *fdConn) syncRead() {
	f.rd.set(f.fd, f.holding || (f.parked && f.pauses == 0))
}

// pauseReader: a waiter wants the reading role; the parked reader must
// not wake for the bytes the waiter will read. resumeReader undoes it.
func (f *fdConn) pauseReader() {
	if f == nil {
		return
	}
	f.mu.Lock()
	f.pauses++
	f.syncRead()
	f.mu.Unlock()
}

func (f *fdConn) resumeReader() {
	if f == nil {
		return
	}
	f.mu.Lock()
	f.pauses--
	f.syncRead()
	f.mu.Unlock()
}

// waitRead sleeps until the socket has bytes (parked: for the reader
// without the role, which a waiter may pause). The role's holder, waiting
// for the rest of a frame, leaves the interest on after it: a payload that
// streams has more gaps to wait for, and the interest goes off when the
// holder next polls for a frame (quiet).
func (f *fdConn) waitRead(parked bool) error {
	f.mu.Lock()
	if parked {
		f.parked = true
	} else {
		f.holding = true
	}
	f.syncRead()
	f.mu.Unlock()
	err := f.rd.wait()
	f.mu.Lock()
	if parked {
		f.parked = false
		f.syncRead()
	} else {
		f.holding = false
	}
	f.mu.Unlock()
	return f.waitErr(err)
}

// quiet switches the read interest off before the role's holder polls
// for frames itself, so that what arrives meanwhile wakes nobody.
func (f *fdConn) quiet() {
	if f == nil || !f.rd.on.Load() {
		return
	}
	f.mu.Lock()
	f.syncRead()
	f.mu.Unlock()
}

// waitErr is a wait's error as a connection's: the sets' files report
// their own closing.
func (f *fdConn) waitErr(err error) error {
	if err != nil && f.closed.Load() {
		return net.ErrClosed
	}
	return err
}

// waitWrite sleeps until the socket has room (one writer at a time: the
// peer's writer lock).
func (f *fdConn) waitWrite() error {
	f.mu.Lock()
	f.wr.set(f.fd, true)
	f.mu.Unlock()
	err := f.wr.wait()
	f.mu.Lock()
	f.wr.set(f.fd, false)
	f.mu.Unlock()
	return f.waitErr(err)
}

func (f *fdConn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	f.refs.RLock()
	defer f.refs.RUnlock()
	for {
		if f.closed.Load() {
			return 0, net.ErrClosed
		}
		n, err := rawRead(uintptr(f.fd), b)
		switch {
		case err == nil && n == 0:
			return 0, io.EOF
		case err == nil:
			return n, nil
		case err == syscall.EINTR:
			continue
		case err != syscall.EAGAIN:
			return 0, os.NewSyscallError("read", err)
		}
		if err := f.waitRead(false); err != nil {
			return 0, err
		}
	}
}

func (f *fdConn) Write(b []byte) (int, error) {
	f.refs.RLock()
	defer f.refs.RUnlock()
	n := 0
	for n < len(b) {
		if f.closed.Load() {
			return n, net.ErrClosed
		}
		k, err := rawWrite(uintptr(f.fd), b[n:])
		if k > 0 {
			n += k
		}
		switch {
		case err == nil, err == syscall.EINTR:
			continue
		case err != syscall.EAGAIN:
			return n, os.NewSyscallError("write", err)
		}
		if err := f.waitWrite(); err != nil {
			return n, err
		}
	}
	return n, nil
}

func (f *fdConn) SyscallConn() (syscall.RawConn, error) { return fdRaw{f}, nil }

// fdRaw is syscall.RawConn over an fdConn. Read is the parked reader's:
// between calls of its function it sleeps as pauseReader allows.
type fdRaw struct{ f *fdConn }

func (r fdRaw) Control(fn func(uintptr)) error {
	f := r.f
	f.refs.RLock()
	defer f.refs.RUnlock()
	if f.closed.Load() {
		return net.ErrClosed
	}
	fn(uintptr(f.fd))
	return nil
}

func (r fdRaw) Read(fn func(uintptr) bool) error {
	return r.f.until(fn, func() error { return r.f.waitRead(true) })
}

func (r fdRaw) Write(fn func(uintptr) bool) error { return r.f.until(fn, r.f.waitWrite) }

// until calls fn until it returns true, sleeping in wait between calls.
func (f *fdConn) until(fn func(uintptr) bool, wait func() error) error {
	f.refs.RLock()
	defer f.refs.RUnlock()
	for {
		if f.closed.Load() {
			return net.ErrClosed
		}
		if fn(uintptr(f.fd)) {
			return nil
		}
		if err := wait(); err != nil {
			return err
		}
	}
}
