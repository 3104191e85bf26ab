//go:build linux && cgo

package p2p

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gccl/gccl/internal/cuda"
	"github.com/gccl/gccl/internal/cuda/cudatest"
	"github.com/gccl/gccl/internal/cuda/devtest"
	"github.com/gccl/gccl/internal/cufile"
	"github.com/gccl/gccl/internal/testutil"
)

// The tests of VRAM regions run against the fake CUDA driver
// (internal/cuda/testdata/fakecuda.c): device memory is host memory from
// memfd, IPC handles are opened by another process through /proc, every
// copy is synchronous. They check the agent's logic and bytes, not a GPU.

// fakeGPU makes the loader use the fake driver for the rest of t and
// returns the contexts of its two devices, for the test's own allocations.
func fakeGPU(t testing.TB) [2]*cuda.Context {
	t.Helper()
	// Without the host kernels: the p2p tests launch none, and so do not
	// depend on internal/kernels building.
	cudatest.Fake(t, "-UGCCL_HOSTEMU")
	_, ctxs := devtest.Retain(t, 2)
	return [2]*cuda.Context(ctxs)
}

// oneGPU makes the loader use the fake driver for the rest of t, or the
// installed one with GCCL_TEST_REAL_GPU=1, and returns device 0's context.
func oneGPU(t testing.TB) *cuda.Context {
	t.Helper()
	cudatest.Driver(t, "-UGCCL_HOSTEMU")
	return devtest.Context(t)
}

// devAlloc allocates n bytes on ctx's device filled with fill(seed).
func devAlloc(t testing.TB, ctx *cuda.Context, n int, seed byte) cuda.DevicePtr {
	t.Helper()
	p, err := ctx.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, n)
	fill(b, seed)
	if err := ctx.CopyToDevice(p, b); err != nil {
		t.Fatal(err)
	}
	return p
}

func devRead(t testing.TB, ctx *cuda.Context, p cuda.DevicePtr, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if err := ctx.CopyFromDevice(b, p); err != nil {
		t.Fatal(err)
	}
	return b
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	fill(b, seed)
	return b
}

