//go:build linux && cgo

package engine_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gccl/gccl/device"
	"github.com/gccl/gccl/dtype"
	"github.com/gccl/gccl/gpu/internal/engine"
	"github.com/gccl/gccl/internal/cuda"
	"github.com/gccl/gccl/internal/cuda/cudatest"
	"github.com/gccl/gccl/internal/cuda/devtest"
	"github.com/gccl/gccl/internal/errs"
)

// flagPage maps a page of shared anonymous memory for e's stream
// operations, as comm maps the flags its ranks share; it is unmapped when
// t ends. It returns the page and its device address.
func flagPage(t *testing.T, e *engine.Engine) ([]byte, uintptr) {
	t.Helper()
	page, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(page) })
	p, err := e.MapFlags(page)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.UnmapFlags(page); err != nil {
			t.Errorf("UnmapFlags: %v", err)
		}
	})
	return page, p
}

// word is the 32-bit word at byte off of b.
func word(b []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&b[off])) }

// openGate stores v into *gate when t ends, before the cleanups registered
// earlier: on a failure, a stream still waiting for the gate would hold up
// the frees and stream destructions, which wait for it.
func openGate(t *testing.T, gate *uint32, v uint32) {
	t.Cleanup(func() { atomic.StoreUint32(gate, v) })
}

