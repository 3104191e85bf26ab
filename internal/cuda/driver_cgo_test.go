//go:build linux && cgo

package cuda

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gccl/gccl/internal/cuda/cudatest"
)

// fakeDriver builds the fake driver library (testdata/fakecuda.c) and makes
// Load use it.
func fakeDriver(t *testing.T, flags ...string) { cudatest.Fake(t, flags...) }

// On a machine without the NVIDIA driver, Load says so.
func TestLoadWithoutDriver(t *testing.T) {
	t.Setenv("GCCL_CUDA_LIBRARY", "")
	d, err := Load()
	if err == nil {
		d.Close()
		t.Skip("a CUDA driver is installed here")
	}
	if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), DefaultLibrary) {
		t.Fatalf("Load without a driver: %v", err)
	}
}

// Through the fake driver: every call's plumbing, the current context on a
// locked thread, copies both ways, IPC handles and error names.
func TestFakeDriver(t *testing.T) {
	fakeDriver(t)
	d, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Version() != 12040 {
		t.Errorf("version %d", d.Version())
	}
	if n, err := d.DeviceCount(); n != 2 || err != nil {
		t.Fatalf("DeviceCount: %d, %v", n, err)
	}
	if id, err := d.PCIBusID(1); id != "0000:3c:00.0" || err != nil {
		t.Errorf("PCIBusID(1): %q, %v", id, err)
	}
	// An error the fake cannot name comes from the binding's table.
	_, err = d.PCIBusID(7)
	if !errors.Is(err, &Error{Result: 101}) || !strings.Contains(err.Error(), "cuDeviceGet: CUDA_ERROR_INVALID_DEVICE (101)") {
		t.Errorf("PCIBusID(7): %v", err)
	}
	ctx, err := d.Retain(0)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Release()
	p, err := ctx.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	src := make([]byte, 4096)
	for i := range src {
		src[i] = byte(i * 7)
	}
	dst := make([]byte, 4096)
	if err := ctx.CopyToDevice(p, src); err != nil {
		t.Fatal(err)
	}
	if err := ctx.CopyFromDevice(dst, p); err != nil || !bytes.Equal(src, dst) {
		t.Fatalf("round trip through device memory: %v", err)
	}
	if base, size, err := ctx.AddressRange(p + 100); base != p || size != 4096 || err != nil {
		t.Errorf("AddressRange inside the allocation: %#x %d %v", base, size, err)
	}
	h, err := ctx.IPCHandle(p + 8)
	if err != nil || !bytes.HasPrefix(h[:], []byte("fakecuda-ipc-v1")) {
		t.Errorf("IPC handle %q, %v", h[:16], err)
	}
	// The driver refuses a handle in the process that exported it.
	var ce *Error
	if _, err := ctx.OpenIPC(h); !errors.As(err, &ce) || ce.Call != "cuIpcOpenMemHandle_v2" {
		t.Errorf("OpenIPC of this process's own handle: %v", err)
	}
	if err := ctx.Free(p); err != nil {
		t.Fatal(err)
	}
	_, err = ctx.Alloc(2 << 30)
	if !errors.Is(err, &Error{Call: "cuMemAlloc_v2", Result: ErrOutOfMemory}) || !strings.Contains(err.Error(), "CUDA_ERROR_OUT_OF_MEMORY") {
		t.Errorf("Alloc(2 GiB): %v", err)
	}
	if _, err := ctx.Alloc(0); !errors.Is(err, &Error{Result: ErrInvalidValue}) {
		t.Errorf("Alloc(0): %v", err)
	}
}

func TestFakeDriverNoDevice(t *testing.T) {
	fakeDriver(t)
	t.Setenv("FAKECUDA_NO_DEVICE", "1")
	d, err := Load()
	if err == nil {
		d.Close()
		t.Fatal("Load succeeded without devices")
	}
	var ce *Error
	if !errors.As(err, &ce) || ce.Call != "cuInit" || ce.Result != ErrNoDevice || ce.Name != "CUDA_ERROR_NO_DEVICE" {
		t.Fatalf("Load: %v", err)
	}
	if !errors.Is(err, ErrNotSupported) {
		t.Fatalf("Load without a device: %v, want ErrNotSupported too", err)
	}
}

