package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gccl/gccl/bootstrap"
	"github.com/gccl/gccl/internal/testutil"
)

// start runs the command in the background and returns its address and
// a channel with its exit code.
func start(t *testing.T, ctx context.Context, args []string, env map[string]string) (string, <-chan int, *testutil.SyncBuffer) {
	t.Helper()
	var stderr testutil.SyncBuffer
	addr := make(chan string, 1)
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, args, func(k string) string { return env[k] }, &stderr, func(a string) { addr <- a })
	}()
	select {
	case a := <-addr:
		return a, code, &stderr
	case c := <-code:
		t.Fatalf("exited with %d before serving:\n%s", c, stderr.String())
	case <-time.After(5 * time.Second):
		t.Fatal("not serving after 5s")
	}
	return "", nil, nil
}

func joinRanks(t *testing.T, addr, secret string, size int) []*bootstrap.Client {
	t.Helper()
	clients := make([]*bootstrap.Client, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		cfg := bootstrap.Config{Rank: r, Size: size, Addr: addr, Secret: secret, Timeout: 10 * time.Second, HeartbeatTimeout: time.Second}
		wg.Go(func() {
			if clients[r], errs[r] = bootstrap.Join(context.Background(), cfg); errs[r] == nil {
				errs[r] = clients[r].Barrier(context.Background())
			}
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return clients
}

func exitCode(t *testing.T, code <-chan int) int {
	t.Helper()
	select {
	case c := <-code:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("gccl-bootstrap did not exit")
	}
	return -1
}

func TestServesAJobAndExitsWhenEveryRankLeft(t *testing.T) {
	secret := bootstrap.NewSecret()
	addr, code, stderr := start(t, context.Background(), []string{"--addr", "127.0.0.1:0", "--size", "3"}, map[string]string{"GCCL_SECRET": secret})
	clients := joinRanks(t, addr, secret, 3)
	for _, c := range clients {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if c := exitCode(t, code); c != 0 {
		t.Fatalf("exit code %d after a clean job, want 0:\n%s", c, stderr)
	}
	log := stderr.String()
	for _, want := range []string{"serving a job of 3 ranks", "rank 2 joined", "all 3 ranks joined", "rank 1 left", "every rank left"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
}

func TestAbortedJobExitsWithFailure(t *testing.T) {
	secretFile := filepath.Join(t.TempDir(), "secret")
	secret := bootstrap.NewSecret()
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, code, stderr := start(t, context.Background(),
		[]string{"--addr", "127.0.0.1:0", "--size", "2", "--secret-file", secretFile, "--heartbeat-timeout", "300ms"},
		map[string]string{"GCCL_SECRET": bootstrap.NewSecret()}) // the file wins
	clients := joinRanks(t, addr, secret, 2)
	if err := clients[0].Abort(context.Background(), "test failure"); err != nil {
		t.Fatal(err)
	}
	for _, c := range clients {
		c.Close()
	}
	if c := exitCode(t, code); c != 1 {
		t.Fatalf("exit code %d after an aborted job, want 1:\n%s", c, stderr)
	}
	if !strings.Contains(stderr.String(), "rank 0 aborted the job: test failure") {
		t.Errorf("log lacks the abort:\n%s", stderr)
	}
}

func TestStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	_, code, stderr := start(t, ctx, []string{"--addr", "127.0.0.1:0", "--size", "4"}, map[string]string{"GCCL_SECRET": bootstrap.NewSecret()})
	cancel()
	if c := exitCode(t, code); c != 0 {
		t.Fatalf("exit code %d when stopped, want 0:\n%s", c, stderr)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{args: []string{"--addr", "127.0.0.1:0"}, env: map[string]string{"GCCL_SECRET": bootstrap.NewSecret()}, want: "--size N is required"},
		{args: []string{"--size", "2", "--addr", "127.0.0.1:0"}, want: "no job secret"},
		{args: []string{"--size", "2", "--addr", "127.0.0.1:0"}, env: map[string]string{"GCCL_SECRET": "short"}, want: "32 hex"},
		{args: []string{"--size", "2", "--secret-file", "/nonexistent/secret"}, want: "reading the secret"},
		{args: []string{"--size", "2", "extra"}, want: "unexpected arguments"},
		{args: []string{"--bogus"}, want: "flag provided but not defined"},
		{args: []string{"--size", "2000000000", "--addr", "127.0.0.1:0"}, env: map[string]string{"GCCL_SECRET": bootstrap.NewSecret()},
			want: "--size 2000000000 is more than the 1048576 ranks"},
	} {
		var stderr testutil.SyncBuffer
		c := run(context.Background(), tc.args, func(k string) string { return tc.env[k] }, &stderr, nil)
		if c != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, c, stderr.String(), tc.want)
		}
	}
}

// TestSIGTERM runs the real main in a child process (this test binary) and
// stops it with SIGTERM.
func TestSIGTERM(t *testing.T) {
	if os.Getenv("GCCL_BOOTSTRAP_TEST_MAIN") == "1" {
		os.Args = []string{"gccl-bootstrap", "--addr", "127.0.0.1:0", "--size", "2"}
		main()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSIGTERM$")
	cmd.Env = append(os.Environ(), "GCCL_BOOTSTRAP_TEST_MAIN=1", "GCCL_SECRET="+bootstrap.NewSecret(), "GCCL_DEBUG=INFO")
	var stderr testutil.SyncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(stderr.String(), "serving a job of 2 ranks") {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("child not serving:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("child exited with %v after SIGTERM:\n%s", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatal("child did not exit within 10s of SIGTERM")
	}
	if !strings.Contains(stderr.String(), "stopping on signal") {
		t.Errorf("child did not log the signal:\n%s", stderr.String())
	}
}
