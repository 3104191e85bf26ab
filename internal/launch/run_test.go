//go:build unix

package launch

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// jobLimit bounds every job in these tests; ranks that are not stopped
// sleep for 60 s, far past it.
const jobLimit = 30 * time.Second

func TestRunAllRanksSucceed(t *testing.T) {
	job, out := helperJob(t, 3, "env")
	code, err := runJob(t, job, jobLimit)
	if code != 0 || err != nil {
		t.Fatalf("Run = %d, %v; stderr:\n%s", code, err, out.text("stderr"))
	}
	stdout := out.text("stdout")
	for rank := range 3 {
		for _, want := range []string{
			fmt.Sprintf("[rank %d] RANK=%d\n", rank, rank),
			fmt.Sprintf("[rank %d] LOCAL_RANK=%d\n", rank, rank),
			fmt.Sprintf("[rank %d] WORLD_SIZE=3\n", rank),
			fmt.Sprintf("[rank %d] GCCL_SECRET=%s\n", rank, job.Secret),
			fmt.Sprintf("[rank %d] GCCL_JOB_ID=%s\n", rank, job.JobID),
			fmt.Sprintf("[rank %d] GCCL_BOOTSTRAP_ADDR=127.0.0.1:%d\n", rank, job.MasterPort),
		} {
			if !strings.Contains(stdout, want) {
				t.Errorf("stdout lacks %q", want)
			}
		}
	}
	if lines := strings.Count(stdout, "\n"); lines != 3*len(rankVariables) {
		t.Errorf("stdout has %d lines, want %d:\n%s", lines, 3*len(rankVariables), stdout)
	}
}

func TestRunKeepsPartialLinesWhole(t *testing.T) {
	// Each rank writes "par", "tial ", "line\nsec", "ond line\nunfin", "ished"
	// to stdout, and the same pieces after "err " to stderr, with pauses,
	// so the two ranks' pieces interleave.
	job, out := helperJob(t, 2, "partial")
	if code, err := runJob(t, job, jobLimit); code != 0 {
		t.Fatalf("Run = %d, %v", code, err)
	}
	want := map[string][]string{
		"stdout": {"partial line", "second line", "unfinished"},
		"stderr": {"err parerr tial err line", "secerr ond line", "unfinerr ished"},
	}
	for stream, lines := range want {
		var all []string
		for rank := range 2 {
			for _, l := range lines {
				all = append(all, fmt.Sprintf("[rank %d] %s", rank, l))
			}
		}
		got := strings.Split(strings.TrimSuffix(out.text(stream), "\n"), "\n")
		slices.Sort(got)
		slices.Sort(all)
		if !slices.Equal(got, all) {
			t.Errorf("%s lines:\n%q\nwant (in any order):\n%q", stream, got, all)
		}
	}
}

func TestRunFailingRankStopsTheOthers(t *testing.T) {
	job, out := helperJob(t, 3, "ready", "1:sleep=300ms", "1:exit=3", "sleep=60s")
	code, err := runJob(t, job, jobLimit)
	if code != 3 {
		t.Errorf("exit code %d, want 3 (the failing rank's)", code)
	}
	var rerr *RankError
	if !errors.As(err, &rerr) || rerr.Rank != 1 || rerr.ExitCode != 3 || rerr.Signal != 0 {
		t.Fatalf("err = %#v, want a RankError for rank 1 with status 3", err)
	}
	if !strings.Contains(err.Error(), "rank 1") || !strings.Contains(err.Error(), "status 3") {
		t.Errorf("error text %q should name the rank and status", err)
	}
	// runJob already failed the test if the sleeping ranks outlived the
	// limit; none of them may linger either.
	waitGone(t, out.pidsAfter("ready"))
}

