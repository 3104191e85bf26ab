//go:build unix

package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gccl/gccl/internal/launch"
	"github.com/gccl/gccl/internal/testutil"
)

const (
	// childArg makes the test binary act as a rank.
	childArg = "-gccl-run-test-child"
	// asMainEnv makes the test binary act as gccl-run itself.
	asMainEnv = "GCCL_RUN_TEST_AS_MAIN"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == childArg {
		os.Exit(child(os.Args[2:]))
	}
	if os.Getenv(asMainEnv) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// child runs a rank's script: "env" prints the job variables, "ready"
// prints "ready <pid>", "print=TEXT" prints TEXT, "sleep=D" sleeps, "exit=N" exits, "ignore-term"
// ignores SIGTERM, "spam" prints lines until it fails, "spawn" starts a
// sleeping grandchild and prints "grandchild <pid>" on stderr, "shm=DIR"
// creates DIR/gccl-$GCCL_JOB_ID-rank$RANK; "R:action" runs only on global
// rank R.
func child(actions []string) int {
	for _, action := range actions {
		if r, a, ok := strings.Cut(action, ":"); ok {
			if r != os.Getenv("RANK") {
				continue
			}
			action = a
		}
		name, arg, _ := strings.Cut(action, "=")
		switch name {
		case "env":
			for _, v := range []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
				"MASTER_ADDR", "MASTER_PORT", "GCCL_BOOTSTRAP_ADDR", "GCCL_SECRET", "GCCL_JOB_ID"} {
				fmt.Printf("%s=%s\n", v, os.Getenv(v))
			}
		case "ready":
			fmt.Printf("ready %d\n", os.Getpid())
		case "print":
			fmt.Println(arg)
		case "sleep":
			d, _ := time.ParseDuration(arg)
			time.Sleep(d)
		case "exit":
			n, _ := strconv.Atoi(arg)
			return n
		case "ignore-term":
			signal.Ignore(syscall.SIGTERM)
		case "spam":
			for {
				if _, err := fmt.Println("line"); err != nil {
					return 1
				}
			}
		case "spawn":
			cmd := exec.Command(os.Args[0], childArg, "sleep=60s")
			if err := cmd.Start(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 99
			}
			fmt.Fprintf(os.Stderr, "grandchild %d\n", cmd.Process.Pid)
		case "shm":
			path := filepath.Join(arg, launch.ShmPrefix(os.Getenv("GCCL_JOB_ID"))+"rank"+os.Getenv("RANK"))
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 99
			}
		default:
			fmt.Fprintf(os.Stderr, "unknown child action %q\n", action)
			return 99
		}
	}
	return 0
}

// hermeticEnv is this process's environment without anything a launcher
// could pick up (Slurm, MPI, torchrun or gccl variables), plus extra.
func hermeticEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "SLURM_") || strings.HasPrefix(name, "OMPI_") || strings.HasPrefix(name, "PMI_") ||
			strings.HasPrefix(name, "MASTER_") || strings.HasPrefix(name, "GCCL_") || name == asMainEnv {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// gcclRun runs gccl-run in this process with args, where "CHILD" stands
// for the test binary acting as a rank.
func gcclRun(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var full []string
	for _, a := range args {
		if a == "CHILD" {
			full = append(full, os.Args[0], childArg)
		} else {
			full = append(full, a)
		}
	}
	var out, errOut testutil.SyncBuffer
	done := make(chan int, 1)
	go func() { done <- run(full, env, &out, &errOut, nil) }()
	select {
	case code = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("gccl-run %q did not finish in 30 s; stdout:\n%s", args, out.String())
	}
	return code, out.String(), errOut.String()
}

// rankValues maps "[rank R] NAME=VALUE" lines to values by rank and name.
func rankValues(stdout string) map[int]map[string]string {
	m := map[int]map[string]string{}
	for _, line := range strings.Split(stdout, "\n") {
		var rank int
		var kv string
		if n, _ := fmt.Sscanf(line, "[rank %d] %s", &rank, &kv); n == 2 {
			if name, value, ok := strings.Cut(kv, "="); ok {
				if m[rank] == nil {
					m[rank] = map[string]string{}
				}
				m[rank][name] = value
			}
		}
	}
	return m
}

func TestHelp(t *testing.T) {
	code, stdout, _ := gcclRun(t, hermeticEnv(), "-h")
	if code != 0 {
		t.Errorf("-h exited %d", code)
	}
	for _, want := range []string{"Usage: gccl-run -np N", "GCCL_SECRET", "srun", "mpirun", "--tag-output", "124"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("help lacks %q", want)
		}
	}
}

