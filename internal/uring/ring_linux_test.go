package uring

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func newRing(t *testing.T, entries uint32) *Ring {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("io_uring unavailable here: %v", err)
	}
	r, err := New(entries)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}

// reap waits for n completions and returns them by user data.
func reap(t *testing.T, r *Ring, n int) map[uint64]CQE {
	t.Helper()
	got := map[uint64]CQE{}
	for len(got) < n {
		if _, err := r.Submit(1, time.Second); err != nil {
			t.Fatal(err)
		}
		for c, ok := r.Completion(); ok; c, ok = r.Completion() {
			if _, dup := got[c.UserData]; dup {
				t.Fatalf("two completions for %d", c.UserData)
			}
			got[c.UserData] = c
		}
	}
	if c, ok := r.Completion(); ok {
		t.Fatalf("an extra completion %+v", c)
	}
	return got
}

func TestABISizes(t *testing.T) {
	if s := unsafe.Sizeof(params{}); s != 120 {
		t.Errorf("io_uring_params is %d bytes, want 120", s)
	}
	if s := unsafe.Sizeof(sqe{}); s != 64 {
		t.Errorf("io_uring_sqe is %d bytes, want 64", s)
	}
	if s := unsafe.Sizeof(CQE{}); s != 16 {
		t.Errorf("io_uring_cqe is %d bytes, want 16", s)
	}
	if s := unsafe.Sizeof(geteventsArg{}); s != 24 {
		t.Errorf("io_uring_getevents_arg is %d bytes, want 24", s)
	}
}

