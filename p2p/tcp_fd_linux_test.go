//go:build linux

package p2p

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gccl/gccl/internal/testutil"
)

// fdPair returns a loopback connection taken out of the netpoller and its
// other end, a plain *net.TCPConn.
func fdPair(t *testing.T) (*fdConn, net.Conn) {
	t.Helper()
	c, other := testutil.TCPPair(t)
	f := asFDConn(detach(c))
	if f == nil {
		t.Fatal("a loopback TCP connection was not detached")
	}
	t.Cleanup(func() { f.Close() })
	return f, other
}

func TestFDConnReadWrite(t *testing.T) {
	f, other := fdPair(t)
	go other.Write([]byte("hello"))
	b := make([]byte, 5)
	if _, err := io.ReadFull(f, b); err != nil || string(b) != "hello" {
		t.Fatalf("Read = %q, %v", b, err)
	}
	if _, err := f.Write([]byte("back")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(other, b[:4]); err != nil || string(b[:4]) != "back" {
		t.Fatalf("the other end read %q, %v", b[:4], err)
	}
	other.Close()
	if n, err := f.Read(b); n != 0 || err != io.EOF {
		t.Fatalf("Read after the other end closed = %d, %v; want 0, EOF", n, err)
	}
}

// TestFDConnPausedReaderSleeps: while a waiter holds the reader's interest
// off, bytes that arrive do not wake the parked reader; resuming does.
func TestFDConnPausedReaderSleeps(t *testing.T) {
	f, other := fdPair(t)
	raw, _ := f.SyscallConn()
	var calls atomic.Int32
	done := make(chan error, 1)
	f.pauseReader()
	go func() {
		done <- raw.Read(func(fd uintptr) bool {
			calls.Add(1)
			return rawPeek(fd)
		})
	}()
	for calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // the reader parks
	if _, err := other.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("the paused reader woke for the bytes (%v, %d calls)", err, calls.Load())
	case <-time.After(100 * time.Millisecond):
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the paused reader looked %d times, want 1", n)
	}
	f.resumeReader()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the reader did not wake after resumeReader with bytes waiting")
	}
}

// TestFDConnDeadlines: a read deadline in the past wakes a parked reader
// (the nudge of tcp_progress.go); reads and writes past their deadlines
// fail with os.ErrDeadlineExceeded.
func TestFDConnDeadlines(t *testing.T) {
	f, _ := fdPair(t)
	raw, _ := f.SyscallConn()
	done := make(chan error, 1)
	go func() { done <- raw.Read(func(uintptr) bool { return false }) }()
	time.Sleep(20 * time.Millisecond)
	f.SetReadDeadline(time.Unix(1, 0))
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("nudged reader: %v, want a deadline error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a read deadline in the past did not wake the parked reader")
	}
	f.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := f.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past its deadline: %v", err)
	}
	f.SetReadDeadline(time.Time{})

	// The other end does not read: fill the socket, then time out.
	f.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	big := make([]byte, 64<<20)
	n, err := f.Write(big)
	if !errors.Is(err, os.ErrDeadlineExceeded) || n == 0 || n == len(big) {
		t.Fatalf("Write to a peer that does not read: %d of %d bytes, %v; want some, then a deadline error", n, len(big), err)
	}
}

// TestFDConnCloseWakesSleepers: Close ends a parked reader, a blocked
// Read and a blocked Write with net.ErrClosed.
func TestFDConnCloseWakesSleepers(t *testing.T) {
	f, _ := fdPair(t)
	raw, _ := f.SyscallConn()
	errs := make(chan error, 3)
	f.pauseReader() // a paused reader too
	go func() { errs <- raw.Read(func(uintptr) bool { return false }) }()
	go func() {
		_, err := f.Read(make([]byte, 1))
		errs <- err
	}()
	go func() {
		_, err := f.Write(make([]byte, 64<<20))
		errs <- err
	}()
	time.Sleep(50 * time.Millisecond)
	f.Close()
	for range 3 {
		select {
		case err := <-errs:
			if !errors.Is(err, net.ErrClosed) {
				t.Errorf("after Close: %v, want net.ErrClosed", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not wake a sleeper")
		}
	}
	if _, err := f.Write([]byte{1}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close: %v", err)
	}
}

// TestAgentConnectionsLeaveTheNetpoller: both ends of a tcp connection
// between two agents run over fdConns (unless GCCL_P2P_TCP_NETPOLL=1),
// and a WRITE with a notification and a READ go through them.
func TestAgentConnectionsLeaveTheNetpoller(t *testing.T) {
	if keepNetpoll {
		t.Skip("GCCL_P2P_TCP_NETPOLL=1")
	}
	a, b := pair(t, Config{DisableSHM: true, DisablePVM: true})
	const size = 4096
	tr, _ := b.RegisterMem(make([]byte, size))
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	src := make([]byte, size)
	fill(src, 5)
	lr, _ := a.RegisterMem(src)
	for _, op := range []Op{Write, Read} {
		req, err := a.CreateRequest(op, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, size)}}, "b",
			DescList{Type: DRAM, Descs: []Desc{tr.Desc(0, size)}}, &RequestOptions{Notif: []byte("n")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := req.Post(); err != nil {
			t.Fatal(err)
		}
		if err := req.Wait(ctxT(t)); err != nil {
			t.Fatalf("%v: %v", op, err)
		}
		req.Release()
		if n, err := b.WaitNotifs(ctxT(t)); err != nil || len(n["a"]) != 1 {
			t.Fatalf("%v: notifications %v, %v", op, n, err)
		}
		if !bytes.Equal(tr.Bytes(), src) || !bytes.Equal(lr.Bytes(), src) {
			t.Fatalf("%v: data differs", op)
		}
	}
	for _, ag := range []*Agent{a, b} {
		ag.mu.RLock()
		for p := range ag.conns {
			if p.tc.fc == nil {
				t.Errorf("%s's connection to %s is a %T, not out of the netpoller", ag.name, p.name, p.conn)
			}
		}
		ag.mu.RUnlock()
	}
}