func TestCommandLineErrorsExit2(t *testing.T) {
	code, _, stderr := gcclRun(t, hermeticEnv(), "CHILD")
	if code != exitUsage || !strings.Contains(stderr, "-np (ranks per node) is required") || !strings.Contains(stderr, "gccl-run -h") {
		t.Errorf("no -np: exit %d, stderr %q", code, stderr)
	}
}

func TestMultiNodeNeedsASharedSecret(t *testing.T) {
	slurm := hermeticEnv("SLURM_JOB_ID=77", "SLURM_NNODES=2", "SLURM_NODEID=0", "SLURM_JOB_NODELIST=n[1-2]")
	for name, run := range map[string]struct {
		env  []string
		args []string
	}{
		"flags": {hermeticEnv(), []string{"-np", "2", "--nnodes", "2", "--node-rank", "0", "--master-addr", "h", "CHILD"}},
		"slurm": {slurm, []string{"-np", "2", "CHILD"}},
	} {
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := gcclRun(t, run.env, run.args...)
			if code != exitUsage {
				t.Errorf("exit %d, want %d", code, exitUsage)
			}
			for _, want := range []string{"GCCL_SECRET", "--secret-file", "same 32 hex characters on every node"} {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr %q does not mention %q", stderr, want)
				}
			}
			if stdout != "" {
				t.Errorf("no rank may start; stdout %q", stdout)
			}
		})
	}
}

func TestSingleNodeJob(t *testing.T) {
	code, stdout, stderr := gcclRun(t, hermeticEnv(), "-np", "3", "CHILD", "env")
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	ranks := rankValues(stdout)
	if len(ranks) != 3 {
		t.Fatalf("got variables of %d ranks, want 3:\n%s", len(ranks), stdout)
	}
	secret := ranks[0]["GCCL_SECRET"]
	if _, err := launch.NormalizeSecret(secret); err != nil || len(secret) != 32 {
		t.Errorf("generated secret %q: %v", secret, err)
	}
	for r := range 3 {
		v := ranks[r]
		want := map[string]string{
			"RANK": strconv.Itoa(r), "LOCAL_RANK": strconv.Itoa(r), "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3",
			"NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "GCCL_SECRET": secret, "GCCL_JOB_ID": launch.JobIDFromSecret(secret),
			"GCCL_BOOTSTRAP_ADDR": "127.0.0.1:" + ranks[0]["MASTER_PORT"],
		}
		for name, value := range want {
			if v[name] != value {
				t.Errorf("rank %d: %s=%q, want %q", r, name, v[name], value)
			}
		}
	}
	if port, err := strconv.Atoi(ranks[0]["MASTER_PORT"]); err != nil || port <= 0 {
		t.Errorf("MASTER_PORT=%q is not a port", ranks[0]["MASTER_PORT"])
	}
}

func TestSecondOfTwoNodesWithSecretFile(t *testing.T) {
	secret, err := launch.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := gcclRun(t, hermeticEnv(), "-np", "2", "--nnodes", "2", "--node-rank", "1",
		"--master-addr", "node0", "--master-port", "7000", "--secret-file", file, "CHILD", "env")
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	ranks := rankValues(stdout)
	for _, r := range []int{2, 3} {
		v := ranks[r]
		if v["RANK"] != strconv.Itoa(r) || v["LOCAL_RANK"] != strconv.Itoa(r-2) || v["WORLD_SIZE"] != "4" ||
			v["NODE_RANK"] != "1" || v["GCCL_BOOTSTRAP_ADDR"] != "node0:7000" || v["GCCL_SECRET"] != secret {
			t.Errorf("rank %d variables: %v", r, v)
		}
	}
	if len(ranks) != 2 {
		t.Errorf("got ranks %v, want 2 and 3", ranks)
	}
}