func tempFile(t *testing.T, size int) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	// Written, not truncated: O_DIRECT checks alignment only where the
	// file has blocks (a hole reads as zeros whatever the alignment).
	if _, err := f.Write(make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestBatchWriteRead writes 16 blocks in one submission, then reads them
// back in another, each completion carrying its entry's user data.
func TestBatchWriteRead(t *testing.T) {
	r := newRing(t, 16)
	const blk, n = 8192, 16
	f := tempFile(t, blk*n)
	src := make([]byte, blk*n)
	for i := range src {
		src[i] = byte(i*7 + i>>13)
	}
	for i := range n {
		if !r.PrepWrite(int(f.Fd()), src[i*blk:(i+1)*blk], int64(i*blk), uint64(100+i)) {
			t.Fatalf("queue full at %d of %d entries", i, r.Entries())
		}
	}
	if got, err := r.Submit(0, 0); err != nil || got != n {
		t.Fatalf("Submit took %d entries (%v), want %d", got, err, n)
	}
	for ud, c := range reap(t, r, n) {
		if ud < 100 || ud >= 100+n || c.Res != blk {
			t.Fatalf("write completion %d: res %d", ud, c.Res)
		}
	}
	onDisk, _ := os.ReadFile(f.Name())
	if !bytes.Equal(onDisk, src) {
		t.Fatal("the file differs from what was written")
	}
	dst := make([]byte, blk*n)
	for i := range n {
		r.PrepRead(int(f.Fd()), dst[i*blk:(i+1)*blk], int64(i*blk), uint64(i))
	}
	for ud, c := range reap(t, r, n) {
		if c.Res != blk {
			t.Fatalf("read completion %d: res %d", ud, c.Res)
		}
	}
	if !bytes.Equal(dst, src) {
		t.Fatal("read back bytes differ")
	}
}

// TestShortRead: a read that runs past the end of the file completes with
// the bytes there were, one at the end with 0.
func TestShortRead(t *testing.T) {
	r := newRing(t, 4)
	f := tempFile(t, 10000)
	buf := make([]byte, 16384)
	r.PrepRead(int(f.Fd()), buf, 0, 1)
	r.PrepRead(int(f.Fd()), buf[:100], 20000, 2)
	got := reap(t, r, 2)
	if got[1].Res != 10000 || got[2].Res != 0 {
		t.Fatalf("short read %d (want 10000), read at the end %d (want 0)", got[1].Res, got[2].Res)
	}
}

// TestErrors: a bad descriptor and an O_DIRECT read off alignment complete
// with their errno, and the ring goes on working.
func TestErrors(t *testing.T) {
	r := newRing(t, 4)
	f := tempFile(t, 1<<16)
	buf := make([]byte, 4096+1)
	r.PrepRead(1<<20, buf[:4096], 0, 1) // no such descriptor
	want := map[uint64]int32{1: -int32(unix.EBADF)}
	if d, err := os.OpenFile(f.Name(), os.O_RDWR|unix.O_DIRECT, 0); err == nil {
		defer d.Close()
		r.PrepRead(int(d.Fd()), buf[1:101], 0, 2) // length and memory off alignment
		want[2] = -int32(unix.EINVAL)
	} else {
		t.Logf("no O_DIRECT here (%v): only the bad descriptor", err)
	}
	got := reap(t, r, len(want))
	for ud, res := range want {
		if got[ud].Res != res {
			t.Errorf("completion %d: res %d, want %d", ud, got[ud].Res, res)
		}
	}
	r.PrepRead(int(f.Fd()), buf[:4096], 0, 3)
	if c := reap(t, r, 1)[3]; c.Res != 4096 {
		t.Fatalf("a read after the errors: res %d", c.Res)
	}
}

// TestCancelInFlight: a read that cannot complete (an empty pipe) is in
// flight; a wait with a timeout returns without it; PrepCancelAll ends it
// with -ECANCELED.
func TestCancelInFlight(t *testing.T) {
	r := newRing(t, 4)
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	buf := make([]byte, 64)
	r.PrepRead(p[0], buf, -1, 7)
	if n, err := r.Submit(1, 20*time.Millisecond); err != nil || n != 1 {
		t.Fatalf("Submit: %d, %v", n, err)
	}
	if c, ok := r.Completion(); ok {
		t.Fatalf("a read of an empty pipe completed: %+v", c)
	}
	r.PrepCancelAll(8)
	got := reap(t, r, 2)
	if got[7].Res != -int32(unix.ECANCELED) || got[8].Res != 1 {
		t.Fatalf("cancelled read res %d (want %d), cancel res %d (want 1)", got[7].Res, -int32(unix.ECANCELED), got[8].Res)
	}
}

// TestFullQueue: Prep refuses past the queue's size until Submit hands the
// entries over; then there is room again and every entry completes.
func TestFullQueue(t *testing.T) {
	r := newRing(t, 4)
	f := tempFile(t, 4096*64)
	buf := make([]byte, 4096)
	done := 0
	for round := 0; round < 3; round++ {
		n := 0
		for r.PrepRead(int(f.Fd()), buf, int64(n*4096), uint64(round*100+n)) {
			n++
		}
		if n != r.Entries() || r.Space() != 0 {
			t.Fatalf("round %d: %d entries prepared of %d, space %d", round, n, r.Entries(), r.Space())
		}
		if r.PrepCancelAll(1) {
			t.Fatal("a cancel entry went into a full queue")
		}
		if got, err := r.Submit(0, 0); err != nil || got != n {
			t.Fatalf("Submit: %d, %v", got, err)
		}
		if r.Space() != r.Entries() {
			t.Fatalf("space %d after Submit", r.Space())
		}
		for _, c := range reap(t, r, n) {
			if c.Res != 4096 {
				t.Fatalf("res %d", c.Res)
			}
			done++
		}
	}
	if done != 3*r.Entries() {
		t.Fatalf("%d completions", done)
	}
}

// TestFixedBuffers writes from and reads into registered buffers.
func TestFixedBuffers(t *testing.T) {
	r := newRing(t, 4)
	f := tempFile(t, 1<<16)
	bufs := [][]byte{bytes.Repeat([]byte{0xab}, 8192), make([]byte, 8192)}
	if err := r.RegisterBuffers(bufs); err != nil {
		t.Fatal(err)
	}
	r.PrepWriteFixed(int(f.Fd()), bufs[0][4096:], 4096, 0, 1)
	if c := reap(t, r, 1)[1]; c.Res != 4096 {
		t.Fatalf("fixed write res %d", c.Res)
	}
	r.PrepReadFixed(int(f.Fd()), bufs[1][:8192], 0, 1, 2)
	if c := reap(t, r, 1)[2]; c.Res != 8192 {
		t.Fatalf("fixed read res %d", c.Res)
	}
	want := append(make([]byte, 4096), bytes.Repeat([]byte{0xab}, 4096)...)
	if !bytes.Equal(bufs[1], want) {
		t.Fatal("fixed read got other bytes")
	}
	if err := r.UnregisterBuffers(); err != nil {
		t.Fatal(err)
	}
}

func TestClosedRing(t *testing.T) {
	r := newRing(t, 1)
	r.Close()
	if _, err := r.Submit(0, 0); err == nil {
		t.Fatal("Submit on a closed ring")
	}
}