// A driver without an entry point gccl needs is refused at Load, by name.
func TestIncompleteDriver(t *testing.T) {
	fakeDriver(t, "-DOMIT_LAUNCH")
	_, err := Load()
	if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "cuLaunchKernel") {
		t.Fatalf("Load of a driver without cuLaunchKernel: %v", err)
	}
}

// Load of a library that is not there names it.
func TestLoadMissingLibrary(t *testing.T) {
	t.Setenv("GCCL_CUDA_LIBRARY", filepath.Join(t.TempDir(), "nope.so"))
	if _, err := Load(); !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "nope.so") {
		t.Fatalf("Load: %v", err)
	}
}

// Streams, events, pinned memory, asynchronous copies and modules through
// the fake driver: every call's plumbing and argument order.
func TestFakeDriverAsync(t *testing.T) {
	fakeDriver(t)
	d, ctx := device0(t)
	if sm, err := d.Attribute(0, AttrMultiProcessorCount); sm != 4 || err != nil {
		t.Errorf("multiprocessors: %d, %v", sm, err)
	}
	if cc, err := d.Attribute(1, AttrComputeCapabilityMajor); cc != 9 || err != nil {
		t.Errorf("compute capability: %d, %v", cc, err)
	}
	s, err := ctx.NewStream()
	if err != nil || s == 0 {
		t.Fatalf("NewStream: %v, %v", s, err)
	}
	defer ctx.DestroyStream(s)
	ev, err := ctx.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.DestroyEvent(ev)
	pinned, err := ctx.AllocHost(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.FreeHost(pinned)
	for i := range pinned {
		pinned[i] = byte(i * 13)
	}
	a, _ := ctx.Alloc(1 << 16)
	b, _ := ctx.Alloc(1 << 16)
	defer ctx.Free(a)
	defer ctx.Free(b)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(ctx.CopyToDeviceAsync(a, pinned, s))
	must(ctx.CopyAsync(b+100, a, 1000, s))
	must(ctx.MemsetAsync(b, 0xAB, 100, s))
	must(ctx.RecordEvent(ev, s))
	must(ctx.StreamWaitEvent(0, ev))
	must(ctx.SyncEvent(ev))
	if done, err := ctx.EventDone(ev); !done || err != nil {
		t.Errorf("EventDone after SyncEvent: %v, %v", done, err)
	}
	out := make([]byte, 1100)
	must(ctx.CopyFromDeviceAsync(pinned[:1100], b, s))
	must(ctx.SyncStream(s))
	copy(out, pinned)
	must(ctx.Synchronize())
	for i := range out {
		want := byte(0xAB)
		if i >= 100 {
			want = byte((i - 100) * 13)
		}
		if out[i] != want {
			t.Fatalf("byte %d: %#x, want %#x", i, out[i], want)
		}
	}
	reg := make([]byte, 4096)
	must(ctx.HostRegister(reg))
	must(ctx.HostUnregister(reg))

	var ce *Error
	if _, err := ctx.LoadModule([]byte("not ptx")); !errors.As(err, &ce) || ce.Name != "CUDA_ERROR_INVALID_PTX" {
		t.Errorf("LoadModule of garbage: %v", err)
	}
	m, err := ctx.LoadModule([]byte(".version 7.0\n.target sm_70\n.visible .entry gccl_x(\n.param .u64 p\n)\n{ ret; }\n"))
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.UnloadModule(m)
	if f, err := ctx.Function(m, "gccl_x"); f == 0 || err != nil {
		t.Errorf("Function(gccl_x): %v, %v", f, err)
	}
	if _, err := ctx.Function(m, "gccl_y"); !errors.As(err, &ce) || ce.Name != "CUDA_ERROR_NOT_FOUND" {
		t.Errorf("Function of a kernel the module lacks: %v", err)
	}
}

// CUDA IPC between two processes: the parent exports an allocation, a child
// process opens the handle, checks what the parent wrote at an offset into
// the allocation, and writes its answer back.
func TestFakeDriverIPCAcrossProcesses(t *testing.T) {
	if hs := os.Getenv("GCCL_TEST_IPC_CHILD"); hs != "" {
		ipcChild(t, hs)
		return
	}
	fakeDriver(t)
	_, ctx := device0(t)
	p, err := ctx.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Free(p)
	msg := []byte("written by the exporting process")
	if err := ctx.CopyToDevice(p+4096, msg); err != nil {
		t.Fatal(err)
	}
	h, err := ctx.IPCHandle(p + 4096)
	if err != nil {
		t.Fatal(err)
	}
	base, _, err := ctx.AddressRange(p + 4096)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFakeDriverIPCAcrossProcesses$", "-test.v")
	cmd.Env = append(os.Environ(), fmt.Sprintf("GCCL_TEST_IPC_CHILD=%x,%d", h[:], p+4096-base))
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	got := make([]byte, 64)
	if err := ctx.CopyFromDevice(got, p+8192); err != nil {
		t.Fatal(err)
	}
	if want := "answered by the importing process"; !bytes.HasPrefix(got, []byte(want)) {
		t.Fatalf("after the child: %q", got)
	}
}

func ipcChild(t *testing.T, arg string) {
	var hexh string
	var off int
	if _, err := fmt.Sscanf(strings.Replace(arg, ",", " ", 1), "%s %d", &hexh, &off); err != nil {
		t.Fatal(err)
	}
	var h IPCHandle
	if b, err := hex.DecodeString(hexh); err != nil || copy(h[:], b) != len(h) {
		t.Fatalf("handle %q: %v", hexh, err)
	}
	_, ctx := device0(t)
	base, err := ctx.OpenIPC(h)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 32)
	if err := ctx.CopyFromDevice(got, base+DevicePtr(off)); err != nil {
		t.Fatal(err)
	}
	if string(got) != "written by the exporting process" {
		t.Fatalf("read %q through the IPC mapping", got)
	}
	if err := ctx.CopyToDevice(base+DevicePtr(off)+4096, []byte("answered by the importing process")); err != nil {
		t.Fatal(err)
	}
	if err := ctx.CloseIPC(base); err != nil {
		t.Fatal(err)
	}
}

