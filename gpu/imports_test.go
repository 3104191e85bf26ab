//go:build linux && cgo

package gpu_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/gpu"
	"github.com/gccl/gccl/internal/cuda/cudatest"
)

// A rank whose send and receive buffers are on different devices (engines)
// cannot run its share on one device. Its peers must not take the device
// path without it (they would fail with ErrMismatch, or hang): every rank
// runs the call through host staging, and it succeeds.
func TestMixedEngines(t *testing.T) {
	fakeDriver(t)
	if d1, err := gpu.Open(1); err != nil {
		t.Skipf("needs a second device: %v", err)
	} else {
		d1.Close()
	}
	const n, count = 3, 300
	errs := runRanks(t, n, nil, func(c *comm.Comm, dev *gpu.Device) error {
		ctx := context.Background()
		r := c.Rank()
		outDev := dev
		if r == 1 {
			d1, err := gpu.Open(1)
			if err != nil {
				return err
			}
			defer d1.Close()
			outDev = d1
		}
		x, err := dev.Alloc(comm.Float32, count)
		if err != nil {
			return err
		}
		defer x.Free()
		y, err := outDev.Alloc(comm.Float32, count)
		if err != nil {
			return err
		}
		defer y.Free()
		if err := setF32(x, func(i int) float32 { return float32(r + i) }); err != nil {
			return err
		}
		if err := c.AllReduce(ctx, x, y, comm.Sum); err != nil {
			return err
		}
		if err := checkF32("AllReduce", y, func(i int) float32 { return float32(n*(n-1)/2 + n*i) }); err != nil {
			return err
		}
		// The next call, on one engine everywhere, still works.
		if err := c.AllReduce(ctx, x, x, comm.Max); err != nil {
			return err
		}
		return checkF32("AllReduce after", x, func(i int) float32 { return float32(n - 1 + i) })
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// otherTID returns the id of a thread of this process other than its main
// one, kept alive until the test ends: the fake driver opens an IPC handle
// through /proc/<pid>/fd/<fd>, and /proc/<tid> names the same file table,
// so a handle re-labelled with tid is opened as if another process had
// exported it.
func otherTID(t *testing.T) int {
	t.Helper()
	got, stop := make(chan int), make(chan struct{})
	t.Cleanup(func() { close(stop) })
	for range 16 {
		go func() {
			runtime.LockOSThread()
			got <- syscall.Gettid()
			<-stop
		}()
		if tid := <-got; tid != os.Getpid() {
			return tid
		}
	}
	t.Skip("no thread other than the main one")
	return 0
}

// foreign re-labels an Export description (the engine's layout: pid at 4, the
// IPC handle at 32, the fake handle's pid at 16 and padding from 40 in it)
// as exported by process tid, with tag in the handle's padding (the fake
// driver ignores it) so that equal memory gets distinct handles.
func foreign(desc []byte, tid int, tag uint64) []byte {
	d := bytes.Clone(desc)
	binary.LittleEndian.PutUint32(d[4:], uint32(tid))
	binary.LittleEndian.PutUint32(d[32+16:], uint32(tid))
	binary.LittleEndian.PutUint64(d[32+40:], tag)
	return d
}

// elsewhere moves a description's allocation to a base of its own (the
// i-th slot past a made-up address), so that many of them read as distinct
// live allocations of one exporter, which never overlap.
func elsewhere(desc []byte, i uint64) []byte {
	d := bytes.Clone(desc)
	size := binary.LittleEndian.Uint64(d[16:])
	binary.LittleEndian.PutUint64(d[8:], 1<<44+i*size)
	return d
}

// fakeMappings counts this process's mappings of fake device memory.
func fakeMappings(t *testing.T) int {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skip(err)
	}
	return strings.Count(string(maps), "memfd:fakecuda")
}

func mapped(addr uintptr) bool {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return true
	}
	for _, l := range strings.Split(string(maps), "\n") {
		r, _, _ := strings.Cut(l, " ")
		lo, hi, ok := strings.Cut(r, "-")
		if !ok {
			continue
		}
		a, err1 := strconv.ParseUint(lo, 16, 64)
		b, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 == nil && err2 == nil && uint64(addr) >= a && uint64(addr) < b {
			return true
		}
	}
	return false
}

// When the engine's cache of peers' mappings is full, Import must not close
// a mapping it returned for the operation under way: a device collective
// imports its peers' buffers one after another and then reads all of them.
func TestImportCacheKeepsRecentMappings(t *testing.T) {
	// The fake driver even on a GPU machine: the test passes off its own
	// exports as another process's by rewriting the fake's handles.
	cudatest.Fake(t)
	tid := otherTID(t)
	dev := openDevice(t, 0)
	const size = 4096
	var bufs [4]*gpu.Buffer // filler, a, b, local
	for i := range bufs {
		bufs[i] = alloc(t, dev, comm.Uint8, size)
		if err := bufs[i].CopyFromHost(bytes.Repeat([]byte{byte(0xA0 + i)}, size)); err != nil {
			t.Fatal(err)
		}
	}
	eng := bufs[0].Engine()
	export := func(b *gpu.Buffer) []byte {
		d, err := eng.AppendExport(nil, b.Ptr(), size)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	filler := export(bufs[0])
	// Fill the cache to one short of its bound (1024), then import a (the
	// last entry) and b (which finds the cache full) as one operation does.
	for i := 1; i < 1024; i++ {
		if _, err := eng.Import(elsewhere(foreign(filler, tid, uint64(i)), uint64(i)), size); err != nil {
			t.Fatal(err)
		}
	}
	pa, err := eng.Import(foreign(export(bufs[1]), tid, 0), size)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Import(foreign(export(bufs[2]), tid, 0), size); err != nil {
		t.Fatal(err)
	}
	if !mapped(pa) {
		t.Fatalf("the mapping of a, imported just before, was closed")
	}
	local := bufs[3]
	if err := eng.Copy(local.Ptr(), pa, size); err != nil {
		t.Fatal(err)
	}
	if err := eng.Wait(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	if err := local.CopyToHost(got); err != nil {
		t.Fatal(err)
	}
	if got[0] != 0xA1 || got[size-1] != 0xA1 {
		t.Fatalf("a's mapping reads %#x, want 0xa1 (closed and reused by another mapping)", got[0])
	}
}

// A peer that frees a buffer and allocates another where it was (no caching
// allocator) exports a new handle for the same addresses: the engine closes
// its mapping of the freed allocation then, instead of keeping that memory
// alive until the cache is full.
func TestFreedPeerAllocationsAreUnmapped(t *testing.T) {
	// The fake driver even on a GPU machine: the test passes off its own
	// exports as another process's by rewriting the fake's handles.
	cudatest.Fake(t)
	tid := otherTID(t)
	dev := openDevice(t, 0)
	const size = 4096
	b := alloc(t, dev, comm.Uint8, size)
	eng := b.Engine()
	desc, err := eng.AppendExport(nil, b.Ptr(), size)
	if err != nil {
		t.Fatal(err)
	}
	before := fakeMappings(t)
	for gen := range uint64(5) { // five generations of the peer's buffer
		if _, err := eng.Import(foreign(desc, tid, gen), size); err != nil {
			t.Fatal(err)
		}
	}
	if got := fakeMappings(t) - before; got != 1 {
		t.Fatalf("%d mappings open after 5 generations of one peer buffer, want 1 (the latest)", got)
	}
	// While a call holds a stream, closing a mapping (which may synchronize
	// the device) waits for the last hold's release.
	s, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	bound, err := b.OnStream(s)
	if err != nil {
		t.Fatal(err)
	}
	hold, err := bound.HoldStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Import(foreign(desc, tid, 5), size); err != nil {
		t.Fatal(err)
	}
	if got := fakeMappings(t) - before; got != 2 {
		t.Fatalf("%d mappings open during a hold, want 2 (the stale one closes after it)", got)
	}
	hold.Release()
	if got := fakeMappings(t) - before; got != 1 {
		t.Fatalf("%d mappings open after the hold's release, want 1", got)
	}
	// Distinct live allocations of the peer stay mapped side by side.
	for i := range uint64(3) {
		if _, err := eng.Import(elsewhere(foreign(desc, tid, 10+i), 1+i), size); err != nil {
			t.Fatal(err)
		}
	}
	if got := fakeMappings(t) - before; got != 4 {
		t.Fatalf("%d mappings open, want 4 (the latest generation and 3 other allocations)", got)
	}
}
