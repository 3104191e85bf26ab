// Package cudatest builds the fake CUDA driver (internal/cuda/testdata/
// fakecuda.c) for the tests of gccl's GPU paths on machines without a GPU,
// and tells whether a real driver is present.
package cudatest

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// dir is internal/cuda, found from this file's path.
func dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// Build compiles the fake driver with the host build of gccl's kernels
// and returns the library's path, or skips t when gcc is absent. Libraries
// are cached by the hash of their sources in the user's cache directory
// (cacheDir), so repeated tests share one build; the processes of a
// multi-process test share it through GCCL_CUDA_LIBRARY.
func Build(t testing.TB, flags ...string) string {
	t.Helper()
	kern := filepath.Join(filepath.Dir(dir()), "kernels")
	args := []string{"-I", kern}
	if _, err := os.Stat(filepath.Join(kern, "hostemu.c")); err == nil {
		args = append(args, "-DGCCL_HOSTEMU")
	}
	return build(t, "fakecuda", filepath.Join(dir(), "testdata", "fakecuda.c"),
		[]string{filepath.Join(kern, "hostemu.c"), filepath.Join(kern, "hostemu.h"),
			filepath.Join(kern, "reduce.cu"), filepath.Join(kern, "gccl_kernels.h")},
		append(args, flags...))
}

// build compiles src (which includes deps) into a shared library named
// after name and the hash of the sources and flags, once.
func build(t testing.TB, name, src string, deps, flags []string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc is not installed: cannot build the fake " + name + " library")
	}
	if _, err := os.Stat(src); err != nil {
		// A test binary built on another machine (tests/gpu_bundle.sh).
		t.Skipf("cannot build the fake %s library, its source is not here: %v", name, err)
	}
	h := sha256.New()
	for _, f := range append([]string{src}, deps...) {
		b, err := os.ReadFile(f)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		h.Write(b)
	}
	args := append([]string{"-shared", "-fPIC", "-O2"}, flags...)
	for _, a := range args {
		h.Write([]byte(a + "\x00"))
	}
	dir := cacheDir(t)
	lib := filepath.Join(dir, name+"-"+hex.EncodeToString(h.Sum(nil))[:16]+".so")
	if _, err := os.Stat(lib); err == nil {
		return lib
	}
	tmp, err := os.CreateTemp(dir, name+"-*.so")
	if err != nil {
		t.Fatal(err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	if out, err := exec.Command(gcc, append(args, "-o", tmp.Name(), src, "-ldl")...).CombinedOutput(); err != nil {
		t.Fatalf("building the fake %s library: %v\n%s", name, err, out)
	}
	if err := os.Rename(tmp.Name(), lib); err != nil {
		t.Fatal(err)
	}
	return lib
}

// cacheDir is the directory of built libraries: gccl-test in the user's
// cache directory, made private to the user. Never a fixed name in the
// shared temporary directory: another user could have put a library there
// for the tests to load (or made it unreadable, failing them). Without a
// cache directory (no $HOME), each test builds into its own temporary one.
func cacheDir(t testing.TB) string {
	t.Helper()
	base, err := os.UserCacheDir()
	if err != nil {
		return t.TempDir()
	}
	dir := filepath.Join(base, "gccl-test")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatalf("the fake libraries' cache: %v", err)
	}
	return dir
}

// FakeCuFile builds the fake cuFile library (internal/cufile/testdata/
// fakecufile.c: file I/O straight into the fake driver's device memory,
// refused without a current context) and makes cufile.Load use it for the
// rest of t (GCCL_CUFILE_LIBRARY).
func FakeCuFile(t testing.TB) {
	t.Helper()
	src := filepath.Join(filepath.Dir(dir()), "cufile", "testdata", "fakecufile.c")
	t.Setenv("GCCL_CUFILE_LIBRARY", build(t, "fakecufile", src, nil, nil))
}

// Fake builds the fake driver and makes the loader use it for the rest of
// t (GCCL_CUDA_LIBRARY, which child processes inherit).
func Fake(t testing.TB, flags ...string) {
	t.Helper()
	lib := Build(t, flags...)
	t.Setenv("GCCL_CUDA_LIBRARY", lib)
}

// RealGPU reports whether the tests were asked to run on the installed
// CUDA driver and GPU (GCCL_TEST_REAL_GPU=1) instead of the fake driver.
func RealGPU() bool { return os.Getenv("GCCL_TEST_REAL_GPU") == "1" }

// Driver makes the tests of GPU paths use the real driver when RealGPU,
// else the fake one built with flags (Fake). Tests of the fake's own
// behaviour use Fake.
func Driver(t testing.TB, flags ...string) {
	t.Helper()
	if RealGPU() {
		t.Setenv("GCCL_CUDA_LIBRARY", "")
		return
	}
	Fake(t, flags...)
}

// CuFile makes the tests of cuFile paths use the installed libcufile when
// RealGPU (or the one GCCL_CUFILE_LIBRARY already names: a GPU machine may
// have it only in a Python package), else the fake one (FakeCuFile).
func CuFile(t testing.TB) {
	t.Helper()
	if !RealGPU() {
		FakeCuFile(t)
	}
}