// device0 loads the driver GCCL_CUDA_LIBRARY names and retains device 0's
// context, both released when t ends.
func device0(t *testing.T) (*Driver, *Context) {
	t.Helper()
	d, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	ctx, err := d.Retain(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Release() })
	return d, ctx
}

// The fake runs streams asynchronously, as a GPU does: with every queued
// operation delayed, a copy is not done when its call returns, an event
// orders one stream after another, and a stream waits for a word of mapped
// host memory until the host writes it. Tests of the layers above rely on
// this to catch a missing synchronization.
func TestFakeDriverStreamsAreAsynchronous(t *testing.T) {
	fakeDriver(t)
	t.Setenv("FAKECUDA_STREAM_DELAY_US", "20000")
	_, ctx := device0(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	s1, err := ctx.NewStream()
	must(err)
	defer ctx.DestroyStream(s1)
	s2, err := ctx.NewStream()
	must(err)
	defer ctx.DestroyStream(s2)
	ev, err := ctx.NewEvent()
	must(err)
	defer ctx.DestroyEvent(ev)
	pinned, err := ctx.AllocHost(64)
	must(err)
	defer ctx.FreeHost(pinned)
	a, err := ctx.Alloc(64)
	must(err)
	defer ctx.Free(a)

	// s1 sets a to 7; s2, ordered after it by the event, copies a out.
	must(ctx.MemsetAsync(a, 7, 64, s1))
	must(ctx.RecordEvent(ev, s1))
	if done, err := ctx.EventDone(ev); done || err != nil {
		t.Fatalf("EventDone right after queueing a delayed memset: %v, %v", done, err)
	}
	must(ctx.StreamWaitEvent(s2, ev))
	must(ctx.CopyFromDeviceAsync(pinned, a, s2))
	if pinned[0] == 7 {
		t.Fatal("the copy was done before its call returned")
	}
	must(ctx.SyncStream(s2))
	if !bytes.Equal(pinned, bytes.Repeat([]byte{7}, 64)) {
		t.Fatalf("s2 did not wait for s1's memset: %v", pinned[:8])
	}

	// A stream waiting for a word of mapped memory holds its later work
	// until the host writes the word.
	word, wp, err := ctx.AllocHostMapped(4)
	must(err)
	defer ctx.FreeHost(word)
	must(ctx.WaitValue32(s1, wp, 1, WaitEQ))
	must(ctx.MemsetAsync(a, 9, 64, s1))
	must(ctx.RecordEvent(ev, s1))
	time.Sleep(100 * time.Millisecond)
	if done, err := ctx.EventDone(ev); done || err != nil {
		t.Fatalf("the stream ran past a wait whose word was not written: %v, %v", done, err)
	}
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&word[0])), 1)
	must(ctx.SyncEvent(ev))
	must(ctx.CopyToDevice(a, pinned[:0])) // nothing
	must(ctx.CopyFromDevice(pinned, a))
	if pinned[0] != 9 {
		t.Fatalf("after the word was written: %d, want 9", pinned[0])
	}
	if err := ctx.WaitValue32(s1, wp+1, 1, WaitEQ); !errors.Is(err, &Error{Result: ErrInvalidValue}) {
		t.Errorf("WaitValue32 on a misaligned word: %v", err)
	}
}