// waitWord polls *w until it is v, failing t after a while.
func waitWord(t *testing.T, w *uint32, v uint32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for atomic.LoadUint32(w) != v {
		if time.Now().After(deadline) {
			t.Fatalf("the word is %d after 10s, want %d", atomic.LoadUint32(w), v)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// A stream waits for its flag before it copies, and writes its own flag
// only once the copy's bytes are in place: until the host sets the gate,
// neither the copy's destination nor the second flag changes.
func TestStreamWaitsForFlagThenCopiesThenWrites(t *testing.T) {
	ctx, e := openEngine(t)
	s := stream(t, ctx)
	page, fp := flagPage(t, e)
	gate, flag := word(page, 0), word(page, 4)
	const n = 4096
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i*7 + 1)
	}
	src, dst := alloc(t, ctx, n), alloc(t, ctx, n)
	if err := ctx.CopyToDevice(src, want); err != nil {
		t.Fatal(err)
	}
	if err := ctx.CopyToDevice(dst, make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	openGate(t, gate, 1)

	if err := e.Flags(uintptr(s), []device.FlagOp{{Addr: fp, Value: 1, Wait: true}}); err != nil {
		t.Fatal(err)
	}
	if err := e.CopyOn(uintptr(s), uintptr(dst), uintptr(src), n); err != nil {
		t.Fatal(err)
	}
	if err := e.Flags(uintptr(s), []device.FlagOp{{Addr: fp + 4, Value: 5}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	got := make([]byte, n)
	if err := e.CopyToHost(got, uintptr(dst)); err != nil { // the engine's stream, not s
		t.Fatal(err)
	}
	if v := atomic.LoadUint32(flag); v != 0 || !bytes.Equal(got, make([]byte, n)) {
		t.Fatalf("before the gate opened: flag %d, destination %v; want 0 and zeros", v, got[:8])
	}
	atomic.StoreUint32(gate, 1)
	// As a peer would: the flag says the copy is done, without a sync.
	waitWord(t, flag, 5)
	if err := e.CopyToHost(got, uintptr(dst)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the flag was written before the copy queued ahead of it was done: %v, want %v", got[:8], want[:8])
	}
	if err := ctx.SyncStream(s); err != nil {
		t.Fatal(err)
	}
	if err := e.CopyOn(uintptr(s), uintptr(dst), uintptr(src), 0); err != nil {
		t.Errorf("a copy of nothing: %v", err)
	}
	if err := e.CopyOn(uintptr(s), uintptr(dst), uintptr(src), -1); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("a copy of -1 bytes: %v", err)
	}
	err := e.Flags(uintptr(s), []device.FlagOp{{Addr: fp + 2, Value: 1, Wait: true}})
	if !errors.Is(err, &cuda.Error{Result: cuda.ErrInvalidValue}) || !strings.HasPrefix(err.Error(), "engine: ") {
		t.Errorf("a wait on a misaligned word: %v", err)
	}
	if err := e.Flags(uintptr(s), []device.FlagOp{{Addr: fp + 2, Value: 1}}); !errors.Is(err, &cuda.Error{Result: cuda.ErrInvalidValue}) {
		t.Errorf("a write to a misaligned word: %v", err)
	}
	if err := e.Flags(uintptr(s), make([]device.FlagOp, device.MaxFlagOps+1)); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("%d flag operations at once: %v", device.MaxFlagOps+1, err)
	}
	if err := e.Flags(uintptr(s), nil); err != nil {
		t.Errorf("no flag operations: %v", err)
	}
}

// ReduceOn launches on the stream it is given: behind a wait for a flag,
// the sum is not there until the host sets the flag.
func TestReduceOnStream(t *testing.T) {
	ctx, e := openEngine(t)
	s := stream(t, ctx)
	page, fp := flagPage(t, e)
	gate := word(page, 0)
	const count = 1000
	fill := func(f func(i int) float32) cuda.DevicePtr {
		b := make([]byte, 4*count)
		for i := range count {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f(i)))
		}
		p := alloc(t, ctx, len(b))
		if err := ctx.CopyToDevice(p, b); err != nil {
			t.Fatal(err)
		}
		return p
	}
	a := fill(func(i int) float32 { return float32(i) })
	b := fill(func(i int) float32 { return float32(2 * i) })
	out := fill(func(int) float32 { return -1 })
	openGate(t, gate, 1)

	if err := e.Flags(uintptr(s), []device.FlagOp{{Addr: fp, Value: 1, Wait: true}}); err != nil {
		t.Fatal(err)
	}
	r := &device.Reduce{DataType: dtype.Float32, Op: dtype.Sum, Ranks: 2, Count: count,
		In: []uintptr{uintptr(a), uintptr(b)}, Out: []uintptr{uintptr(out)}}
	if err := e.ReduceOn(uintptr(s), r); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4*count)
	at := func(i int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(got[4*i:])) }
	time.Sleep(50 * time.Millisecond)
	if err := e.CopyToHost(got, uintptr(out)); err != nil {
		t.Fatal(err)
	}
	if at(0) != -1 || at(count-1) != -1 {
		t.Fatalf("the reduction ran before the wait queued ahead of it on its stream: %v, %v", at(0), at(count-1))
	}
	atomic.StoreUint32(gate, 1)
	if err := ctx.SyncStream(s); err != nil {
		t.Fatal(err)
	}
	if err := e.CopyToHost(got, uintptr(out)); err != nil {
		t.Fatal(err)
	}
	for i := range count {
		if at(i) != float32(3*i) {
			t.Fatalf("element %d: %v, want %v", i, at(i), float32(3*i))
		}
	}
	bad := &device.Reduce{DataType: dtype.Float32, Op: dtype.Sum, Count: 1, In: make([]uintptr, 9), Out: make([]uintptr, 1)}
	if err := e.ReduceOn(uintptr(s), bad); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("a reduction of 9 inputs: %v", err)
	}
}

