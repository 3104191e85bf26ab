//go:build linux && cgo

package cuda

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeDriver compiles testdata/fakecuda.c into a shared library and makes
// Load use it.
func fakeDriver(t *testing.T, flags ...string) {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc is not installed: cannot build the fake driver")
	}
	lib := filepath.Join(t.TempDir(), "libfakecuda.so")
	args := append([]string{"-shared", "-fPIC", "-o", lib, "testdata/fakecuda.c"}, flags...)
	if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("building the fake driver: %v\n%s", err, out)
	}
	t.Setenv("GCCL_CUDA_LIBRARY", lib)
}

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
	h, err := ctx.IPCHandle(p)
	if err != nil || DevicePtr(binary.LittleEndian.Uint64(h[:8])) != p {
		t.Errorf("IPC handle %x, %v", h[:8], err)
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