// TestInstalledDriverLibrary checks gccl's declarations against a real
// driver library, GCCL_TEST_DRIVER_LIBRARY (CI fetches Debian's libcuda1
// with .ci/nvidia-tools.sh; no GPU is needed): every entry point gccl uses
// resolves, the driver names every result as gccl's table does, and Load
// either succeeds (a GPU is here) or fails with ErrNotSupported and the
// driver's result.
func TestInstalledDriverLibrary(t *testing.T) {
	path := os.Getenv("GCCL_TEST_DRIVER_LIBRARY")
	if path == "" {
		t.Skip("GCCL_TEST_DRIVER_LIBRARY names no driver library (.ci/nvidia-tools.sh fetches one)")
	}
	d, err := open(path)
	if err != nil {
		t.Fatalf("resolving gccl's entry points in %s: %v", path, err)
	}
	defer d.Close()
	for r, want := range resultNames {
		got, ok := d.errorName(r)
		if !ok {
			t.Errorf("the driver cannot name result %d (gccl calls it %s)", r, want)
		} else if got != want {
			t.Errorf("the driver calls result %d %s, gccl %s", r, got, want)
		}
	}
	t.Setenv("GCCL_CUDA_LIBRARY", path)
	ld, err := Load()
	if err == nil {
		n, _ := ld.DeviceCount()
		t.Logf("driver %d with %d devices", ld.Version(), n)
		ld.Close()
		return
	}
	var ce *Error
	if !errors.Is(err, ErrNotSupported) || !errors.As(err, &ce) || ce.Call != "cuInit" {
		t.Fatalf("Load without a usable GPU: %v, want ErrNotSupported and cuInit's *Error", err)
	}
	t.Logf("no usable GPU: %v", err)
}

// The driver stays loaded after Close, and after a Load that failed in
// cuInit, as the CUDA runtime leaves it: its threads and exit handlers must
// not lose their code.
func TestDriverStaysLoaded(t *testing.T) {
	// A build of its own, which no other test has loaded.
	fakeDriver(t, "-DGCCL_TEST_STAYS_LOADED")
	lib := os.Getenv("GCCL_CUDA_LIBRARY")
	mapped := func() bool {
		maps, err := os.ReadFile("/proc/self/maps")
		if err != nil {
			t.Skipf("cannot read the process's mappings: %v", err)
		}
		return bytes.Contains(maps, []byte(lib))
	}
	t.Setenv("FAKECUDA_NO_DEVICE", "1")
	if _, err := Load(); err == nil {
		t.Fatal("Load succeeded without devices")
	}
	if !mapped() {
		t.Fatal("a Load that failed in cuInit unloaded the driver")
	}
	os.Unsetenv("FAKECUDA_NO_DEVICE")
	d, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if !mapped() {
		t.Fatal("Close unloaded the driver")
	}
	if _, err := d.DeviceCount(); !errors.Is(err, ErrClosed) {
		t.Fatalf("DeviceCount after Close: %v", err)
	}
	d, err = Load()
	if err != nil {
		t.Fatalf("Load after Close: %v", err)
	}
	d.Close()
}

