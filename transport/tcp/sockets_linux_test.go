package tcp

import (
	"bytes"
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/gccl/gccl/internal/testutil"
	"github.com/gccl/gccl/transport"

	"golang.org/x/sys/unix"
)

// TestStripingUsesEveryStream checks with the kernel's own counters that a
// large message travels over all streams, in about equal parts, and a
// small one over stream 0 only.
func TestStripingUsesEveryStream(t *testing.T) {
	const streams, n = 3, stripeMin * 3
	eps := connectWorld(t, 2, testConfig(n, 2, streams))
	p := eps[1].peers[0].Load()
	received := func() (out [streams]uint64) {
		for j, fd := range p.fds {
			info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
			if err != nil {
				t.Skipf("TCP_INFO: %v", err)
			}
			out[j] = info.Bytes_received
		}
		return out
	}
	before := received()
	send(t, eps[0], 1, pattern(0, 0, n), 1)
	recv(t, eps[1], 0)
	after := received()
	if after == before {
		// The message arrived, so some stream carried it: this TCP_INFO
		// has no tcpi_bytes_received (Linux before 4.19, or qemu-user's
		// translation of the call).
		t.Skip("TCP_INFO does not count received bytes here")
	}
	for j := range after {
		got := after[j] - before[j]
		lo, hi := pieceRange(n, streams, j)
		want := uint64(hi - lo)
		if j == 0 {
			want += frameHeaderLen
		}
		if got != want {
			t.Errorf("stream %d carried %d bytes of a %d-byte message, want %d", j, got, n, want)
		}
	}
	before = received()
	send(t, eps[0], 1, pattern(0, 1, stripeMin-1), 2)
	recv(t, eps[1], 0)
	after = received()
	if d := after[0] - before[0]; d != stripeMin-1+frameHeaderLen || after[1] != before[1] || after[2] != before[2] {
		t.Errorf("a message below the striping threshold moved %v bytes per stream", [3]uint64{after[0] - before[0], after[1] - before[1], after[2] - before[2]})
	}
}

func TestIPv6(t *testing.T) {
	if ifs, err := SelectInterfaces("=lo"); err != nil || !slices.ContainsFunc(ifs[0].Addrs, netip.Addr.Is6) {
		t.Skip("no IPv6 loopback address here")
	}
	t.Setenv("GCCL_SOCKET_FAMILY", "AF_INET6")
	eps := connectWorld(t, 2, testConfig(stripeMin*2, 2, 2))
	for j, fd := range eps[0].peers[1].Load().fds {
		sa, err := unix.Getsockname(fd)
		if _, v6 := sa.(*unix.SockaddrInet6); err != nil || !v6 {
			t.Fatalf("stream %d is bound to %#v (%v), want IPv6", j, sa, err)
		}
	}
	send(t, eps[0], 1, pattern(0, 0, stripeMin*2), 9)
	if m, tag := recv(t, eps[1], 0); tag != 9 || !bytes.Equal(m, pattern(0, 0, stripeMin*2)) {
		t.Fatal("striped message over IPv6 corrupt")
	}
}

// Close returns once the peer's kernel has everything (the end of stream
// included), without waiting for the peer to read it. Data the peer sends
// after that resets the connection; what the peer received before, the end
// of stream included, must stay readable.
func TestPeerSendsAfterClose(t *testing.T) {
	eps := connectWorld(t, 2, testConfig(4096, 4, 1))
	// Rank 1 must not notice the close by itself: it polls instead of
	// sleeping, so the watcher stops reading for it. Its socket is still
	// armed for one event from before, though, which would read the end of
	// the stream in the background if it fired late; a first message fires
	// it now, and the bell says when the watcher is through with it.
	seen := eps[1].Seq()
	eps[1].PrepareWait()
	r, err := eps[1].Receiver(0)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := r.TryNext(); ok || err != nil {
		t.Fatal(ok, err)
	}
	send(t, eps[0], 1, []byte("first"), 7)
	testutil.WaitFor(t, testTimeout, "the watcher never read the first message", func() bool { return eps[1].Seq() != seen })
	if m, tag, ok, err := r.TryNext(); !ok || err != nil || tag != 7 || string(m) != "first" {
		t.Fatalf("first message: %q tag %d, %v %v", m, tag, ok, err)
	}
	r.Release()
	for i := range 3 {
		send(t, eps[0], 1, pattern(0, i, 4096), transport.Tag(i))
	}
	start := time.Now()
	eps[0].Close()
	if d := time.Since(start); d >= closeLinger {
		t.Errorf("Close took %v though the peer's kernel took everything", d)
	}
	if err := trySend(eps[1], 0, []byte("late"), 1); err != nil {
		t.Fatalf("late send: %v", err)
	}
	fd := eps[1].peers[0].Load().fds[0]
	for i := 0; ; i++ {
		info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			t.Skipf("TCP_INFO: %v", err)
		}
		if info.State == tcpClose {
			break // reset
		}
		if i == 1000 {
			t.Fatalf("rank 1's socket is in state %d, not reset by the late data", info.State)
		}
		time.Sleep(time.Millisecond)
	}
	if err := expectRest(t, eps[1], 0, 0, 3, 4096); !errors.Is(err, transport.ErrPeerClosed) {
		t.Fatalf("after the last message: %v", err)
	}
}

// Sockets ask for socketBufferSize only where the kernel grants it; under
// smaller caps they keep the kernel's automatic sizing, which asking would
// turn off (and pin the buffers at the cap).
func TestSocketBuffersFollowTheKernelCaps(t *testing.T) {
	for _, c := range []struct {
		limit int
		ask   bool
	}{{-1, true}, {0, false}, {212992, false}, {socketBufferSize - 1, false}, {socketBufferSize, true}, {64 << 20, true}} {
		if got := askBufferSize(c.limit); got != c.ask {
			t.Errorf("askBufferSize(%d) = %v, want %v", c.limit, got, c.ask)
		}
	}
	snd, rcv := socketBufferCaps()
	if snd < socketBufferSize || rcv < socketBufferSize {
		t.Skipf("net.core.wmem_max %d and rmem_max %d: a host below %d cannot tell an asked-for size from the kernel's own", snd, rcv, socketBufferSize)
	}
	// Every socket of both ranks, as the kernel reports them: an asked-for
	// size comes back doubled (the kernel's allowance for its overhead).
	sizes := func(eps []*Endpoint) (out [][2]int) {
		for _, e := range eps {
			for _, p := range e.allPeers() {
				for _, fd := range p.fds {
					s, err1 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF)
					r, err2 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
					if err := errors.Join(err1, err2); err != nil {
						t.Fatal(err)
					}
					out = append(out, [2]int{s, r})
				}
			}
		}
		return out
	}
	asked := 2 * socketBufferSize
	t.Run("asked", func(t *testing.T) {
		for _, sr := range sizes(connectWorld(t, 2, testConfig(4096, 2, 2))) {
			if sr != [2]int{asked, asked} {
				t.Errorf("caps allow %d: socket buffers %v, want both %d", socketBufferSize, sr, asked)
			}
		}
	})
	t.Run("automatic", func(t *testing.T) {
		defer func(f func() (int, int)) { socketBufferCaps = f }(socketBufferCaps)
		socketBufferCaps = func() (int, int) { return 212992, 212992 }
		for _, sr := range sizes(connectWorld(t, 2, testConfig(4096, 2, 2))) {
			if sr[0] == asked || sr[1] == asked {
				t.Errorf("caps of 208 KiB: socket buffers %v, want the kernel's own sizes", sr)
			}
		}
	})
}
