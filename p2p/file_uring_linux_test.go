package p2p

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gccl/gccl/internal/uring"
)

// uringPool is a file pool on io_uring, or the test skips where the
// kernel refuses io_uring (kernel.io_uring_disabled, seccomp).
func uringPool(t *testing.T, depth, block int) *filePool {
	t.Helper()
	if err := uring.Available(); err != nil {
		t.Skipf("io_uring unavailable: %v", err)
	}
	p := newFilePool(depth, block, true)
	if p.ring == nil || p.engine != "io_uring" {
		t.Fatalf("engine %q with io_uring available", p.engine)
	}
	t.Cleanup(p.close)
	return p
}

// ringRun runs on the pool's io_uring engine whatever the run's length
// (the pool itself sends streams longer than a queue to the workers).
func ringRun(t *testing.T, p *filePool, h *fileHandle, write bool, mems [][]byte, offs []int64, st *stopper) error {
	ok, err := p.ring.run(h, write, mems, offs, st)
	if !ok {
		t.Error("no io_uring ring could be set up")
	}
	return err
}

// dataFile is a file of n written bytes (O_DIRECT checks alignment only
// where a file has blocks), with an O_DIRECT descriptor where the file
// system has one.
func dataFile(t *testing.T, n int, direct bool) *fileHandle {
	t.Helper()
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, make([]byte, n), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	h := &fileHandle{path: path, f: f, owns: true}
	if direct {
		if h.direct, err = openDirect(f); err != nil {
			t.Logf("no O_DIRECT here: %v", err)
		}
	}
	t.Cleanup(func() { h.close() })
	return h
}

// TestURingFullQueue moves far more blocks than the queue holds, in
// pieces aligned and not, memory aligned and not, with several runs on
// one pool at once (each on its own ring), and reads them back.
func TestURingFullQueue(t *testing.T) {
	p := uringPool(t, 2, 4096)
	const size = 200 << 10
	var wg sync.WaitGroup
	for g := range 3 {
		for _, direct := range []bool{false, true} {
			h := dataFile(t, size, direct)
			wg.Go(func() {
				src := alignedBuffer(size + 1)[1:] // memory off alignment: bounce buffers
				fill(src, byte(g))
				// 64 KiB aligned, then odd offsets and lengths (page cache).
				mems := [][]byte{src[:64<<10], src[64<<10 : 64<<10+5001], src[64<<10+5001:]}
				offs := []int64{0, 64 << 10, 64<<10 + 5001}
				if err := ringRun(t, p, h, true, mems, offs, nil); err != nil {
					t.Error(err)
					return
				}
				onDisk, _ := os.ReadFile(h.path)
				if !bytes.Equal(onDisk, src) {
					t.Errorf("run %d (direct %v): the file differs from what was written", g, direct)
				}
				dst := alignedBuffer(size)
				if err := ringRun(t, p, h, false, [][]byte{dst[:7], dst[7:]}, []int64{0, 7}, nil); err != nil {
					t.Error(err)
					return
				}
				if !bytes.Equal(dst, src) {
					t.Errorf("run %d (direct %v): read back bytes differ", g, direct)
				}
			})
		}
	}
	wg.Wait()
}

// TestURingShortRead: a read past the end of the file fails with
// io.ErrUnexpectedEOF naming the file, on the O_DIRECT and the buffered
// path, and the bytes before the end arrive.
func TestURingShortRead(t *testing.T) {
	p := uringPool(t, 4, 16<<10)
	for _, direct := range []bool{false, true} {
		h := dataFile(t, 0, direct)
		want := bytes.Repeat([]byte{9}, 10000)
		if err := os.WriteFile(h.path, want, 0o600); err != nil {
			t.Fatal(err)
		}
		mem := alignedBuffer(16 << 10)
		err := ringRun(t, p, h, false, [][]byte{mem}, []int64{0}, nil)
		if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), h.path) {
			t.Fatalf("direct %v: read past the end: %v", direct, err)
		}
		if !bytes.Equal(mem[:10000], want) {
			t.Fatalf("direct %v: the bytes before the end differ", direct)
		}
	}
}

// TestURingShortTransfersGoOn: a read that returns part of a block (a
// pipe delivering its bytes in pieces) is resubmitted for the rest.
func TestURingShortTransfersGoOn(t *testing.T) {
	p := uringPool(t, 2, 8192)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	h := &fileHandle{f: r}
	want := make([]byte, 8192)
	fill(want, 3)
	var wg sync.WaitGroup
	wg.Go(func() {
		for _, piece := range [][]byte{want[:1000], want[1000:5000], want[5000:]} {
			w.Write(piece)
			time.Sleep(5 * time.Millisecond) // so the reader likely sees them apart
		}
	})
	got := make([]byte, 8192)
	err = ringRun(t, p, h, false, [][]byte{got}, []int64{0}, nil)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("a block read in pieces differs")
	}
}