// Follow orders one stream after another's work so far: with every
// operation of the fake's streams delayed, a copy on b reading what a
// copies, queued after Follow(b, a), reads a's result. Then the other way
// round, with the engine's one event reused.
func TestFollowOrdersStreams(t *testing.T) {
	t.Setenv("FAKECUDA_STREAM_DELAY_US", "20000") // read as the streams are made
	ctx, e := openEngine(t)
	sa, sb := stream(t, ctx), stream(t, ctx)
	const n = 256
	want := bytes.Repeat([]byte{0x5A}, n)
	src, x, y := alloc(t, ctx, n), alloc(t, ctx, n), alloc(t, ctx, n)
	if err := ctx.CopyToDevice(src, want); err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// a: two delayed operations, so its copy lands well after b's first
	// would run unordered.
	must(ctx.MemsetAsync(x, 0xEE, n, sa))
	must(e.CopyOn(uintptr(sa), uintptr(x), uintptr(src), n))
	must(e.Follow(uintptr(sb), uintptr(sa)))
	must(e.CopyOn(uintptr(sb), uintptr(y), uintptr(x), n))
	must(ctx.SyncStream(sb))
	got := make([]byte, n)
	must(e.CopyToHost(got, uintptr(y)))
	if !bytes.Equal(got, want) {
		t.Fatalf("b's copy did not follow a's: %#x..., want %#x", got[:4], want[:4])
	}

	must(ctx.MemsetAsync(y, 0x11, n, sb))
	must(e.Follow(uintptr(sa), uintptr(sb)))
	must(e.CopyOn(uintptr(sa), uintptr(x), uintptr(y), n))
	must(ctx.SyncStream(sa))
	must(e.CopyToHost(got, uintptr(x)))
	if !bytes.Equal(got, bytes.Repeat([]byte{0x11}, n)) {
		t.Fatalf("a's copy did not follow b's: %#x...", got[:4])
	}
	must(e.Follow(uintptr(sa), uintptr(sa))) // a stream follows itself already
}

// After Close, every stream call fails with errs.ErrClosed.
func TestStreamCallsAfterClose(t *testing.T) {
	ctx, e := openEngine(t)
	s := uintptr(stream(t, ctx))
	p := uintptr(alloc(t, ctx, 64))
	page := make([]byte, 4096)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	_, merr := e.MapFlags(page)
	for name, err := range map[string]error{
		"MapFlags":   merr,
		"UnmapFlags": e.UnmapFlags(page),
		"Flags":      e.Flags(s, []device.FlagOp{{Addr: p, Value: 1}}),
		"ReduceOn": e.ReduceOn(s, &device.Reduce{DataType: dtype.Float32, Op: dtype.Sum, Ranks: 1, Count: 0,
			In: []uintptr{p}, Out: []uintptr{p}}),
		"CopyOn": e.CopyOn(s, p, p, 0),
		"Follow": e.Follow(s, s),
	} {
		if !errors.Is(err, errs.ErrClosed) {
			t.Errorf("%s after Close: %v", name, err)
		}
	}
}

// On a driver that cannot write memory from a stream, MapFlags refuses
// (ErrNotSupported), so a caller learns it when it maps its flags, not at
// a collective's first flag write.
func TestMapFlagsNeedsStreamWrites(t *testing.T) {
	if cudatest.RealGPU() {
		t.Skip("needs the fake driver built without cuStreamBatchMemOp_v2")
	}
	cudatest.Fake(t, "-DOMIT_WRITE_VALUE")
	sh := devtest.Shared(t)
	bus, _ := sh.PCIBusID(0)
	e, err := engine.NewEngine(sh, 0, bus)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	b, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	if _, err := e.MapFlags(b); !errors.Is(err, errs.ErrNotSupported) || !strings.Contains(err.Error(), "cuStreamBatchMemOp_v2") {
		t.Fatalf("MapFlags on a driver without stream writes: %v", err)
	}
}

// The ranks of one process map the same flag pages (their own and each
// other's), while the driver registers a range once per process: the
// second MapFlags of a page gets the first's address, and only the last
// UnmapFlags unregisters it.
func TestMapFlagsTwice(t *testing.T) {
	_, e := openEngine(t)
	page, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(page)
	p1, err := e.MapFlags(page)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := e.MapFlags(page)
	if err != nil || p2 != p1 {
		t.Fatalf("second MapFlags: %#x, %v; want %#x", p2, err, p1)
	}
	if err := e.UnmapFlags(page); err != nil {
		t.Fatal(err)
	}
	if err := e.UnmapFlags(page); err != nil {
		t.Fatal(err)
	}
	if err := e.UnmapFlags(page); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("a third UnmapFlags: %v, want ErrInvalidArgument", err)
	}
	// Unregistered: the driver takes the page again.
	if _, err := e.MapFlags(page); err != nil {
		t.Fatalf("MapFlags after the last UnmapFlags: %v", err)
	}
	if err := e.UnmapFlags(page); err != nil {
		t.Fatal(err)
	}
}