// streamWords gives a test a stream of ctx and n words of mapped host
// memory, zeroed (pinned memory is not), by index and at their device
// address. Both are released when the test ends, after its deferred calls,
// which must let the stream's work finish (freeing waits for it).
func streamWords(t *testing.T, ctx *Context, n int) (Stream, func(i int) *uint32, DevicePtr) {
	t.Helper()
	s, err := ctx.NewStream()
	mustOK(t, err)
	t.Cleanup(func() { ctx.DestroyStream(s) })
	words, wp, err := ctx.AllocHostMapped(4 * n)
	mustOK(t, err)
	t.Cleanup(func() { ctx.FreeHost(words) })
	word := func(i int) *uint32 { return (*uint32)(unsafe.Pointer(&words[4*i])) }
	for i := range n {
		atomic.StoreUint32(word(i), 0)
	}
	return s, word, wp
}

func mustOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A stream's write stores its word when the stream reaches it, after the
// work queued before it: behind a wait for a gate word the host has not
// written, the word keeps its value; behind a delayed memset, the memset's
// bytes are in place once the word is seen.
func TestStreamWriteFollowsStreamWork(t *testing.T) {
	fakeDriver(t)
	t.Setenv("FAKECUDA_STREAM_DELAY_US", "20000")
	_, ctx := device0(t)
	must := func(err error) { t.Helper(); mustOK(t, err) }
	write := func(s Stream, p DevicePtr, v uint32) error { return ctx.BatchMemOps(s, []MemOp{WriteValueOp(p, v)}) }
	s, word, wp := streamWords(t, ctx, 2)
	gate, flag := word(0), word(1)
	defer atomic.StoreUint32(gate, 1) // on failure too: freeing waits for the stream

	must(ctx.WaitValue32(s, wp, 1, WaitGEQ))
	must(write(s, wp+4, 7))
	time.Sleep(100 * time.Millisecond)
	if v := atomic.LoadUint32(flag); v != 0 {
		t.Fatalf("the word was written (%d) before the wait queued ahead of it was satisfied", v)
	}
	atomic.StoreUint32(gate, 1)
	must(ctx.SyncStream(s))
	if v := atomic.LoadUint32(flag); v != 7 {
		t.Fatalf("after the gate opened and the stream synchronized: %d, want 7", v)
	}

	a, err := ctx.Alloc(64)
	must(err)
	defer ctx.Free(a)
	must(ctx.MemsetAsync(a, 5, 64, s))
	must(write(s, wp+4, 8))
	if v := atomic.LoadUint32(flag); v != 7 {
		t.Fatalf("the word was written (%d) before its call returned, ahead of a delayed memset", v)
	}
	deadline := time.Now().Add(10 * time.Second)
	for atomic.LoadUint32(flag) != 8 {
		if time.Now().After(deadline) {
			t.Fatal("the word was never written")
		}
		time.Sleep(time.Millisecond)
	}
	got := make([]byte, 64)
	must(ctx.CopyFromDevice(got, a)) // the legacy stream: no wait for s
	if !bytes.Equal(got, bytes.Repeat([]byte{5}, 64)) {
		t.Fatalf("the word was visible before the memset queued ahead of it: %v", got[:8])
	}
	if err := write(s, wp+2, 1); !errors.Is(err, &Error{Result: ErrInvalidValue}) {
		t.Errorf("a write to a misaligned word: %v", err)
	}
}