// TestURingErrors: what the kernel refuses comes back as the request's
// error, naming the file and the errno; the pool goes on working.
func TestURingErrors(t *testing.T) {
	p := uringPool(t, 4, 4096)
	h := dataFile(t, 1<<16, false)
	ro, err := os.Open(h.path)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	bad := &fileHandle{path: h.path, f: ro}
	mem := make([]byte, 3*4096)
	err = ringRun(t, p, bad, true, [][]byte{mem}, []int64{0}, nil)
	if !errors.Is(err, syscall.EBADF) || !strings.Contains(err.Error(), h.path) {
		t.Fatalf("a write to a read-only descriptor: %v", err)
	}
	fill(mem, 5)
	if err := ringRun(t, p, h, true, [][]byte{mem}, []int64{0}, nil); err != nil {
		t.Fatalf("a write after the error: %v", err)
	}
	if got, _ := os.ReadFile(h.path); !bytes.Equal(got[:len(mem)], mem) {
		t.Fatal("the write after the error differs")
	}
}

// TestURingCancelInFlight: reads that cannot complete (an empty pipe) are
// in flight when the post's deadline passes; the run cancels them, returns
// once the kernel is done with the memory, and the blocks that had their
// bytes keep them. The pool's next run works.
func TestURingCancelInFlight(t *testing.T) {
	p := uringPool(t, 2, 4096)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	first := bytes.Repeat([]byte{7}, 4096)
	w.Write(first)
	var st stopper
	st.deadline.Store(monoNow() + int64(50*time.Millisecond))
	mem := make([]byte, 4*4096)
	if err := ringRun(t, p, &fileHandle{f: r}, false, [][]byte{mem}, []int64{0}, &st); err != nil {
		t.Fatalf("a cancelled run: %v (the stopper says why)", err)
	}
	if st.why.Load() != stopTimeout {
		t.Fatalf("stopper why %d", st.why.Load())
	}
	if !bytes.Equal(mem[:4096], first) || bytes.Count(mem[4096:], []byte{0}) != 3*4096 {
		t.Fatal("cancelled reads touched memory, or the first block lost its bytes")
	}
	h := dataFile(t, 8192, false)
	fill(mem, 1)
	if err := ringRun(t, p, h, true, [][]byte{mem[:8192]}, []int64{0}, nil); err != nil {
		t.Fatalf("a run after a cancelled one: %v", err)
	}
	if got, _ := os.ReadFile(h.path); !bytes.Equal(got, mem[:8192]) {
		t.Fatal("the run after a cancelled one wrote other bytes")
	}
}

// TestURingSplitsLargeIO: one I/O larger than a queue's share is cut
// across the queue, aligned, so O_DIRECT still applies.
func TestURingSplitsLargeIO(t *testing.T) {
	e := &uringFiles{depth: 16, block: 1 << 20}
	for _, c := range []struct{ total, want int }{
		{1 << 20, 64 << 10},  // 16 pieces of 64 KiB
		{4 << 20, 256 << 10}, // 16 of 256 KiB
		{64 << 20, 1 << 20},  // enough blocks: the block size
		{100 << 10, 64 << 10},
	} {
		if got := e.chunk([][]byte{make([]byte, c.total)}); got != c.want {
			t.Errorf("%d bytes: chunk %d, want %d", c.total, got, c.want)
		}
	}
}

// TestURingStripes: blocks are dealt in contiguous stripes, one per slot,
// that together cover every block once, in order.
func TestURingStripes(t *testing.T) {
	u := &uringRing{slots: make([]uringSlot, 3), stripe: make([]stripeCursor, 3)}
	mems := [][]byte{make([]byte, 10<<10), nil, make([]byte, 5<<10)}
	offs := []int64{0, 1 << 20, 2 << 20}
	if n := u.deal(mems, 4<<10); n != 5 || len(u.ready) != 3 {
		t.Fatalf("%d blocks, %d stripes; want 5 and 3", n, len(u.ready))
	}
	var got []int64
	var lens []int
	for s := range 3 {
		c := &u.stripe[s]
		for c.left > 0 {
			mem, off := c.next(mems, offs, 4<<10)
			got, lens = append(got, off), append(lens, len(mem))
		}
	}
	want := []int64{0, 4 << 10, 8 << 10, 2 << 20, 2<<20 + 4<<10}
	wantLens := []int{4 << 10, 4 << 10, 2 << 10, 4 << 10, 1 << 10}
	if fmt.Sprint(got, lens) != fmt.Sprint(want, wantLens) {
		t.Fatalf("blocks at %v of %v, want %v of %v", got, lens, want, wantLens)
	}
}

// TestURingPastDeadline: a run whose post is past its deadline queues no
// block; without one it writes everything.
func TestURingPastDeadline(t *testing.T) {
	p := uringPool(t, 2, 4096)
	h := dataFile(t, 64<<10, true)
	var late stopper
	late.deadline.Store(monoNow() - 1)
	mem := bytes.Repeat([]byte{1}, 64<<10)
	if err := ringRun(t, p, h, true, [][]byte{mem}, []int64{0}, &late); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(h.path); bytes.IndexByte(got, 1) >= 0 {
		t.Fatal("io_uring wrote past the deadline")
	}
	if err := ringRun(t, p, h, true, [][]byte{mem}, []int64{0}, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(h.path); !bytes.Equal(got, mem) {
		t.Fatal("io_uring without a deadline did not write it all")
	}
}
