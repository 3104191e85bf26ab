//go:build unix

package netfd_test

import (
	"io"
	"net"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gccl/gccl/internal/netfd"
	"github.com/gccl/gccl/internal/testutil"
)

// The duplicate keeps the connection: bytes flow both ways after the
// net.Conn is closed, and the descriptor is non-blocking and
// close-on-exec.
func TestDupKeepsTheConnection(t *testing.T) {
	c, peer := testutil.TCPPair(t)

	fd, err := netfd.Dup(c)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	// Closing the net.Conn ends its descriptor, not the connection.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil || fl&unix.O_NONBLOCK == 0 {
		t.Fatalf("descriptor flags %#x, %v: want O_NONBLOCK", fl, err)
	}
	fdfl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil || fdfl&unix.FD_CLOEXEC == 0 {
		t.Fatalf("descriptor flags %#x, %v: want FD_CLOEXEC", fdfl, err)
	}
	var buf [8]byte
	if _, err := unix.Read(fd, buf[:]); err != unix.EAGAIN {
		t.Fatalf("read on an idle detached socket: %v, want EAGAIN", err)
	}
	if _, err := peer.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	// The reader's wait, bounded: poll(2) for the bytes, then read them.
	got := 0
	for got < 4 {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if k, err := unix.Poll(pfd, 5000); err != nil || k == 0 {
			t.Fatalf("poll: %d, %v: the peer's bytes did not arrive", k, err)
		}
		n, err := unix.Read(fd, buf[got:4])
		if err != nil && err != unix.EAGAIN {
			t.Fatal(err)
		}
		got += max(n, 0)
	}
	if string(buf[:4]) != "ping" {
		t.Fatalf("read %q, want ping", buf[:4])
	}
	if _, err := unix.Write(fd, []byte("pong")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(peer, buf[:4]); err != nil || string(buf[:4]) != "pong" {
		t.Fatalf("peer read %q, %v, want pong", buf[:4], err)
	}
}

// A connection without a descriptor is refused and left open.
func TestDupRefusesAPipe(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	if _, err := netfd.Dup(a); err == nil {
		t.Fatal("Dup of a net.Pipe end succeeded")
	}
	go b.Read(make([]byte, 1))
	if _, err := a.Write([]byte("x")); err != nil {
		t.Fatalf("the pipe was closed by a failed Dup: %v", err)
	}
	a.Close()
}
