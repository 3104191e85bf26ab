// Package verbstest builds the fake libibverbs (internal/verbs/testdata/
// fakeibv.c) for the tests of gccl's RDMA paths on machines without an
// RDMA device, and runs tests against it.
//
// internal/verbs loads its library once per process, so a test binary uses
// either the installed libibverbs or the fake: tests against the fake run
// in a child process of the test binary (RunChild), which InChild tells
// apart.
package verbstest

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// ChildEnv is set (to "1") in the environment of the child processes
// RunChild starts.
const ChildEnv = "GCCL_TEST_FAKE_IBV"

// dir is internal/verbs, found from this file's path.
func dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// Build compiles the fake library once (cached by the hash of its sources
// in the user's cache directory) and returns its path, or skips t when gcc
// or the sources are absent.
func Build(t testing.TB) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc is not installed: cannot build the fake libibverbs")
	}
	src := filepath.Join(dir(), "testdata", "fakeibv.c")
	hdr := filepath.Join(dir(), "ibv_abi.h")
	h := sha256.New()
	for _, f := range []string{src, hdr} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Skipf("cannot build the fake libibverbs, its source is not here: %v", err)
		}
		h.Write(b)
	}
	cache, err := os.UserCacheDir()
	var out string
	if err == nil {
		out = filepath.Join(cache, "gccl-test")
		err = os.MkdirAll(out, 0o700)
	}
	if err != nil {
		out = t.TempDir()
	}
	lib := filepath.Join(out, "fakeibv-"+hex.EncodeToString(h.Sum(nil))[:16]+".so")
	if _, err := os.Stat(lib); err == nil {
		return lib
	}
	tmp, err := os.CreateTemp(out, "fakeibv-*.so")
	if err != nil {
		t.Fatal(err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	if b, err := exec.Command(gcc, "-shared", "-fPIC", "-O2", "-pthread", "-o", tmp.Name(), src).CombinedOutput(); err != nil {
		t.Fatalf("building the fake libibverbs: %v\n%s", err, b)
	}
	if err := os.Rename(tmp.Name(), lib); err != nil {
		t.Fatal(err)
	}
	return lib
}

// InChild reports whether this process is a child RunChild started: its
// verbs library is the fake.
func InChild() bool { return os.Getenv(ChildEnv) == "1" }

// RunChild runs the tests of this test binary that match pattern in a
// child process whose internal/verbs loads the fake library, with env
// added, and fails t if they fail (their output is t's log). The child's
// tests check InChild and skip otherwise.
func RunChild(t *testing.T, pattern string, env ...string) {
	t.Helper()
	lib := Build(t)
	args := []string{"-test.run=" + pattern, "-test.count=1"}
	if testing.Verbose() {
		args = append(args, "-test.v")
	}
	if testing.Short() {
		args = append(args, "-test.short")
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), append([]string{"GCCL_IBVERBS_LIBRARY=" + lib, ChildEnv + "=1"}, env...)...)
	out, err := cmd.CombinedOutput()
	t.Logf("child %s (fake libibverbs):\n%s", pattern, out)
	if err != nil {
		t.Fatalf("the tests %s against the fake libibverbs failed: %v", pattern, err)
	}
}