func TestRegisterVRAM(t *testing.T) {
	ctx := fakeGPU(t)
	a := newAgent(t, "a", Config{ListenAddr: "-"})
	const size = 1 << 20
	p := devAlloc(t, ctx[1], size, 1)
	r, err := a.RegisterVRAM(uint64(p)+4096, size-4096, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.Type() != VRAM || r.Device() != 1 || r.Addr() != uint64(p)+4096 || r.Bytes() != nil {
		t.Fatalf("region %v dev %d addr %#x", r.Type(), r.Device(), r.Addr())
	}
	if d := r.Desc(10, 20); d.DevID != 1 || d.Addr != uint64(p)+4106 {
		t.Fatalf("Desc %+v", d)
	}
	// A sub-range of the same device is a cache hit; naming another device
	// is an error (the driver says which device the memory is on).
	if r2, err := a.RegisterVRAM(uint64(p)+8192, 100, 1); err != nil || r2 != r {
		t.Fatalf("sub-range: %v, same region %v", err, r2 == r)
	}
	if _, err := a.RegisterVRAM(uint64(p)+8192, 100, 0); err == nil || !strings.Contains(err.Error(), "memory of device 1, not of device 0") {
		t.Fatalf("device 1's memory registered as device 0's: %v", err)
	}
	// The metadata carries device, bus id, IPC handle and offset.
	info, err := decodeMetadata(a.LocalMetadata())
	if err != nil {
		t.Fatal(err)
	}
	var ri regionInfo
	for _, x := range info.Regions {
		if x.ID == r.ID() {
			ri = x
		}
	}
	if ri.Type != VRAM || ri.Dev != 1 || ri.Bus != "0000:3c:00.0" || ri.IPCOff != 4096 || ri.Flags != regionIPC || ri.IPC == ([ipcHandleLen]byte{}) {
		t.Fatalf("metadata of the region: %+v", ri)
	}
	// Errors, not panics.
	pinned, err := ctx[0].AllocHost(100)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx[0].FreeHost(pinned)
	for name, f := range map[string]func() error{
		"zero length":  func() error { _, err := a.RegisterVRAM(uint64(p), 0, 1); return err },
		"past the end": func() error { _, err := a.RegisterVRAM(uint64(p)+size-10, 20, 1); return err },
		"host memory": func() error {
			b := make([]byte, 100)
			_, err := a.RegisterVRAM(AddrOf(b), 100, 0)
			return err
		},
		"pinned host memory": func() error { _, err := a.RegisterVRAM(AddrOf(pinned), 100, 0); return err },
		"no device 2":        func() error { _, err := a.RegisterVRAM(uint64(p), 10, 2); return err },
		"device -1":          func() error { _, err := a.RegisterVRAM(uint64(p), 10, -1); return err },
		"wrapping":           func() error { _, err := a.RegisterVRAM(^uint64(0)-5, 10, 0); return err },
		"descriptor of another device": func() error {
			_, err := a.PrepareLocal(DescList{Type: VRAM, Descs: []Desc{{Addr: uint64(p) + 4096, Len: 10, DevID: 0}}})
			return err
		},
	} {
		if err := f(); err == nil {
			t.Errorf("%s: accepted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	if _, err := a.RegisterVRAM(uint64(p)+size-10, 20, 1); !errors.Is(err, ErrOutOfBounds) {
		t.Errorf("past the end: %v", err)
	}
	for i := 0; i < 2; i++ {
		if err := a.DeregisterMem(r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.PrepareLocal(DescList{Type: VRAM, Descs: []Desc{r.Desc(0, 10)}}); !errors.Is(err, ErrOutOfBounds) {
		t.Fatalf("deregistered VRAM: %v", err)
	}
}

func TestRegisterVRAMNoDriver(t *testing.T) {
	t.Setenv("GCCL_CUDA_LIBRARY", filepath.Join(t.TempDir(), "libcuda-absent.so"))
	a := newAgent(t, "a", Config{ListenAddr: "-"})
	_, err := a.RegisterVRAM(1<<40, 10, 0)
	if !errors.Is(err, ErrNotSupported) || !errors.Is(err, cuda.ErrNotSupported) || !strings.Contains(err.Error(), "libcuda-absent") {
		t.Fatalf("no driver: %v", err)
	}
	// The fake without a device: cuInit fails; the error says so.
	cudatest.Fake(t, "-UGCCL_HOSTEMU")
	t.Setenv("FAKECUDA_NO_DEVICE", "1")
	b := newAgent(t, "b", Config{ListenAddr: "-"})
	if _, err := b.RegisterVRAM(1<<40, 10, 0); !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "NO_DEVICE") {
		t.Fatalf("no device: %v", err)
	}
}

// xfer posts a request of one descriptor pair and waits for it.
func xfer(t testing.TB, a *Agent, op Op, local DescList, peer string, remote DescList, opts *RequestOptions, want Backend) {
	t.Helper()
	r, err := a.CreateRequest(op, local, peer, remote, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Release()
	if r.Backend() != want {
		t.Fatalf("%v: backend %v (%s), want %v", op, r.Backend(), r.why, want)
	}
	if _, err := r.Post(); err != nil {
		t.Fatal(err)
	}
	if err := r.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// TestVRAMLocal copies between DRAM and VRAM of one agent, and between its
// two devices, through the driver (BackendLocal), in pieces and parts.
func TestVRAMLocal(t *testing.T) {
	ctx := fakeGPU(t)
	a := newAgent(t, "a", Config{ListenAddr: "-", InlineLimit: -1})
	const size = 6<<20 + 123
	d0 := devAlloc(t, ctx[0], size, 1)
	d1 := devAlloc(t, ctx[1], size, 2)
	v0, err := a.RegisterVRAM(uint64(d0), size, 0)
	if err != nil {
		t.Fatal(err)
	}
	v1, err := a.RegisterVRAM(uint64(d1), size, 1)
	if err != nil {
		t.Fatal(err)
	}
	heap := pattern(size, 3)
	h, _ := a.RegisterMem(heap)
	shared, err := a.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	fill(shared.Bytes(), 4)

	// DRAM -> VRAM (WRITE from the heap into device 0), two parts.
	xfer(t, a, Write, one(DRAM, h.Desc(0, 4096), h.Desc(4096, size-4096)), "a", one(VRAM, v0.Desc(0, 4096), v0.Desc(4096, size-4096)),
		&RequestOptions{Parts: []Part{{End: 1, Notif: []byte("p0")}, {End: 2, Notif: []byte("p1")}}}, BackendLocal)
	if !bytes.Equal(devRead(t, ctx[0], d0, size), heap) {
		t.Fatal("DRAM -> VRAM: wrong bytes")
	}
	if n := a.GetNotifs()["a"]; len(n) != 2 || string(n[0]) != "p0" || string(n[1]) != "p1" {
		t.Fatalf("notifications %q", n)
	}
	// VRAM -> DRAM (READ of device 1 into shared memory), unaligned pieces.
	xfer(t, a, Read, one(DRAM, shared.Desc(1, 1000), shared.Desc(5001, size-5007)), "a", one(VRAM, v1.Desc(7, 1000), v1.Desc(5007, size-5007)), nil, BackendLocal)
	want := pattern(size, 2)
	got := shared.Bytes()
	if !bytes.Equal(got[1:1001], want[7:1007]) || !bytes.Equal(got[5001:size-6], want[5007:]) {
		t.Fatal("VRAM -> DRAM: wrong bytes")
	}
	// VRAM -> VRAM across devices, the local end VRAM (WRITE device 1 -> 0).
	xfer(t, a, Write, one(VRAM, v1.Desc(0, size)), "a", one(VRAM, v0.Desc(0, size)), nil, BackendLocal)
	if !bytes.Equal(devRead(t, ctx[0], d0, size), want) {
		t.Fatal("VRAM -> VRAM: wrong bytes")
	}
	// Local VRAM to and from DRAM targets.
	fill(heap, 9)
	xfer(t, a, Write, one(VRAM, v1.Desc(0, size)), "a", one(DRAM, h.Desc(0, size)), nil, BackendLocal)
	if !bytes.Equal(heap, want) {
		t.Fatal("VRAM WRITE -> DRAM: wrong bytes")
	}
	fill(heap, 10)
	xfer(t, a, Read, one(VRAM, v1.Desc(0, size)), "a", one(DRAM, h.Desc(0, size)), nil, BackendLocal)
	if !bytes.Equal(devRead(t, ctx[1], d1, size), pattern(size, 10)) {
		t.Fatal("VRAM READ <- DRAM: wrong bytes")
	}
	// The DRAM regions were pinned once, and are unpinned when they go.
	a.gpu.mu.Lock()
	pins := len(a.gpu.pins)
	a.gpu.mu.Unlock()
	if pins != 2 {
		t.Fatalf("%d pinned ranges, want 2 (heap and shared region)", pins)
	}
	// A descriptor of device 0 does not name device 1's region.
	if _, err := a.PrepareLocal(one(VRAM, Desc{Addr: uint64(d1), Len: 10, DevID: 0})); !errors.Is(err, ErrOutOfBounds) {
		t.Fatalf("wrong device: %v", err)
	}
	if err := a.DeregisterMem(h); err != nil {
		t.Fatal(err)
	}
	a.gpu.mu.Lock()
	pins = len(a.gpu.pins)
	a.gpu.mu.Unlock()
	if pins != 1 {
		t.Fatalf("%d pinned ranges after deregistration, want 1", pins)
	}
	// Deregistration while a prepared list uses the region fails.
	pl, err := a.PrepareLocal(one(VRAM, v0.Desc(0, 10)))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.DeregisterMem(v0); !errors.Is(err, ErrRegionBusy) {
		t.Fatalf("deregistering VRAM in use: %v", err)
	}
	pl.Release()
	if err := a.DeregisterMem(v0); err != nil {
		t.Fatal(err)
	}
}

// TestVRAMFile moves VRAM to and from a FILE region of the agent through
// pinned bounce buffers, in chunks, aligned and not, with O_DIRECT and
// without; and the same through cuFile (GDS, the fake library), which the
// agent logs. With GCCL_TEST_REAL_GPU=1 it runs on the installed driver
// and libcufile (tests/gpu_acceptance.sh, step 6).
func TestVRAMFile(t *testing.T) {
	ctx := oneGPU(t)
	cudatest.CuFile(t)
	var noCuFile error
	if cudatest.RealGPU() {
		if lib, err := cufile.Load(); err != nil {
			noCuFile = err
		} else {
			lib.Close()
		}
	}
	dir := t.TempDir()
	for _, gds := range []bool{false, true} {
		for _, direct := range []bool{false, true} {
			for _, unaligned := range []bool{false, true} {
				name := fmt.Sprintf("gds=%v,direct=%v,unaligned=%v", gds, direct, unaligned)
				t.Run(name, func(t *testing.T) {
					if gds && noCuFile != nil {
						t.Skipf("no usable cuFile here: %v", noCuFile)
					}
					var log testutil.SyncBuffer
					a := newAgent(t, "a", Config{ListenAddr: "-", FileBlockSize: 256 << 10, FileQueueDepth: 3, GDS: gds,
						Logger: slog.New(slog.NewTextHandler(&log, nil))})
					const size = 2*bounceSize + 3<<20 + 8192
					fr, err := a.RegisterFile(filepath.Join(dir, strings.ReplaceAll(name, ",", "-")), FileOptions{Length: size, Create: true, Direct: direct})
					if err != nil {
						t.Fatal(err)
					}
					d := devAlloc(t, ctx, size, 5)
					v, err := a.RegisterVRAM(uint64(d), size, 0)
					if err != nil {
						t.Fatal(err)
					}
					descs := func(r *Region) []Desc {
						if unaligned {
							return []Desc{r.Desc(3, 5000), r.Desc(5003, size-5003-7)}
						}
						return []Desc{r.Desc(0, 4096), r.Desc(8192, size-8192)}
					}
					xfer(t, a, Write, one(VRAM, descs(v)...), "a", one(FILE, descs(fr)...), &RequestOptions{Notif: []byte("saved")}, BackendFile)
					onDisk, _ := os.ReadFile(fr.file.f.Name())
					want := pattern(size, 5)
					for _, ds := range descs(v) {
						off := ds.Addr - v.Addr()
						if !bytes.Equal(onDisk[off:off+ds.Len], want[off:off+ds.Len]) {
							t.Fatalf("file bytes at %d differ", off)
						}
					}
					if n := a.GetNotifs(); len(n["a"]) != 1 {
						t.Fatalf("notifications %q", n)
					}
					if err := ctx.CopyToDevice(d, make([]byte, size)); err != nil {
						t.Fatal(err)
					}
					xfer(t, a, Read, one(VRAM, descs(v)...), "a", one(FILE, descs(fr)...), nil, BackendFile)
					got := devRead(t, ctx, d, size)
					for _, ds := range descs(v) {
						off := ds.Addr - v.Addr()
						if !bytes.Equal(got[off:off+ds.Len], want[off:off+ds.Len]) {
							t.Fatalf("read back bytes at %d differ", off)
						}
					}
					if viaCuFile := strings.Contains(log.String(), "through cuFile"); viaCuFile != gds {
						t.Errorf("the agent logged cuFile: %v, want %v:\n%s", viaCuFile, gds, log.String())
					}
				})
			}
		}
	}
}

// With GDS asked for and no cuFile library, VRAM<->FILE transfers bounce
// as without it, and the agent says why once.
func TestVRAMFileGDSWithoutLibrary(t *testing.T) {
	ctx := fakeGPU(t)
	t.Setenv("GCCL_CUFILE_LIBRARY", filepath.Join(t.TempDir(), "libcufile.so.0"))
	var log testutil.SyncBuffer
	a := newAgent(t, "a", Config{ListenAddr: "-", GDS: true, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	const size = 1 << 20
	fr, err := a.RegisterFile(filepath.Join(t.TempDir(), "f"), FileOptions{Length: size, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	d := devAlloc(t, ctx[0], size, 9)
	v, err := a.RegisterVRAM(uint64(d), size, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		xfer(t, a, Write, one(VRAM, v.Desc(0, size)), "a", one(FILE, fr.Desc(0, size)), nil, BackendFile)
	}
	if onDisk, _ := os.ReadFile(fr.file.f.Name()); !bytes.Equal(onDisk, pattern(size, 9)) {
		t.Fatal("file bytes differ")
	}
	if n := strings.Count(log.String(), "bounce through pinned host memory"); n != 1 {
		t.Errorf("the fallback was logged %d times, want once:\n%s", n, log.String())
	}
}

// TestVRAMTwoAgentsOneProcess: two agents of one process cannot open each
// other's IPC handles (the driver refuses a process its own), so VRAM
// targets go over tcp, staged on the target; local VRAM towards a peer's
// heap goes over tcp staged here, and towards its shared memory is a CUDA
// copy into the mapping (shm).
func TestVRAMTwoAgentsOneProcess(t *testing.T) {
	ctx := fakeGPU(t)
	a, b := pair(t, Config{})
	const size = bounceSize + 1<<20 + 77
	da := devAlloc(t, ctx[0], size, 1)
	db := devAlloc(t, ctx[1], size, 2)
	va, err := a.RegisterVRAM(uint64(da), size, 0)
	if err != nil {
		t.Fatal(err)
	}
	vb, err := b.RegisterVRAM(uint64(db), size, 1)
	if err != nil {
		t.Fatal(err)
	}
	heapB := pattern(size, 3)
	hb, _ := b.RegisterMem(heapB)
	sb, err := b.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	heapA := pattern(size, 4)
	ha, _ := a.RegisterMem(heapA)
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	check := func(what string, got []byte, seed byte) {
		t.Helper()
		if !bytes.Equal(got, pattern(size, seed)) {
			t.Fatalf("%s: wrong bytes", what)
		}
	}
	half := uint64(size / 2)

	// DRAM -> remote VRAM (tcp; b stages), with a notification after it.
	xfer(t, a, Write, one(DRAM, ha.Desc(0, half), ha.Desc(half, size-half)), "b", one(VRAM, vb.Desc(0, half), vb.Desc(half, size-half)),
		&RequestOptions{Notif: []byte("w")}, BackendTCP)
	check("DRAM -> remote VRAM", devRead(t, ctx[1], db, size), 4)
	waitFor(t, func() bool { return len(b.GetNotifs()["a"]) == 1 })
	// Remote VRAM -> local VRAM (tcp; both ends stage).
	xfer(t, a, Read, one(VRAM, va.Desc(0, size)), "b", one(VRAM, vb.Desc(0, size)), nil, BackendTCP)
	check("remote VRAM -> VRAM", devRead(t, ctx[0], da, size), 4)
	// Local VRAM -> remote heap (tcp, staged here), and back.
	xfer(t, a, Write, one(VRAM, va.Desc(0, size)), "b", one(DRAM, hb.Desc(0, size)), nil, BackendTCP)
	check("VRAM -> remote heap", heapB, 4)
	fill(heapB, 6)
	xfer(t, a, Read, one(VRAM, va.Desc(0, size)), "b", one(DRAM, hb.Desc(0, size)), nil, BackendTCP)
	check("remote heap -> VRAM", devRead(t, ctx[0], da, size), 6)
	// Local VRAM -> remote shared memory (shm: a CUDA copy into the mapping).
	xfer(t, a, Write, one(VRAM, va.Desc(0, size)), "b", one(DRAM, sb.Desc(0, size)), nil, BackendSHM)
	check("VRAM -> remote shared memory", sb.Bytes(), 6)
	fill(sb.Bytes(), 8)
	xfer(t, a, Read, one(VRAM, va.Desc(0, size)), "b", one(DRAM, sb.Desc(0, size)), nil, BackendSHM)
	check("remote shared memory -> VRAM", devRead(t, ctx[0], da, size), 8)
	// Remote VRAM -> DRAM over tcp, and the target refuses a range outside
	// its region (deregistered behind a prepared list).
	xfer(t, a, Read, one(DRAM, ha.Desc(0, size)), "b", one(VRAM, vb.Desc(0, size)), nil, BackendTCP)
	check("remote VRAM -> DRAM", heapA, 4)
	rq, err := a.CreateRequest(Write, one(DRAM, ha.Desc(0, 100)), "b", one(VRAM, vb.Desc(0, 100)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.DeregisterMem(vb); err != nil {
		t.Fatal(err)
	}
	rq.Post()
	if err := rq.Wait(ctxT(t)); !errors.Is(err, ErrOutOfBounds) {
		t.Fatalf("write into a deregistered VRAM region: %v", err)
	}
	rq.Release()
	// Forcing a backend that cannot reach VRAM is refused.
	if _, err := a.CreateRequest(Write, one(VRAM, va.Desc(0, 10)), "b", one(DRAM, hb.Desc(0, 10)), &RequestOptions{Backend: BackendPVM}); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("pvm from VRAM: %v", err)
	}
}

// TestVRAMRemoteFile reads and writes a peer's file from local VRAM: tcp,
// staged here, the file I/O done by the peer's progress engine.
func TestVRAMRemoteFile(t *testing.T) {
	ctx := fakeGPU(t)
	a, b := pair(t, Config{})
	const size = bounceSize + 12345
	fr, err := b.RegisterFile(filepath.Join(t.TempDir(), "f"), FileOptions{Length: size, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	d := devAlloc(t, ctx[0], size, 7)
	v, err := a.RegisterVRAM(uint64(d), size, 0)
	if err != nil {
		t.Fatal(err)
	}
	xfer(t, a, Write, one(VRAM, v.Desc(0, size)), "b", one(FILE, fr.Desc(0, size)), nil, BackendTCP)
	if got, _ := os.ReadFile(fr.file.f.Name()); !bytes.Equal(got, pattern(size, 7)) {
		t.Fatal("VRAM -> remote file: wrong bytes")
	}
	ctx[0].CopyToDevice(d, make([]byte, size))
	xfer(t, a, Read, one(VRAM, v.Desc(0, size)), "b", one(FILE, fr.Desc(0, size)), nil, BackendTCP)
	if !bytes.Equal(devRead(t, ctx[0], d, size), pattern(size, 7)) {
		t.Fatal("remote file -> VRAM: wrong bytes")
	}
}

// fakeMappings counts the fake driver's device memory mapped in this
// process (its allocations and the IPC handles it opened).
func fakeMappings(t testing.TB) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "memfd:fakecuda")
}

// syncBuffer collects log records from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestCUDAIPCTwoProcesses: the child registers VRAM (device 1 of the fake,
// a range inside a larger allocation); the parent opens its IPC handle at
// LoadRemote and copies to and from it from DRAM and VRAM (cudaipc), the
// child checking the bytes when the notification arrives; a second agent
// with CUDA IPC disabled reaches it over tcp (the child stages). Then the
// child deregisters the region while it is mapped here, and Invalidate
// closes the mapping.
func TestCUDAIPCTwoProcesses(t *testing.T) {
	ctx := fakeGPU(t)
	const size = bounceSize + 1<<20 + 4096
	c := startChild(t, size, "P2P_TEST_VRAM=1")
	before := fakeMappings(t)
	var logs syncBuffer
	a := newAgent(t, "parent", Config{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if _, err := a.LoadRemote(ctxT(t), c.md); err != nil {
		t.Fatal(err)
	}
	cr := childRegion(t, c.md)
	if cr.Type != VRAM || cr.Dev != 1 || cr.Flags != regionIPC || cr.IPCOff != 4096 {
		t.Fatalf("child's region %+v", cr)
	}
	if n := fakeMappings(t); n != before+1 {
		t.Fatalf("%d fake device mappings after LoadRemote, %d before: the handle should be open once", n, before)
	}
	rrs, err := a.RemoteRegions("child")
	if err != nil || len(rrs) != 1 || rrs[0].Type != VRAM || rrs[0].Device != 1 || rrs[0].Bus != "0000:3c:00.0" || rrs[0].Desc(5, 6) != (Desc{Addr: cr.Base + 5, Len: 6, DevID: 1}) {
		t.Fatalf("RemoteRegions: %+v, %v", rrs, err)
	}
	remote := func(off, n uint64) DescList { return one(VRAM, rrs[0].Desc(off, n)) }
	heap := make([]byte, size)
	h, _ := a.RegisterMem(heap)
	dv := devAlloc(t, ctx[0], size, 0)
	v, err := a.RegisterVRAM(uint64(dv), size, 0)
	if err != nil {
		t.Fatal(err)
	}

	// Remote VRAM -> DRAM (device to host from the opened handle).
	xfer(t, a, Read, one(DRAM, h.Desc(0, size)), "child", remote(0, size), nil, BackendCUDAIPC)
	if !bytes.Equal(heap, pattern(size, childSeed)) {
		t.Fatal("READ of the child's VRAM: wrong bytes")
	}
	// DRAM -> remote VRAM, many pieces, checked by the child.
	fill(heap[:4096], 3)
	for off := 8192; off+4096 <= 1<<20; off += 8192 {
		copy(heap[off:off+4096], heap[:4096])
	}
	var ld, rd []Desc
	for off := uint64(0); off+4096 <= 1<<20; off += 8192 {
		ld, rd = append(ld, h.Desc(off, 4096)), append(rd, Desc{Addr: cr.Base + off, Len: 4096, DevID: 1})
	}
	xfer(t, a, Write, one(DRAM, h.Desc(0, 4096)), "child", remote(0, 4096), nil, BackendCUDAIPC)
	xfer(t, a, Write, one(DRAM, ld...), "child", one(VRAM, rd...), &RequestOptions{Notif: []byte("check 3 8192 4096 small")}, BackendCUDAIPC)
	if l := c.next(t); l != "OK small" {
		t.Fatalf("child: %q", l)
	}
	// VRAM -> remote VRAM (device to device), then back into local VRAM.
	if err := ctx[0].CopyToDevice(dv, pattern(size, 7)); err != nil {
		t.Fatal(err)
	}
	xfer(t, a, Write, one(VRAM, v.Desc(0, size)), "child", remote(0, size), &RequestOptions{Notif: []byte(fmt.Sprintf("check 7 0 %d big", size))}, BackendCUDAIPC)
	if l := c.next(t); l != "OK big" {
		t.Fatalf("child: %q", l)
	}
	ctx[0].CopyToDevice(dv, make([]byte, size))
	xfer(t, a, Read, one(VRAM, v.Desc(0, size)), "child", remote(0, size), nil, BackendCUDAIPC)
	if !bytes.Equal(devRead(t, ctx[0], dv, size), pattern(size, 7)) {
		t.Fatal("READ of the child's VRAM into VRAM: wrong bytes")
	}
	if !strings.Contains(logs.String(), "p2p transfers to child use cudaipc") {
		t.Fatalf("the backend is not logged:\n%s", logs.String())
	}

	// Over tcp: the child's progress goroutine stages its VRAM.
	b := newAgent(t, "parent-tcp", Config{DisableCUDAIPC: true})
	if _, err := b.LoadRemote(ctxT(t), c.md); err != nil {
		t.Fatal(err)
	}
	heapB := pattern(size, 9)
	hb, _ := b.RegisterMem(heapB)
	xfer(t, b, Write, one(DRAM, hb.Desc(0, size)), "child", remote(0, size), &RequestOptions{Notif: []byte(fmt.Sprintf("check 9 0 %d tcp", size))}, BackendTCP)
	if l := c.next(t); l != "OK tcp" {
		t.Fatalf("child: %q", l)
	}
	clear(heapB)
	xfer(t, b, Read, one(DRAM, hb.Desc(0, size)), "child", remote(0, size), nil, BackendTCP)
	if !bytes.Equal(heapB, pattern(size, 9)) {
		t.Fatal("tcp READ of the child's VRAM: wrong bytes")
	}

	// The child deregisters the region while it is mapped here: requests
	// prepared before fail at Post; the mapping stays until the peer is
	// forgotten.
	rq, err := a.CreateRequest(Write, one(DRAM, h.Desc(0, 100)), "child", remote(0, 100), nil)
	if err != nil {
		t.Fatal(err)
	}
	xfer(t, b, Write, one(DRAM), "child", one(VRAM), &RequestOptions{Notif: []byte("dereg")}, BackendTCP)
	if l := c.next(t); l != "DEREG <nil>" {
		t.Fatalf("child: %q", l)
	}
	ra, _ := a.remote("child")
	waitFor(t, func() bool { _, dropped := ra.droppedAny([]uint32{cr.ID}); return dropped })
	if _, err := rq.Post(); !errors.Is(err, ErrOutOfBounds) {
		t.Fatalf("Post into a deregistered VRAM region: %v", err)
	}
	rq.Release()
	if _, err := a.PrepareRemote("child", remote(0, 100)); !errors.Is(err, ErrOutOfBounds) {
		t.Fatalf("prepare after deregistration: %v", err)
	}
	if n := fakeMappings(t); n != before+2 { // the handle, and dv
		t.Fatalf("%d fake device mappings, want %d", n, before+2)
	}
	if err := a.Invalidate("child"); err != nil {
		t.Fatal(err)
	}
	if n := fakeMappings(t); n != before+1 {
		t.Fatalf("%d fake device mappings after Invalidate, want %d (the handle closed)", n, before+1)
	}
	exitChild(t, b, c)
}

// TestVRAMToSharedMemoryOfAnotherProcess: local VRAM to and from a peer's
// Alloc'd DRAM, mapped here: CUDA copies into the mapping (shm), pinned
// once.
func TestVRAMToSharedMemoryOfAnotherProcess(t *testing.T) {
	ctx := fakeGPU(t)
	const size = 2<<20 + 4096
	c := startChild(t, size)
	a := newAgent(t, "parent", Config{})
	if _, err := a.LoadRemote(ctxT(t), c.md); err != nil {
		t.Fatal(err)
	}
	cr := childRegion(t, c.md)
	dv := devAlloc(t, ctx[1], size, 0)
	v, err := a.RegisterVRAM(uint64(dv), size, 1)
	if err != nil {
		t.Fatal(err)
	}
	xfer(t, a, Read, one(VRAM, v.Desc(0, size)), "child", one(DRAM, Desc{Addr: cr.Base, Len: size}), nil, BackendSHM)
	if !bytes.Equal(devRead(t, ctx[1], dv, size), pattern(size, childSeed)) {
		t.Fatal("READ of the child's shared memory into VRAM: wrong bytes")
	}
	ctx[1].CopyToDevice(dv, pattern(size, 5))
	xfer(t, a, Write, one(VRAM, v.Desc(0, size)), "child", one(DRAM, Desc{Addr: cr.Base, Len: size}),
		&RequestOptions{Notif: []byte(fmt.Sprintf("check 5 0 %d shm", size))}, BackendSHM)
	if l := c.next(t); l != "OK shm" {
		t.Fatalf("child: %q", l)
	}
	ra, _ := a.remote("child")
	ra.mu.Lock()
	pinned := ra.pins[cr.ID]
	ra.mu.Unlock()
	if !pinned {
		t.Fatal("the mapped shared region was not pinned")
	}
	exitChild(t, a, c)
	a.gpu.mu.Lock()
	left := len(a.gpu.pins)
	a.gpu.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d pins left after the peer left", left)
	}
}
