// Package ib holds gccl's multi-process tests over RDMA: real processes
// started by gccl-run or by hand, talking over the ibverbs transport. They
// need an RDMA device, so on a host without one they skip; tests/rxe/run.sh
// runs them in a qemu VM with Soft-RoCE (rdma_rxe), and TestTwoHosts in two
// such VMs joined by a virtual wire.
//
// The programs they start (gccl-run, collcheck, gccl-perf) come from
// GCCL_TEST_BIN_DIR when set (tests/rxe/run.sh builds them on the host, as
// building inside the emulated VM takes minutes), else are built here.
package ib

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gccl/gccl/internal/launch"
	"github.com/gccl/gccl/internal/testutil"
	"github.com/gccl/gccl/internal/verbs"
)

var bins struct {
	run, collcheck, perf string
	err                  error // why there are none
}

func TestMain(m *testing.M) {
	code := func() int {
		if dir := os.Getenv("GCCL_TEST_BIN_DIR"); dir != "" {
			bins.run, bins.collcheck, bins.perf = filepath.Join(dir, "gccl-run"), filepath.Join(dir, "collcheck"), filepath.Join(dir, "gccl-perf")
			return m.Run()
		}
		if _, err := verbs.Devices(); err != nil {
			bins.err = err // every test skips (or fails, under GCCL_TEST_REQUIRE_RDMA=1)
			return m.Run()
		}
		dir, err := os.MkdirTemp("", "gccl-ibtests-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		bins.run, bins.collcheck, bins.perf = filepath.Join(dir, "gccl-run"), filepath.Join(dir, "collcheck"), filepath.Join(dir, "gccl-perf")
		for _, b := range [][2]string{{bins.run, "../../cmd/gccl-run"}, {bins.collcheck, "../collcheck"}, {bins.perf, "../../cmd/gccl-perf"}} {
			if out, err := exec.Command("go", "build", "-o", b[0], b[1]).CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "go build %s: %v\n%s", b[1], err, out)
				return 1
			}
		}
		return m.Run()
	}()
	os.Exit(code)
}

// requireDevice skips the test without an RDMA device here (fails it under
// GCCL_TEST_REQUIRE_RDMA=1, as tests/rxe/run.sh sets in its VMs).
func requireDevice(t *testing.T) {
	t.Helper()
	err := bins.err
	if err == nil {
		_, err = verbs.Devices()
	}
	if err != nil && os.Getenv("GCCL_TEST_REQUIRE_RDMA") == "1" {
		t.Fatalf("GCCL_TEST_REQUIRE_RDMA=1, but: %v", err)
	}
	if errors.Is(err, verbs.ErrNotSupported) {
		err = fmt.Errorf("%w (tests/rxe/run.sh runs these tests in a Soft-RoCE VM)", err)
	}
	testutil.SkipIfNotSupported(t, err)
}

// inVM skips the test unless it runs as root inside the rxe VM, where it
// may add devices and move links.
func inVM(t *testing.T) {
	t.Helper()
	if os.Getenv("RXEVM") != "1" || os.Geteuid() != 0 {
		t.Skip("changes the VM's network and RDMA devices: runs only inside tests/rxe's VM")
	}
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
	cmd.Env = append(testutil.EnvWithoutJob(), env...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	start := time.Now()
	err := cmd.Run()
	res := result{out: buf.String(), took: time.Since(start)}
	if ctx.Err() != nil {
		t.Fatalf("%v did not finish within %v:\n%s", argv, limit, res.out)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		res.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%v: %v", argv, err)
	}
	return res
}

func mustContain(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Fatalf("output lacks %q:\n%s", w, out)
		}
	}
}

// rankProcs are the ranks of one job started by hand, so that each gets
// its own environment (a host identity, an HCA) and a survivor's own
// failure handling shows (gccl-run would kill the others).
type rankProcs struct {
	cmds  []*exec.Cmd
	outs  []*testutil.SyncBuffer
	mu    sync.Mutex
	codes []int
	ended []time.Time
	done  []chan struct{}
}

// startRanks starts every rank of an np-rank job: argv is each rank's
// command line (a prefix such as setpriv may precede the program), env its
// additional variables.
func startRanks(t *testing.T, np int, argv func(r int) []string, env func(r int) []string) *rankProcs {
	t.Helper()
	job := &launch.Job{NProcs: np, Argv: []string{"unused"}, Env: testutil.EnvWithoutJob()}
	if err := job.Resolve(); err != nil {
		t.Fatal(err)
	}
	p := &rankProcs{cmds: make([]*exec.Cmd, np), outs: make([]*testutil.SyncBuffer, np),
		codes: make([]int, np), ended: make([]time.Time, np), done: make([]chan struct{}, np)}
	for r := range np {
		a := argv(r)
		cmd := exec.Command(a[0], a[1:]...)
		cmd.Env = append(job.RankEnv(r), env(r)...)
		p.outs[r] = &testutil.SyncBuffer{}
		cmd.Stdout, cmd.Stderr = p.outs[r], p.outs[r]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		p.cmds[r], p.done[r] = cmd, make(chan struct{})
		go func() {
			err := cmd.Wait()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			}
			p.mu.Lock()
			p.codes[r], p.ended[r] = code, time.Now()
			p.mu.Unlock()
			close(p.done[r])
		}()
	}
	t.Cleanup(func() {
		for r, c := range p.cmds {
			c.Process.Signal(syscall.SIGCONT)
			c.Process.Kill()
			<-p.done[r]
		}
	})
	return p
}

// wait waits for rank r to end and returns its exit code and output.
func (p *rankProcs) wait(t *testing.T, r int, limit time.Duration) (int, string) {
	t.Helper()
	select {
	case <-p.done[r]:
	case <-time.After(limit):
		// A Go program prints every goroutine's stack on SIGQUIT.
		p.cmds[r].Process.Signal(syscall.SIGQUIT)
		select {
		case <-p.done[r]:
		case <-time.After(5 * time.Second):
		}
		t.Fatalf("rank %d still running after %v (hung):\n%s", r, limit, p.outs[r].String())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.codes[r], p.outs[r].String()
}

// waitAll waits for every rank and fails t unless all exited 0, showing
// every rank's output (a stall is often explained by the other rank's);
// it returns their outputs.
func (p *rankProcs) waitAll(t *testing.T, limit time.Duration) []string {
	t.Helper()
	outs := make([]string, len(p.cmds))
	codes := make([]int, len(p.cmds))
	failed := false
	for r := range p.cmds {
		codes[r], outs[r] = p.wait(t, r, limit)
		failed = failed || codes[r] != 0
	}
	if failed {
		var b strings.Builder
		for r := range p.cmds {
			fmt.Fprintf(&b, "rank %d exited %d:\n%s\n", r, codes[r], outs[r])
		}
		t.Fatal(b.String())
	}
	return outs
}

// sh runs a shell command of the test's setup, failing t if it fails.
func sh(t *testing.T, script string) string {
	t.Helper()
	out, err := exec.Command("sh", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
	return string(out)
}

// rdmaResources is `rdma resource show`: the device's objects in the
// kernel, every process's together.
func rdmaResources(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("rdma"); err != nil {
		return ""
	}
	return sh(t, "rdma resource show")
}