// BatchMemOps queues its operations in order in one call: a write behind
// a wait in the same batch waits for it, a write ahead of it does not; a
// batch with one bad operation queues none; more than the driver takes is
// refused before the driver sees it.
func TestBatchMemOps(t *testing.T) {
	fakeDriver(t)
	_, ctx := device0(t)
	must := func(err error) { t.Helper(); mustOK(t, err) }
	s, word, wp := streamWords(t, ctx, 3)
	defer atomic.StoreUint32(word(0), 1) // on failure too: freeing waits for the stream

	must(ctx.BatchMemOps(s, []MemOp{WriteValueOp(wp+4, 3), WaitValueOp(wp, 1, WaitGEQ), WriteValueOp(wp+8, 4)}))
	deadline := time.Now().Add(10 * time.Second)
	for atomic.LoadUint32(word(1)) != 3 {
		if time.Now().After(deadline) {
			t.Fatal("the write ahead of the wait was never made")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	if v := atomic.LoadUint32(word(2)); v != 0 {
		t.Fatalf("the write behind the wait was made (%d) before the gate opened", v)
	}
	atomic.StoreUint32(word(0), 1)
	must(ctx.SyncStream(s))
	if v := atomic.LoadUint32(word(2)); v != 4 {
		t.Fatalf("after the gate opened: %d, want 4", v)
	}

	if err := ctx.BatchMemOps(s, []MemOp{WriteValueOp(wp+4, 9), WriteValueOp(wp+6, 9)}); !errors.Is(err, &Error{Result: ErrInvalidValue}) {
		t.Errorf("a batch with a misaligned word: %v", err)
	}
	if err := ctx.BatchMemOps(s, make([]MemOp, MaxBatchMemOps+1)); !errors.Is(err, &Error{Result: ErrInvalidValue}) {
		t.Errorf("a batch of %d: %v", MaxBatchMemOps+1, err)
	}
	must(ctx.SyncStream(s))
	if v := atomic.LoadUint32(word(1)); v != 3 {
		t.Fatalf("a refused batch wrote its first word: %d", v)
	}
	must(ctx.BatchMemOps(s, nil))
}

// HostRegisterMapped makes mmap'd memory reachable by stream memory
// operations at the address it returns; the empty slice is refused.
func TestHostRegisterMapped(t *testing.T) {
	fakeDriver(t)
	_, ctx := device0(t)
	page, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(page)
	d, err := ctx.HostRegisterMapped(page)
	if err != nil || d == 0 {
		t.Fatalf("HostRegisterMapped: %#x, %v", d, err)
	}
	if info, err := ctx.PointerInfo(d + 8); err != nil || info.Type != MemoryHost || info.Size != len(page) {
		t.Errorf("PointerInfo of the registered page: %+v, %v", info, err)
	}
	s, err := ctx.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.DestroyStream(s)
	gate := (*uint32)(unsafe.Pointer(&page[8]))
	defer atomic.StoreUint32(gate, 4) // on failure too: destroying s waits for its work
	if err := ctx.WaitValue32(s, d+8, 3, WaitGEQ); err != nil {
		t.Fatal(err)
	}
	if err := ctx.BatchMemOps(s, []MemOp{WriteValueOp(d+12, 0xC0FFEE)}); err != nil {
		t.Fatal(err)
	}
	atomic.StoreUint32(gate, 4) // past 3: GEQ
	if err := ctx.SyncStream(s); err != nil {
		t.Fatal(err)
	}
	if v := atomic.LoadUint32((*uint32)(unsafe.Pointer(&page[12]))); v != 0xC0FFEE {
		t.Fatalf("the stream wrote %#x through the registered page, want 0xc0ffee", v)
	}
	if err := ctx.HostUnregister(page); err != nil {
		t.Fatal(err)
	}
	if _, err := ctx.PointerInfo(d + 8); err == nil {
		t.Error("the page is still registered after HostUnregister")
	}
	if _, err := ctx.HostRegisterMapped(nil); !errors.Is(err, &Error{Result: ErrInvalidValue}) {
		t.Errorf("HostRegisterMapped of nothing: %v", err)
	}
}

// A driver without cuStreamBatchMemOp_v2 (older than CUDA 11.7) still
// loads; BatchMemOps then says the driver lacks it.
func TestBatchMemOpsWithoutTheCall(t *testing.T) {
	fakeDriver(t, "-DOMIT_WRITE_VALUE")
	_, ctx := device0(t)
	words, wp, err := ctx.AllocHostMapped(4)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.FreeHost(words)
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&words[0])), 0) // pinned memory is not zeroed
	if err := ctx.BatchMemOps(0, []MemOp{WriteValueOp(wp, 1)}); !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "cuStreamBatchMemOp_v2") {
		t.Fatalf("BatchMemOps on a driver without the call: %v", err)
	}
	if v := atomic.LoadUint32((*uint32)(unsafe.Pointer(&words[0]))); v != 0 {
		t.Fatalf("the word changed to %d", v)
	}
}
