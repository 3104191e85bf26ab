//go:build linux && cgo

package cufile_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/gccl/gccl/internal/cuda"
	"github.com/gccl/gccl/internal/cuda/cudatest"
	"github.com/gccl/gccl/internal/cuda/devtest"
	"github.com/gccl/gccl/internal/cufile"
)

func TestLoadWithoutLibrary(t *testing.T) {
	t.Setenv("GCCL_CUFILE_LIBRARY", filepath.Join(t.TempDir(), "libcufile.so.0"))
	if _, err := cufile.Load(); !errors.Is(err, cuda.ErrNotSupported) {
		t.Fatalf("Load: %v, want ErrNotSupported", err)
	}
}

// Where the nvidia-fs driver is missing, cuFileDriverOpen fails: Load says
// so, as ErrNotSupported carrying the library's status.
func TestLoadWithoutDriver(t *testing.T) {
	cudatest.FakeCuFile(t)
	t.Setenv("FAKECUFILE_NO_DRIVER", "1")
	_, err := cufile.Load()
	var ce *cufile.Error
	if !errors.Is(err, cuda.ErrNotSupported) || !errors.As(err, &ce) || ce.Status != 5001 {
		t.Fatalf("Load: %v, want ErrNotSupported with status 5001", err)
	}
}

// device opens device 0 of the fake driver (of the installed one with
// GCCL_TEST_REAL_GPU=1) and allocates n bytes on it.
func device(t *testing.T, n int) (*cuda.Context, cuda.DevicePtr) {
	t.Helper()
	cudatest.Driver(t)
	ctx := devtest.Context(t)
	p, err := ctx.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Free(p) })
	return ctx, p
}

// Bytes move between a file and device memory both ways, at offsets; a
// read past the end returns what there is; an unregistrable descriptor
// and a failing read are errors. With GCCL_TEST_REAL_GPU=1 this runs on
// the installed driver and libcufile (tests/gpu_acceptance.sh, step 6).
func TestReadWrite(t *testing.T) {
	const n = 1 << 16
	ctx, dev := device(t, n)
	cudatest.CuFile(t)
	lib, err := cufile.Load()
	if cudatest.RealGPU() && errors.Is(err, cuda.ErrNotSupported) {
		t.Skipf("no usable cuFile here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Close()

	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i*7 + 3)
	}
	path := filepath.Join(t.TempDir(), "kv")
	if err := os.WriteFile(path, want, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h, err := lib.Register(int(f.Fd()))
	var ce *cufile.Error
	if cudatest.RealGPU() && errors.As(err, &ce) && ce.Status == cufile.StatusHandleNotRegistered {
		// cuFile refuses every file of a machine whose block devices it
		// cannot describe (no udev, as in a VM): nothing to test here.
		t.Skipf("cuFile registers no file on this machine: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Deregister(h)

	// File to device, then device to the file's second half.
	var got, wrote int
	if err := ctx.Do(func() error {
		var err error
		if got, err = lib.Read(h, dev, n, 0); err != nil {
			return err
		}
		wrote, err = lib.Write(h, dev, n/2, n/2)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got != n || wrote != n/2 {
		t.Fatalf("read %d and wrote %d bytes, want %d and %d", got, wrote, n, n/2)
	}
	onDev := make([]byte, n)
	if err := ctx.CopyFromDevice(onDev, dev); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(onDev, want) {
		t.Fatal("device memory differs from the file read into it")
	}
	inFile, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(inFile[:n/2], want[:n/2]) || !bytes.Equal(inFile[n/2:], want[:n/2]) {
		t.Fatal("the file's second half is not the device's first half")
	}

	// Past the end: what there is.
	if err := ctx.Do(func() error {
		var err error
		got, err = lib.Read(h, dev, n, n-100)
		return err
	}); err != nil || got != 100 {
		t.Fatalf("read across the end: %d bytes, %v; want 100", got, err)
	}

	// (The fake refuses a read without a current context, but whether this
	// goroutine's thread still has one from Do is up to the scheduler.)
	if _, err := lib.Register(-1); !errors.As(err, &ce) {
		t.Errorf("Register(-1): %v, want a *cufile.Error", err)
	}
	wo, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer wo.Close()
	hw, err := lib.Register(int(wo.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Deregister(hw)
	if err := ctx.Do(func() error { _, err := lib.Read(hw, dev, 10, 0); return err }); !errors.Is(err, syscall.EBADF) {
		t.Errorf("read of a write-only descriptor: %v, want EBADF", err)
	}
	if _, err := lib.Read(h, dev, -1, 0); err == nil {
		t.Error("a read of -1 bytes succeeded")
	}
}