func TestRunKeepGoing(t *testing.T) {
	// Rank 1 fails first, then rank 2 is killed; rank 0 runs on to the end.
	job, out := helperJob(t, 3, "1:exit=3", "2:sleep=200ms", "2:kill=9", "sleep=600ms", "print=finished")
	job.KeepGoing = true
	code, err := runJob(t, job, jobLimit)
	var rerr *RankError
	if code != 3 || !errors.As(err, &rerr) || rerr.Rank != 1 {
		t.Fatalf("code %d, err %v; want 3 and rank 1's RankError (the first failure)", code, err)
	}
	if got := out.text("stdout"); got != "[rank 0] finished\n" {
		t.Fatalf("stdout %q: rank 0 should have run to its end", got)
	}
}

func TestRunRankKilledBySignal(t *testing.T) {
	job, _ := helperJob(t, 3, fmt.Sprintf("2:kill=%d", syscall.SIGKILL), "sleep=60s")
	code, err := runJob(t, job, jobLimit)
	if code != 128+int(syscall.SIGKILL) {
		t.Errorf("exit code %d, want %d (128+SIGKILL)", code, 128+int(syscall.SIGKILL))
	}
	var rerr *RankError
	if !errors.As(err, &rerr) || rerr.Rank != 2 || rerr.Signal != syscall.SIGKILL {
		t.Fatalf("err = %v, want rank 2 killed by SIGKILL", err)
	}
	if !strings.Contains(err.Error(), "signal 9") {
		t.Errorf("error text %q should name the signal", err)
	}
}

func TestRunTimeout(t *testing.T) {
	job, _ := helperJob(t, 2, "sleep=60s")
	job.Timeout = 200 * time.Millisecond
	code, err := runJob(t, job, jobLimit)
	if code != ExitTimeout || !errors.Is(err, ErrTimeout) {
		t.Errorf("Run = %d, %v; want %d and ErrTimeout", code, err, ExitTimeout)
	}
}

func TestRunContextDeadlineIsATimeout(t *testing.T) {
	job, _ := helperJob(t, 1, "sleep=60s")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	code, err := job.Run(ctx)
	if code != ExitTimeout || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Run = %d, %v; want %d and DeadlineExceeded", code, err, ExitTimeout)
	}
}

func TestRunContextCancel(t *testing.T) {
	job, out := helperJob(t, 2, "ready", "sleep=60s")
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer cancel()
		if err := out.waitCount("ready", 2); err != nil {
			t.Error(err)
		}
	}()
	code, err := job.Run(ctx)
	if code != ExitFailure || !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %d, %v; want %d and Canceled", code, err, ExitFailure)
	}
}

func TestRunForwardsSignals(t *testing.T) {
	job, out := helperJob(t, 3, "ready", "sleep=60s")
	signals := make(chan os.Signal, 1)
	job.Signals = signals
	go func() {
		if err := out.waitCount("ready", 3); err != nil {
			t.Error(err)
			return
		}
		signals <- syscall.SIGINT
	}()
	code, err := runJob(t, job, jobLimit)
	if code != 128+int(syscall.SIGINT) || !errors.Is(err, ErrInterrupted) {
		t.Errorf("Run = %d, %v; want %d and ErrInterrupted", code, err, 128+int(syscall.SIGINT))
	}
	waitGone(t, out.pidsAfter("ready"))
}

func TestRunSecondSignalKillsAtOnce(t *testing.T) {
	job, out := helperJob(t, 2, "ignore-term", "ready", "sleep=60s")
	job.KillGrace = time.Hour // only the second signal can end this job
	signals := make(chan os.Signal, 2)
	job.Signals = signals
	go func() {
		if err := out.waitCount("ready", 2); err != nil {
			t.Error(err)
			return
		}
		signals <- syscall.SIGTERM
		signals <- syscall.SIGTERM
	}()
	code, err := runJob(t, job, jobLimit)
	if code != 128+int(syscall.SIGTERM) || !errors.Is(err, ErrInterrupted) {
		t.Errorf("Run = %d, %v; want %d", code, err, 128+int(syscall.SIGTERM))
	}
}