func TestUnderSlurm(t *testing.T) {
	secret, _ := launch.NewSecret()
	env := hermeticEnv("SLURM_JOB_ID=4242", "SLURM_NNODES=3", "SLURM_NODEID=2", "SLURM_JOB_NODELIST=gpu[07-09]",
		"SLURM_STEP_NUM_NODES=3", "SLURM_STEP_NUM_TASKS=3", "GCCL_SECRET="+secret)
	code, stdout, stderr := gcclRun(t, env, "-np", "2", "CHILD", "env")
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	ranks := rankValues(stdout)
	for _, r := range []int{4, 5} {
		v := ranks[r]
		if v["WORLD_SIZE"] != "6" || v["NODE_RANK"] != "2" || v["MASTER_ADDR"] != "gpu07" ||
			v["MASTER_PORT"] != "24242" || v["GCCL_JOB_ID"] != launch.JobIDFromSecret(secret) {
			t.Errorf("rank %d variables: %v", r, v)
		}
	}
}

func TestUnderOpenMPI(t *testing.T) {
	secret, _ := launch.NewSecret()
	env := hermeticEnv("OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_LOCAL_SIZE=1",
		"MASTER_ADDR=head", "GCCL_SECRET="+secret)
	code, stdout, stderr := gcclRun(t, env, "-np", "2", "--master-port", "6000", "CHILD", "env")
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	ranks := rankValues(stdout)
	if v := ranks[3]; v["WORLD_SIZE"] != "4" || v["GCCL_BOOTSTRAP_ADDR"] != "head:6000" {
		t.Errorf("rank 3 variables: %v", v)
	}
	// Without a master address the job cannot start.
	code, _, stderr = gcclRun(t, hermeticEnv("OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=1", "GCCL_SECRET="+secret),
		"-np", "2", "CHILD", "env")
	if code != exitUsage || !strings.Contains(stderr, "MASTER_ADDR") {
		t.Errorf("no master: exit %d, stderr %q", code, stderr)
	}
}

func TestTagOutputFalse(t *testing.T) {
	code, stdout, _ := gcclRun(t, hermeticEnv(), "-np", "2", "--tag-output=false", "CHILD", "env")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	if strings.Contains(stdout, "[rank") || strings.Count("\n"+stdout, "\nRANK=") != 2 {
		t.Errorf("untagged output expected:\n%s", stdout)
	}
}

func TestFailingRankDecidesTheExitCode(t *testing.T) {
	code, _, stderr := gcclRun(t, hermeticEnv(), "-np", "3", "CHILD", "ready", "1:exit=3", "sleep=60s")
	if code != 3 {
		t.Errorf("exit %d, want 3", code)
	}
	if !strings.Contains(stderr, "gccl-run: rank 1 (pid ") || !strings.Contains(stderr, "exited with status 3; stopped the other ranks") {
		t.Errorf("stderr %q should say which rank failed", stderr)
	}
}

func TestKeepGoingLetsTheOthersFinish(t *testing.T) {
	code, stdout, stderr := gcclRun(t, hermeticEnv(), "-np", "3", "--keep-going", "CHILD", "1:exit=3", "sleep=300ms", "print=finished")
	if code != 3 {
		t.Errorf("exit %d, want 3 (rank 1's)", code)
	}
	if !strings.Contains(stderr, "exited with status 3; the other ranks went on (--keep-going)") {
		t.Errorf("stderr %q should say rank 1 failed and the others went on", stderr)
	}
	if !strings.Contains(stdout, "[rank 0] finished") || !strings.Contains(stdout, "[rank 2] finished") {
		t.Errorf("stdout %q: ranks 0 and 2 should have run to their end", stdout)
	}
}

