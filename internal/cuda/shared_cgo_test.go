//go:build linux && cgo

package cuda

import (
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func openShared(t *testing.T) *Shared {
	t.Helper()
	s, err := OpenShared()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Two references share the driver, each device's context and the values
// kept with it; the last one to close releases them, and the next
// OpenShared starts afresh.
func TestSharedDriverAndContexts(t *testing.T) {
	fakeDriver(t)
	a, b := openShared(t), openShared(t)
	if a.Driver() != b.Driver() || a.DeviceCount() != 2 {
		t.Fatalf("drivers %p and %p, %d devices", a.Driver(), b.Driver(), a.DeviceCount())
	}
	ca, err := a.Context(1)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := b.Context(1)
	if err != nil {
		t.Fatal(err)
	}
	c0, err := a.Context(0)
	if err != nil {
		t.Fatal(err)
	}
	if ca != cb || ca == c0 {
		t.Fatal("not one context per device in the process")
	}
	if _, err := a.Context(2); err == nil || !strings.Contains(err.Error(), "device 2 does not exist (this process sees 2)") {
		t.Fatalf("Context(2): %v", err)
	}

	if bus, err := a.PCIBusID(1); bus != "0000:3c:00.0" || err != nil {
		t.Fatalf("PCIBusID(1): %q, %v", bus, err)
	}
	if b.DeviceOfBus("0000:3c:00.0") != 1 || b.DeviceOfBus("0000:ff:00.0") != -1 || b.DeviceOfBus("") != -1 {
		t.Fatal("DeviceOfBus")
	}

	type key struct{}
	made := 0
	mk := func() any { made++; return new(int) }
	va, err := a.Value(1, key{}, mk)
	if err != nil {
		t.Fatal(err)
	}
	vb, err := b.Value(1, key{}, mk)
	if err != nil {
		t.Fatal(err)
	}
	if va != vb || made != 1 {
		t.Fatalf("values %p and %p, made %d times: want one per context", va, vb, made)
	}

	drv := a.Driver()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
	if _, err := a.Context(1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Context after Close: %v", err)
	}
	if _, err := a.Import(1, IPCHandle{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Import after Close: %v", err)
	}
	p, err := cb.Alloc(4096) // b still holds the context
	if err != nil {
		t.Fatal(err)
	}
	if err := cb.Free(p); err != nil {
		t.Fatal(err)
	}

	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := drv.DeviceCount(); !errors.Is(err, ErrClosed) {
		t.Fatalf("the last Close left the driver open: %v", err)
	}
	c := openShared(t)
	if c.Driver() == drv {
		t.Fatal("a new reference did not load the driver again")
	}
	if vc, err := c.Value(1, key{}, mk); err != nil || vc == va {
		t.Fatalf("the value outlived its context: %v", err)
	}
}

// Without a driver OpenShared fails as Load does, and a failure is not
// remembered.
func TestSharedWithoutDriver(t *testing.T) {
	t.Setenv("GCCL_CUDA_LIBRARY", "/nonexistent/libcuda.so.1")
	if _, err := OpenShared(); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("OpenShared without a driver: %v", err)
	}
	fakeDriver(t)
	s, err := OpenShared()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// Imports of one handle, by one or several references, share one mapping,
// unmapped by the last Close, or by the end of the last deferral of the
// context's closes; Shared.Close closes what its reference left open. The
// handle is exported by this process and imported in a child (the driver
// refuses a process its own handles).
func TestSharedImports(t *testing.T) {
	if hs := os.Getenv("GCCL_TEST_SHARED_IMPORT"); hs != "" {
		sharedImportChild(t, hs)
		return
	}
	fakeDriver(t)
	_, ctx := device0(t)
	p, err := ctx.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Free(p)
	if err := ctx.CopyToDevice(p+4096, []byte("shared import")); err != nil {
		t.Fatal(err)
	}
	h, err := ctx.IPCHandle(p)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSharedImports$", "-test.v")
	cmd.Env = append(os.Environ(), "GCCL_TEST_SHARED_IMPORT="+hex.EncodeToString(h[:]))
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func sharedImportChild(t *testing.T, hs string) {
	var h IPCHandle
	if b, err := hex.DecodeString(hs); err != nil || copy(h[:], b) != len(h) {
		t.Fatalf("handle %q: %v", hs, err)
	}
	maps := func() int {
		b, err := os.ReadFile("/proc/self/maps")
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(b), "memfd:fakecuda")
	}
	read := func(imp *Import) string {
		got := make([]byte, 13)
		if err := imp.Context().CopyFromDevice(got, imp.Base()+4096); err != nil {
			t.Fatal(err)
		}
		return string(got)
	}
	mapped := func(want int, what string) {
		t.Helper()
		if n := maps(); n != want {
			t.Fatalf("%s: %d mappings, want %d", what, n, want)
		}
	}
	before := maps()
	s1, s2 := openShared(t), openShared(t)
	var imps [3]*Import
	for i, s := range []*Shared{s1, s2, s2} {
		var err error
		if imps[i], err = s.Import(0, h); err != nil {
			t.Fatal(err)
		}
	}
	i1, i2, i3 := imps[0], imps[1], imps[2]
	if i1.Base() != i2.Base() || i1.Base() != i3.Base() || i1.Size() != 1<<20 || i1.Ordinal() != 0 {
		t.Fatalf("imports at %#x, %#x, %#x of %d bytes on device %d", i1.Base(), i2.Base(), i3.Base(), i1.Size(), i1.Ordinal())
	}
	mapped(before+1, "three imports")
	if got := read(i2); got != "shared import" {
		t.Fatalf("read %q through the import", got)
	}

	for _, err := range []error{i1.Close(), i1.Close(), i2.Close()} {
		if err != nil {
			t.Fatal(err)
		}
	}
	mapped(before+1, "i3 still open")
	if got := read(i3); got != "shared import" {
		t.Fatalf("read %q through the last import", got)
	}

	// Deferred: the last Close leaves the mapping until the deferral ends.
	end1, err := s1.DeferCloses(0)
	if err != nil {
		t.Fatal(err)
	}
	end2, err := s2.DeferCloses(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := i3.Close(); err != nil {
		t.Fatal(err)
	}
	mapped(before+1, "closed while closes are deferred")
	if err := end1(); err != nil {
		t.Fatal(err)
	}
	mapped(before+1, "one deferral of two ended")
	if err := end1(); err != nil {
		t.Fatalf("a second end: %v", err)
	}
	if err := end2(); err != nil {
		t.Fatal(err)
	}
	mapped(before, "the last deferral ended")

	// Opened again after the last close; Shared.Close closes what is left.
	i4, err := s1.Import(0, h)
	if err != nil {
		t.Fatal(err)
	}
	mapped(before+1, "opened again")
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	mapped(before, "Shared.Close")
	if err := i4.Close(); err != nil {
		t.Fatalf("Close of an import its reference closed: %v", err)
	}
	var ce *Error
	if _, err := s2.Import(0, IPCHandle{}); !errors.As(err, &ce) {
		t.Fatalf("a bad handle: %v", err)
	}
}