func TestRunKillsRanksThatIgnoreSIGTERM(t *testing.T) {
	job, out := helperJob(t, 3, "ignore-term", "ready", "sleep=60s")
	job.KillGrace = 300 * time.Millisecond
	killedAt := make(chan time.Time, 1)
	go func() {
		// Fail rank 0 from outside once every rank ignores SIGTERM.
		if err := out.waitCount("ready", 3); err != nil {
			t.Error(err)
			return
		}
		killedAt <- time.Now()
		syscall.Kill(out.pidsAfter("ready")[0], syscall.SIGKILL)
	}()
	code, err := runJob(t, job, jobLimit)
	if code != 128+int(syscall.SIGKILL) {
		t.Errorf("Run = %d, %v; want %d", code, err, 128+int(syscall.SIGKILL))
	}
	// The other ranks shrugged off SIGTERM, so only SIGKILL at the end of
	// the grace period can have stopped them.
	if waited := time.Since(<-killedAt); waited < job.KillGrace {
		t.Errorf("the job ended %v after the failure, before the %v grace period", waited, job.KillGrace)
	}
	waitGone(t, out.pidsAfter("ready"))
}

func TestRunStopsGrandchildren(t *testing.T) {
	job, out := helperJob(t, 2, "spawn", "ready", "1:exit=3", "sleep=60s")
	job.KillGrace = 500 * time.Millisecond
	code, err := runJob(t, job, jobLimit)
	if code != 3 {
		t.Errorf("Run = %d, %v; want 3", code, err)
	}
	// Rank 1 exits by itself after starting its grandchild, which must die
	// with rank 1's process group; rank 0's, if it got to start one, too.
	if !strings.Contains(out.text("stdout"), "[rank 1] grandchild ") {
		t.Fatalf("rank 1 started no grandchild:\n%s", out.text("stdout"))
	}
	waitGone(t, out.pidsAfter("grandchild"))
}

func TestRunProgramNotFound(t *testing.T) {
	job := &Job{NProcs: 2, Argv: []string{"gccl-no-such-program"}, ShmDir: t.TempDir()}
	code, err := job.Run(context.Background())
	if code != ExitNotFound || !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("Run = %d, %v; want %d and exec.ErrNotFound", code, err, ExitNotFound)
	}
	job = &Job{NProcs: 1, Argv: []string{t.TempDir()}, ShmDir: t.TempDir()} // a directory
	if code, err := job.Run(context.Background()); code != ExitNotExecutable {
		t.Errorf("running a directory: Run = %d, %v; want %d", code, err, ExitNotExecutable)
	}
}

func TestRunRemovesTheJobsShmSegments(t *testing.T) {
	for _, script := range [][]string{{"shm=DIR"}, {"shm=DIR", "1:exit=4", "sleep=60s"}} {
		t.Run(strings.Join(script, " "), func(t *testing.T) {
			job, out := helperJob(t, 2)
			dir := job.ShmDir
			for _, a := range script {
				job.Argv = append(job.Argv, strings.Replace(a, "DIR", dir, 1))
			}
			job.Secret = testSecret
			otherJob := ShmPrefix(JobIDFromSecret(strings.Repeat("a", 32))) + "seg"
			keep := []string{otherJob, "gccl-" + JobIDFromSecret(testSecret), "unrelated"}
			for _, name := range keep {
				if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if code, err := runJob(t, job, jobLimit); code != 0 && len(script) == 1 {
				t.Fatalf("Run = %d, %v; stderr:\n%s", code, err, out.text("stderr"))
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			var left []string
			for _, e := range entries {
				left = append(left, e.Name())
			}
			slices.Sort(keep)
			if !slices.Equal(left, keep) {
				t.Errorf("left in the shm dir: %v, want only %v", left, keep)
			}
		})
	}
}

func TestRemoveShmSegments(t *testing.T) {
	dir := t.TempDir()
	id := JobIDFromSecret(testSecret)
	for _, name := range []string{"gccl-" + id + "-a", "gccl-" + id + "-rank0-ring", "gccl-" + id, "gccl-000000000000-a", "x"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "gccl-"+id+"-dir"), 0o700); err != nil {
		t.Fatal(err)
	}
	n, err := RemoveShmSegments(dir, id)
	if n != 2 || err != nil {
		t.Errorf("RemoveShmSegments = %d, %v; want 2, nil", n, err)
	}
	if n, err := RemoveShmSegments(filepath.Join(dir, "missing"), id); n != 0 || err != nil {
		t.Errorf("missing dir: %d, %v; want 0, nil", n, err)
	}
	if _, err := RemoveShmSegments(dir, ""); err == nil {
		t.Error("an empty job ID must be refused: it would match every job's segments")
	}
}

// leakedGoroutines lists goroutines that run launch or os/exec code outside
// any test: what a finished Run must not leave behind.
func leakedGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var leaked []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "testing.tRunner") {
			continue
		}
		if strings.Contains(g, "gccl/internal/launch.") || strings.Contains(g, "os/exec.") {
			leaked = append(leaked, g)
		}
	}
	return leaked
}

