package p2p

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/gccl/gccl/internal/testutil"
)

func TestRegistrationCache(t *testing.T) {
	a := newAgent(t, "a", Config{ListenAddr: "-"})
	buf := make([]byte, 1<<20)
	r1, err := a.RegisterMem(buf)
	if err != nil {
		t.Fatal(err)
	}
	gen := a.gen
	// The same range, and a range inside it: cache hits, same region.
	r2, err := a.RegisterMem(buf)
	if err != nil || r2 != r1 {
		t.Fatalf("re-registration: %v, %v", r2, err)
	}
	r3, err := a.RegisterMem(buf[4096:8192])
	if err != nil || r3 != r1 {
		t.Fatalf("sub-range registration: %v, %v", r3, err)
	}
	if a.gen != gen {
		t.Fatal("a cache hit changed the metadata")
	}
	// An overlapping range that no region holds is a region of its own.
	other := make([]byte, 1<<20)
	r4, err := a.RegisterMem(other)
	if err != nil || r4 == r1 {
		t.Fatalf("separate buffer: %v, %v", r4, err)
	}
	// Three registrations of r1: two deregistrations keep it.
	for i := 0; i < 2; i++ {
		if err := a.DeregisterMem(r1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.pinLocal(DRAM, AddrOf(buf), 10, 0); err != nil {
		t.Fatalf("region gone after partial deregistration: %v", err)
	}
	r1.busy.Add(-1)
	// In use by a prepared list: refused, then fine once released.
	pl, err := a.PrepareLocal(DescList{Type: DRAM, Descs: []Desc{{Addr: AddrOf(buf), Len: 100}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.DeregisterMem(r1); !errors.Is(err, ErrRegionBusy) {
		t.Fatalf("deregistration while in use: %v", err)
	}
	pl.Release()
	if err := a.DeregisterMem(r1); err != nil {
		t.Fatal(err)
	}
	if err := a.DeregisterMem(r1); err == nil {
		t.Fatal("double deregistration accepted")
	}
	if _, err := a.PrepareLocal(DescList{Type: DRAM, Descs: []Desc{{Addr: AddrOf(buf), Len: 100}}}); !errors.Is(err, ErrOutOfBounds) {
		t.Fatalf("descriptor of a deregistered region: %v", err)
	}
	if _, err := a.RegisterVRAM(0, 10, 0); err == nil {
		t.Fatal("VRAM at address 0 accepted")
	}
	if _, err := a.RegisterMem(nil); err == nil {
		t.Fatal("empty registration accepted")
	}
}

func TestAllocRegionShared(t *testing.T) {
	a := newAgent(t, "a", Config{ListenAddr: "-"})
	r, err := a.Alloc(1 << 20)
	testutil.SkipIfNotSupported(t, err) // shared memory off Linux
	if !r.Shared() || r.Len() != 1<<20 {
		t.Fatalf("shared %v len %d", r.Shared(), r.Len())
	}
	// A sub-range registration of an allocated region is a cache hit.
	r2, err := a.RegisterMem(r.Bytes()[100:200])
	if err != nil || r2 != r {
		t.Fatalf("sub-range: %v %v", r2, err)
	}
	a.DeregisterMem(r2)
	if err := a.DeregisterMem(r); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkRegisterCached measures re-registering a registered 1 GiB
// region (a cache hit) and deregistering it again.
func BenchmarkRegisterCached(b *testing.B) {
	a := newAgent(b, "a", Config{ListenAddr: "-"})
	buf := make([]byte, 1<<30)
	r, err := a.RegisterMem(buf)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r2, err := a.RegisterMem(buf)
		if err != nil || r2 != r {
			b.Fatal(err)
		}
		a.DeregisterMem(r2)
	}
}

// TestRegisterFileNotSharedWithFD: RegisterFile of a range that
// RegisterFileFD registered must not share that registration, whose
// descriptor is the caller's: once that caller deregisters and closes it
// (as the docs allow), the RegisterFile region must still work.
func TestRegisterFileNotSharedWithFD(t *testing.T) {
	a := newAgent(t, "a", Config{ListenAddr: "-"})
	path := filepath.Join(t.TempDir(), "f")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(8192); err != nil {
		t.Fatal(err)
	}
	byFD, err := a.RegisterFileFD(f, FileOptions{Length: 8192})
	if err != nil {
		t.Fatal(err)
	}
	byPath, err := a.RegisterFile(path, FileOptions{Length: 8192})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.DeregisterMem(byFD); err != nil {
		t.Fatal(err)
	}
	f.Close()
	src := bytes.Repeat([]byte{0xab}, 4096)
	lr, _ := a.RegisterMem(src)
	req, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, 4096)}}, "a", DescList{Type: FILE, Descs: []Desc{byPath.Desc(0, 4096)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer req.Release()
	req.Post()
	if err := req.Wait(ctxT(t)); err != nil {
		t.Fatalf("a write through the RegisterFile region after the RegisterFileFD caller closed its descriptor: %v", err)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got[:4096], src) {
		t.Fatal("the file does not hold the data")
	}
	// A RegisterFileFD of a range RegisterFile opened may share that
	// region: its descriptor is the agent's.
	f2, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	if r, err := a.RegisterFileFD(f2, FileOptions{Length: 8192}); err != nil || r != byPath {
		t.Fatalf("RegisterFileFD of a range RegisterFile holds: %v, %v (want the same region)", r, err)
	}
}

// TestRegisterFileCacheHitKeepsNoFD: a cached RegisterFile must not keep
// the descriptor it opened (the region uses the first registration's).
func TestRegisterFileCacheHitKeepsNoFD(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("counts /proc/self/fd")
	}
	fds := func() int { e, _ := os.ReadDir("/proc/self/fd"); return len(e) }
	a := newAgent(t, "a", Config{ListenAddr: "-"})
	path := filepath.Join(t.TempDir(), "f")
	r1, err := a.RegisterFile(path, FileOptions{Length: 8192, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	f0 := fds()
	for range 5 {
		r, err := a.RegisterFile(path, FileOptions{Length: 8192})
		if err != nil || r != r1 {
			t.Fatalf("cached registration: %v, %v", r, err)
		}
	}
	if f := fds(); f != f0 {
		t.Fatalf("5 cached RegisterFile calls left %d more file descriptors open", f-f0)
	}
	for range 6 {
		if err := a.DeregisterMem(r1); err != nil {
			t.Fatal(err)
		}
	}
}
