// Package tests holds gccl's multi-process, multi-host and fault tests: real
// processes started by gccl-run (or by hand, where the launcher's own
// failure policy would hide what is tested), talking over shared memory and
// TCP.
package tests

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gccl/gccl/internal/testutil"
)

// bins holds the programs built once for the whole package.
var bins struct {
	dir, run, collcheck, collcheckOld, devcheck string
}

func TestMain(m *testing.M) {
	code, err := buildAndRun(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tests:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func buildAndRun(m *testing.M) (int, error) {
	dir, err := os.MkdirTemp("", "gccl-tests-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	bins.dir = dir
	bins.run = filepath.Join(dir, "gccl-run")
	bins.collcheck = filepath.Join(dir, "collcheck")
	bins.collcheckOld = filepath.Join(dir, "collcheck-old")
	bins.devcheck = filepath.Join(dir, "devcheck")
	builds := [][]string{
		{"-o", bins.run, "../cmd/gccl-run"},
		{"-o", bins.collcheck, "./collcheck"},
		{"-o", bins.devcheck, "./devcheck"},
		// A rank that claims another library version, for the mismatch test.
		{"-o", bins.collcheckOld, "-ldflags", "-X github.com/gccl/gccl/bootstrap.Version=0.0.1-old", "./collcheck"},
	}
	for _, args := range builds {
		cmd := exec.Command("go", append([]string{"build"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return 0, fmt.Errorf("go build %v: %v\n%s", args, err, out)
		}
	}
	return m.Run(), nil
}

// result is what a finished process printed and how it exited.
type result struct {
	out  string
	code int
	took time.Duration
}

// run runs a command with extra environment, failing the test if it does
// not finish within limit.
func run(t *testing.T, limit time.Duration, env []string, argv ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	// These tests are about shared memory and TCP: on a host with an
	// RDMA device, pairs would go over it (tests/ib covers that).
	cmd.Env = append(append(testutil.EnvWithoutJob(), "GCCL_IB_DISABLE=1"), env...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	start := time.Now()
	err := cmd.Run()
	res := result{out: buf.String(), took: time.Since(start)}
	if ctx.Err() != nil {
		t.Fatalf("%v did not finish within %v:\n%s", argv, limit, res.out)
	}
	if ee, ok := err.(*exec.ExitError); ok {
		res.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%v: %v", argv, err)
	}
	return res
}

// shmLeftovers lists gccl segments in /dev/shm.
func shmLeftovers(t *testing.T, jobID string) []string {
	t.Helper()
	m, err := filepath.Glob("/dev/shm/gccl-" + jobID + "*")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func mustContain(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Fatalf("output lacks %q:\n%s", w, out)
		}
	}
}

func mustNotContain(t *testing.T, out string, bad ...string) {
	t.Helper()
	for _, b := range bad {
		if strings.Contains(out, b) {
			t.Errorf("output contains %q:\n%s", b, out)
		}
	}
}