func TestTimeoutExits124(t *testing.T) {
	code, _, stderr := gcclRun(t, hermeticEnv(), "-np", "2", "--timeout", "300ms", "CHILD", "sleep=60s")
	if code != 124 || !strings.Contains(stderr, "gccl-run: job timed out after 300ms") {
		t.Errorf("exit %d, stderr %q; want 124 and a timeout message", code, stderr)
	}
}

func TestProgramNotFoundExits127(t *testing.T) {
	code, _, stderr := gcclRun(t, hermeticEnv(), "-np", "2", "gccl-run-no-such-program")
	if code != 127 || !strings.Contains(stderr, "gccl-run-no-such-program") {
		t.Errorf("exit %d, stderr %q; want 127", code, stderr)
	}
}

// TestVerboseReportsShmCleanup plants a segment of the job in /dev/shm and
// checks that gccl-run removes it and reports that only with -v.
func TestVerboseReportsShmCleanup(t *testing.T) {
	if _, err := os.Stat(launch.DefaultShmDir); err != nil {
		t.Skipf("no %s: %v", launch.DefaultShmDir, err)
	}
	secret, _ := launch.NewSecret()
	segment := filepath.Join(launch.DefaultShmDir, launch.ShmPrefix(launch.JobIDFromSecret(secret))+"test")
	for _, verbose := range []bool{false, true} {
		if err := os.WriteFile(segment, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(segment) })
		args := []string{"-np", "1", "CHILD"}
		if verbose {
			args = append([]string{"-v"}, args...)
		}
		code, _, stderr := gcclRun(t, hermeticEnv("GCCL_SECRET="+secret), args...)
		if code != 0 {
			t.Fatalf("exit %d; stderr:\n%s", code, stderr)
		}
		if _, err := os.Stat(segment); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("segment %s was not removed (%v)", segment, err)
		}
		reported := strings.Contains(stderr, `gccl-run: level=DEBUG msg="removed leftover shared-memory segments" count=1`)
		if reported != verbose {
			t.Errorf("verbose=%v: cleanup reported=%v; stderr:\n%s", verbose, reported, stderr)
		}
		if strings.Contains(stderr, secret) {
			t.Error("the log must never show the secret")
		}
	}
}

// TestSignalsReachTheRanks runs gccl-run as a process of its own, sends it
// SIGTERM as a scheduler would, and checks that the ranks die and gccl-run
// exits 128+SIGTERM.
func TestSignalsReachTheRanks(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-np", "2", os.Args[0], childArg, "ready", "sleep=60s")
	cmd.Env = hermeticEnv(asMainEnv + "=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testutil.SyncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ranksReady := make(chan []int, 1)
	go func() {
		var pids []int
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var rank, pid int
			if n, _ := fmt.Sscanf(sc.Text(), "[rank %d] ready %d", &rank, &pid); n == 2 {
				if pids = append(pids, pid); len(pids) == 2 {
					ranksReady <- pids
				}
			}
		}
	}()
	var pids []int
	select {
	case pids = <-ranksReady:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("ranks did not start; stderr:\n%s", stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err = <-waited:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("gccl-run did not exit after SIGTERM; stderr:\n%s", stderr.String())
	}
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 128+int(syscall.SIGTERM) {
		t.Errorf("gccl-run ended with %v, want exit status %d", err, 128+int(syscall.SIGTERM))
	}
	if !strings.Contains(stderr.String(), "interrupted by signal 15") {
		t.Errorf("stderr %q should say the job was interrupted", stderr.String())
	}
	for _, pid := range pids {
		// gccl-run reaped its ranks before exiting, so they are gone
		// entirely, not zombies.
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("rank pid %d still exists (kill 0: %v)", pid, err)
		}
	}
}