func TestRunLeavesNoGoroutines(t *testing.T) {
	// Success, a failing rank, and a timeout with a signal channel.
	scripts := [][]string{{"env"}, {"ready", "1:exit=3", "sleep=60s"}, {"sleep=60s"}}
	for i, script := range scripts {
		job, _ := helperJob(t, 2, script...)
		if i == 2 {
			job.Timeout = 200 * time.Millisecond
			job.Signals = make(chan os.Signal)
		}
		if code, err := runJob(t, job, jobLimit); code == 0 && i > 0 {
			t.Errorf("script %q: Run = 0, %v; want a failure", script, err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		leaked := leakedGoroutines()
		if len(leaked) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left after Run:\n%s", len(leaked), strings.Join(leaked, "\n\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRanksDieWithTheirLauncher kills a launcher with SIGKILL, so it cannot
// clean up, and checks that its ranks die anyway (Pdeathsig).
func TestRanksDieWithTheirLauncher(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Pdeathsig is Linux-only")
	}
	launcher := exec.Command(os.Args[0], helperArg, "launcher")
	stdout, err := launcher.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := launcher.Start(); err != nil {
		t.Fatal(err)
	}
	defer launcher.Wait()
	var pids []int
	sc := bufio.NewScanner(stdout)
	for len(pids) < 2 && sc.Scan() {
		var rank, pid int
		if n, _ := fmt.Sscanf(sc.Text(), "[rank %d] ready %d", &rank, &pid); n == 2 {
			pids = append(pids, pid)
		}
	}
	if len(pids) < 2 {
		launcher.Process.Kill()
		t.Fatalf("launcher printed %d ready ranks, want 2", len(pids))
	}
	if err := launcher.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pids)
}

// TestRunStopsWhatRanksLeaveBehind checks that processes left in the ranks'
// process groups are stopped when every rank exits 0, as after a failure.
func TestRunStopsWhatRanksLeaveBehind(t *testing.T) {
	job, out := helperJob(t, 2, "spawn")
	job.KillGrace = 500 * time.Millisecond
	t.Cleanup(func() { killAll(out.pidsAfter("grandchild")) })
	if code, err := runJob(t, job, jobLimit); code != 0 || err != nil {
		t.Fatalf("Run = %d, %v; want 0", code, err)
	}
	pids := out.pidsAfter("grandchild")
	if len(pids) != 2 {
		t.Fatalf("got grandchildren %v, want 2:\n%s", pids, out.text("stdout"))
	}
	// Run returned once the groups were empty: nothing is left to wait for.
	for _, pid := range pids {
		if !processGone(pid) {
			t.Errorf("grandchild %d outlived the job", pid)
		}
	}
}

// TestRunReadsOutputOfLeftoversWhileTheJobRuns has rank 0 exit at once,
// leaving a process that prints after longer than the old 2 s drain limit,
// while rank 1 keeps the job running.
func TestRunReadsOutputOfLeftoversWhileTheJobRuns(t *testing.T) {
	job, out := helperJob(t, 2, "0:spawn-print=2200ms", "1:sleep=2700ms")
	job.KillGrace = 300 * time.Millisecond
	t.Cleanup(func() { killAll(out.pidsAfter("grandchild")) })
	if code, err := runJob(t, job, jobLimit); code != 0 || err != nil {
		t.Fatalf("Run = %d, %v; want 0", code, err)
	}
	if !strings.Contains(out.text("stdout"), "[rank 0] late\n") {
		t.Errorf("the output of rank 0's leftover process was dropped; stdout:\n%s", out.text("stdout"))
	}
}

func TestRunNoKillGrace(t *testing.T) {
	job, out := helperJob(t, 3, "ignore-term", "ready", "1:exit=3", "sleep=60s")
	job.KillGrace = NoKillGrace
	start := time.Now()
	code, _ := runJob(t, job, jobLimit)
	if code != 3 {
		t.Errorf("Run = %d, want 3", code)
	}
	// The ranks ignore SIGTERM: only an immediate SIGKILL ends the job this
	// soon, DefaultKillGrace being 3 s.
	if took := time.Since(start); took > DefaultKillGrace-time.Second {
		t.Errorf("the job took %v to stop", took)
	}
	waitGone(t, out.pidsAfter("ready"))
}

// brokenPipe is a destination whose reader is gone: it keeps what it was
// given (for the test to read) but fails every write like a closed pipe.
type brokenPipe struct{ out outputStream }

func (b brokenPipe) Write(p []byte) (int, error) {
	b.out.Write(p)
	return 0, &os.PathError{Op: "write", Path: "/dev/stdout", Err: syscall.EPIPE}
}

func TestRunBrokenPipeStopsTheJob(t *testing.T) {
	job, out := helperJob(t, 2, "spawn", "shm=DIR", "sleep=60s")
	job.Argv[3] = "shm=" + job.ShmDir
	job.Stdout = brokenPipe{out.stream("stdout")}
	job.KillGrace = 300 * time.Millisecond
	t.Cleanup(func() { killAll(out.pidsAfter("grandchild")) })
	code, err := runJob(t, job, 10*time.Second)
	if code != 128+int(syscall.SIGPIPE) || !errors.Is(err, ErrBrokenPipe) {
		t.Errorf("Run = %d, %v; want %d and ErrBrokenPipe", code, err, 128+int(syscall.SIGPIPE))
	}
	pids := out.pidsAfter("grandchild")
	if len(pids) == 0 {
		t.Fatalf("no rank started a grandchild:\n%s", out.text("stdout"))
	}
	waitGone(t, pids)
	if entries, _ := os.ReadDir(job.ShmDir); len(entries) != 0 {
		t.Errorf("shared-memory segments left: %v", entries)
	}
}

func TestRunExecFormatErrorIs126(t *testing.T) {
	prog := filepath.Join(t.TempDir(), "garbage")
	if err := os.WriteFile(prog, []byte("\x00\x01 not a program\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	job := &Job{NProcs: 2, Argv: []string{prog}, ShmDir: t.TempDir()}
	if code, err := job.Run(context.Background()); code != ExitNotExecutable || !errors.Is(err, syscall.ENOEXEC) {
		t.Errorf("Run = %d, %v; want %d and ENOEXEC", code, err, ExitNotExecutable)
	}
}

func TestRunRefusesHugeJobsBeforeAllocating(t *testing.T) {
	job := &Job{NProcs: 2147483647, Argv: []string{"true"}, ShmDir: t.TempDir()}
	if code, err := job.Run(context.Background()); code != ExitFailure || err == nil || !strings.Contains(err.Error(), "65536") {
		t.Errorf("Run = %d, %v; want %d and an error naming the limit", code, err, ExitFailure)
	}
}

// killAll kills pids that a failing test may have left running.
func killAll(pids []int) {
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}
