package cma

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"unsafe"
)

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

func pattern(n int, salt byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ salt
	}
	return b
}

func TestReadOwnMemory(t *testing.T) {
	var r Reader
	for _, n := range []int{1, 8, 4095, 4096, 4097, 1 << 20, 3<<20 + 5} {
		src := pattern(n, byte(n))
		dst := make([]byte, n)
		if err := r.Read(os.Getpid(), dst, addr(src)); err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if !bytes.Equal(dst, src) {
			t.Fatalf("%d bytes: read other bytes than were there", n)
		}
	}
}

func TestWriteOwnMemory(t *testing.T) {
	var w Writer
	for _, n := range []int{1, 4097, 3<<20 + 5} {
		src := pattern(n, byte(n))
		dst := make([]byte, n+2)
		if err := w.Write(os.Getpid(), src, addr(dst[1:])); err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if !bytes.Equal(dst[1:n+1], src) || dst[0] != 0 || dst[n+1] != 0 {
			t.Fatalf("%d bytes: wrote other bytes than src, or outside its range", n)
		}
	}
}

func TestWriteErrors(t *testing.T) {
	var w Writer
	src := make([]byte, 64)
	if err := w.Write(os.Getpid(), src[:0], 0); err != nil {
		t.Fatalf("empty write: %v", err)
	}
	if err := w.Write(0, src, addr(src)); err == nil {
		t.Fatal("pid 0 accepted")
	}
	err := w.Write(os.Getpid(), src, 4096)
	if !errors.Is(err, syscall.EFAULT) || Refused(err) || !strings.Contains(err.Error(), "process_vm_writev") {
		t.Fatalf("unmapped address: %v (refused %v); want process_vm_writev's EFAULT, not refused", err, Refused(err))
	}
}

func TestReadErrors(t *testing.T) {
	var r Reader
	dst := make([]byte, 64)
	if err := r.Read(os.Getpid(), dst[:0], 0); err != nil {
		t.Fatalf("empty read: %v", err)
	}
	if err := r.Read(0, dst, addr(dst)); err == nil {
		t.Fatal("pid 0 accepted")
	}
	if err := r.Read(os.Getpid(), dst, 0); err == nil {
		t.Fatal("address 0 accepted")
	}
	// An unmapped address: EFAULT, which is not a refusal.
	err := r.Read(os.Getpid(), dst, 4096)
	if !errors.Is(err, syscall.EFAULT) || Refused(err) {
		t.Fatalf("unmapped address: %v (refused %v); want EFAULT, not refused", err, Refused(err))
	}
	// A process that is gone: ESRCH, not a refusal.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip("cannot run true:", err)
	}
	err = r.Read(cmd.Process.Pid, dst, addr(dst))
	if !errors.Is(err, syscall.ESRCH) || Refused(err) {
		t.Fatalf("exited process: %v (refused %v); want ESRCH, not refused", err, Refused(err))
	}
	if !strings.Contains(err.Error(), fmt.Sprint(cmd.Process.Pid)) {
		t.Fatalf("error does not name the pid: %v", err)
	}
}

func TestRefused(t *testing.T) {
	for _, e := range []error{syscall.EPERM, syscall.EACCES, syscall.ENOSYS, ErrNotSupported, ErrRefused} {
		if !Refused(fmt.Errorf("x: %w", e)) {
			t.Errorf("%v not a refusal", e)
		}
	}
	for _, e := range []error{syscall.ESRCH, syscall.EFAULT, syscall.EINVAL, errors.New("other")} {
		if Refused(e) {
			t.Errorf("%v taken for a refusal", e)
		}
	}
}

// The child of TestReadAnotherProcess: it prints where its bytes are and
// waits for its standard input to close.
func TestMain(m *testing.M) {
	if os.Getenv("CMA_TEST_CHILD") == "1" {
		src := pattern(5<<20+3, 0x5a)
		fmt.Printf("%d %d\n", addr(src), len(src))
		buf := make([]byte, 1)
		os.Stdin.Read(buf)
		if src[0] != 0x5a { // keep src alive until here
			os.Exit(3)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestReadAnotherProcess(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "CMA_TEST_CHILD=1")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); cmd.Wait() }()
	var at uintptr
	var n int
	if _, err := fmt.Fscan(bufio.NewReader(out), &at, &n); err != nil {
		t.Fatal("child:", err)
	}
	var r Reader
	dst := make([]byte, n)
	err = r.Read(cmd.Process.Pid, dst, at)
	if Refused(err) {
		t.Skip("this system refuses process_vm_readv between processes:", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst, pattern(n, 0x5a)) {
		t.Fatal("read other bytes than the child holds")
	}
}

func TestReadAllocatesNothing(t *testing.T) {
	var r Reader
	src, dst := pattern(64<<10, 1), make([]byte, 64<<10)
	pid, at := os.Getpid(), addr(src)
	if a := testing.AllocsPerRun(100, func() {
		if err := r.Read(pid, dst, at); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Fatalf("%v allocations per read", a)
	}
}

func BenchmarkRead(b *testing.B) {
	for _, n := range []int{64 << 10, 1 << 20, 16 << 20} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			var r Reader
			src, dst := pattern(n, 1), make([]byte, n)
			b.SetBytes(int64(n))
			for b.Loop() {
				if err := r.Read(os.Getpid(), dst, addr(src)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCopyWays compares, for 16 MiB: one kernel copy (a reader
// alone), two halves copied at once by a reader and a writer (a split
// broadcast's root and reader, here two goroutines of one process), and
// Go's own copy, which the kernel's does not match on every CPU.
func BenchmarkCopyWays(b *testing.B) {
	const n = 16 << 20
	pid := os.Getpid()
	src, dst := pattern(n, 3), make([]byte, n)
	b.Run("read", func(b *testing.B) {
		var r Reader
		b.SetBytes(n)
		for b.Loop() {
			if err := r.Read(pid, dst, addr(src)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("read+write", func(b *testing.B) {
		var r Reader
		var w Writer
		b.SetBytes(n)
		for b.Loop() {
			var wg sync.WaitGroup
			var werr error
			wg.Go(func() { werr = w.Write(pid, src[n/2:], addr(dst[n/2:])) })
			err := r.Read(pid, dst[:n/2], addr(src))
			wg.Wait()
			if err != nil || werr != nil {
				b.Fatal(err, werr)
			}
		}
	})
	b.Run("go-copy", func(b *testing.B) {
		b.SetBytes(n)
		for b.Loop() {
			copy(dst, src)
		}
	})
}