// TestKillGraceZero checks that --kill-grace 0 kills ranks that ignore
// SIGTERM at once instead of after the 3 s default.
func TestKillGraceZero(t *testing.T) {
	start := time.Now()
	code, _, stderr := gcclRun(t, hermeticEnv(), "-np", "3", "--kill-grace", "0", "CHILD", "ignore-term", "1:exit=3", "sleep=60s")
	if code != 3 {
		t.Errorf("exit %d, want 3; stderr:\n%s", code, stderr)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the job took %v to stop", took)
	}
}

func TestBracketedIPv6MasterAddress(t *testing.T) {
	code, stdout, stderr := gcclRun(t, hermeticEnv(), "-np", "1", "--master-addr", "[::1]", "--master-port", "7000", "CHILD", "env")
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	if v := rankValues(stdout)[0]; v["GCCL_BOOTSTRAP_ADDR"] != "[::1]:7000" || v["MASTER_ADDR"] != "::1" {
		t.Errorf("GCCL_BOOTSTRAP_ADDR=%q MASTER_ADDR=%q, want [::1]:7000 and ::1", v["GCCL_BOOTSTRAP_ADDR"], v["MASTER_ADDR"])
	}
}

// TestClosedStdoutExits141 runs gccl-run as a process of its own with its
// stdout a pipe that the test closes after one line, as "| head -1" does:
// gccl-run must not die of SIGPIPE but stop the ranks and what they
// started, remove the job's segments and exit 141.
func TestClosedStdoutExits141(t *testing.T) {
	if _, err := os.Stat(launch.DefaultShmDir); err != nil {
		t.Skipf("no %s: %v", launch.DefaultShmDir, err)
	}
	secret, _ := launch.NewSecret()
	jobID := launch.JobIDFromSecret(secret)
	t.Cleanup(func() { launch.RemoveShmSegments(launch.DefaultShmDir, jobID) })
	cmd := exec.Command(os.Args[0], "-np", "2", "--kill-grace", "1s",
		os.Args[0], childArg, "spawn", "shm="+launch.DefaultShmDir, "spam")
	cmd.Env = hermeticEnv(asMainEnv+"=1", "GCCL_SECRET="+secret)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testutil.SyncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var grandchildren []int
	t.Cleanup(func() {
		for _, pid := range grandchildren {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("reading the first line: %v; stderr:\n%s", err, stderr.String())
	}
	if line != "[rank 0] line\n" && line != "[rank 1] line\n" {
		t.Errorf("first line %q", line)
	}
	// Both ranks must have started their grandchild before the pipe
	// closes (under load one rank can start much later than the other).
	// Meanwhile their output is read and dropped: a full stdout would hold
	// up the stderr lines that say so.
	go io.Copy(io.Discard, stdout)
	for deadline := time.Now().Add(20 * time.Second); strings.Count(stderr.String(), "grandchild ") < 2; {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the ranks did not both start a grandchild; stderr:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	stdout.Close()
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err = <-waited:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("gccl-run did not exit after its stdout was closed; stderr:\n%s", stderr.String())
	}
	for _, l := range strings.Split(stderr.String(), "\n") {
		var rank, pid int
		if n, _ := fmt.Sscanf(l, "[rank %d] grandchild %d", &rank, &pid); n == 2 {
			grandchildren = append(grandchildren, pid)
		}
	}
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 141 {
		t.Errorf("gccl-run ended with %v, want exit status 141; stderr:\n%s", err, stderr.String())
	}
	if len(grandchildren) != 2 {
		t.Fatalf("got grandchildren %v, want 2; stderr:\n%s", grandchildren, stderr.String())
	}
	for _, pid := range grandchildren {
		if !processGone(pid) {
			t.Errorf("grandchild %d outlived gccl-run", pid)
		}
	}
	if n, _ := launch.RemoveShmSegments(launch.DefaultShmDir, jobID); n != 0 {
		t.Errorf("gccl-run left %d of the job's segments in %s", n, launch.DefaultShmDir)
	}
}

// processGone reports whether pid has exited; a zombie counts as gone, as
// its new parent may be slow to reap it.
func processGone(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(stat), ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X'
}
