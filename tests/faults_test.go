package tests

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gccl/gccl/internal/launch"
	"github.com/gccl/gccl/internal/testutil"
)

// rankProcs are the ranks of one job, started directly (not by gccl-run,
// whose policy of killing the others on a failure would hide whether the
// survivors notice the failure themselves).
type rankProcs struct {
	job   *launch.Job
	cmds  []*exec.Cmd
	outs  []*bytes.Buffer
	mu    sync.Mutex
	codes []int
	ended []time.Time
	done  []chan struct{}
}

// startRanks starts the listed ranks of an np-rank job; argvOf gives each
// rank's command line, extraEnv each rank's additional variables.
func startRanks(t *testing.T, np int, ranks []int, argvOf func(r int) []string, extraEnv func(r int) []string) *rankProcs {
	t.Helper()
	job := &launch.Job{NProcs: np, Argv: []string{"unused"}, Env: append(testutil.EnvWithoutJob(), "GCCL_IB_DISABLE=1")}
	if err := job.Resolve(); err != nil {
		t.Fatal(err)
	}
	p := &rankProcs{job: job, cmds: make([]*exec.Cmd, np), outs: make([]*bytes.Buffer, np),
		codes: make([]int, np), ended: make([]time.Time, np), done: make([]chan struct{}, np)}
	for _, r := range ranks {
		argv := argvOf(r)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(job.RankEnv(r), extraEnv(r)...)
		p.outs[r] = &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = p.outs[r], p.outs[r]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		p.cmds[r], p.done[r] = cmd, make(chan struct{})
		go func() {
			err := cmd.Wait()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
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
			if c != nil {
				c.Process.Signal(syscall.SIGCONT)
				c.Process.Kill()
				<-p.done[r]
			}
		}
		if left := shmLeftovers(t, job.JobID); len(left) > 0 {
			t.Errorf("shared-memory segments left behind: %v", left)
		}
	})
	return p
}

// waitExit waits for rank r to end and returns its exit code and output.
func (p *rankProcs) waitExit(t *testing.T, r int, limit time.Duration) (int, string) {
	t.Helper()
	select {
	case <-p.done[r]:
	case <-time.After(limit):
		t.Fatalf("rank %d still running after %v (hung):\n%s", r, limit, p.output(r))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.codes[r], p.outs[r].String()
}

func (p *rankProcs) output(r int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.outs[r].String()
}

func collcheckArgv(args ...string) func(int) []string {
	return func(int) []string { return append([]string{bins.collcheck}, args...) }
}

func noEnv(int) []string { return nil }

// A survivor's error must say a peer was lost, typed as gccl reports it.
func assertLost(t *testing.T, r, code int, out string) {
	t.Helper()
	if code == 0 {
		t.Fatalf("rank %d succeeded although a peer died:\n%s", r, out)
	}
	t.Logf("rank %d: %s", r, strings.TrimSpace(out))
	if !strings.Contains(out, "peer lost") && !strings.Contains(out, "lost") {
		t.Fatalf("rank %d's error does not report the lost peer:\n%s", r, out)
	}
}

func TestKilledRankFailsSurvivors(t *testing.T) {
	for _, tc := range []struct{ name, env, flag string }{
		{"shm", "", ""},
		{"tcp", "GCCL_SHM_DISABLE=1", ""},
		// Survivors read the dead rank's mapped memory: no EOF there.
		{"shm-symmetric", "", "-sym"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := func(int) []string { return []string{tc.env, "GCCL_SOCKET_IFNAME=lo"} }
			// Every rank loops on large all-reduces; rank 1 is killed -9
			// in the middle of one.
			args := []string{"-iters", "100000", "-large", "2000003", "-timeout", "5m"}
			if tc.flag != "" {
				args = append(args, tc.flag)
			}
			p := startRanks(t, 3, []int{0, 1, 2}, collcheckArgv(args...), env)
			time.Sleep(1500 * time.Millisecond)
			start := time.Now()
			p.cmds[1].Process.Signal(syscall.SIGKILL)
			for _, r := range []int{0, 2} {
				code, out := p.waitExit(t, r, 30*time.Second)
				assertLost(t, r, code, out)
			}
			t.Logf("survivors failed within %v of the kill", time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestSurvivorsShrinkAndGoOn: a rank dies in the middle of the check; the
// survivors' operation fails, they Shrink the communicator without it and
// pass the whole check on the new one.
func TestSurvivorsShrinkAndGoOn(t *testing.T) {
	for _, tc := range []struct{ name, env string }{
		{"shm", ""},
		{"tcp", "GCCL_SHM_DISABLE=1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := func(int) []string { return []string{tc.env, "GCCL_SOCKET_IFNAME=lo"} }
			p := startRanks(t, 4, []int{0, 1, 2, 3},
				collcheckArgv("-iters", "1000", "-large", "200003", "-die-at", "40", "-victim", "2", "-shrink", "-timeout", "2m"), env)
			if code, out := p.waitExit(t, 2, 60*time.Second); code == 0 {
				t.Fatalf("the victim exited 0:\n%s", out)
			}
			for i, r := range []int{0, 1, 3} {
				code, out := p.waitExit(t, r, 60*time.Second)
				if code != 0 {
					t.Fatalf("survivor rank %d failed (exit %d):\n%s", r, code, out)
				}
				mustContain(t, out, "peer lost", fmt.Sprintf("collcheck: rank %d shrank to rank %d of 3 ok", r, i))
				t.Logf("rank %d: %s", r, strings.TrimSpace(out))
			}
		})
	}
}

func TestStalledRankFailsSurvivors(t *testing.T) {
	p := startRanks(t, 3, []int{0, 1, 2}, collcheckArgv("-iters", "100000", "-large", "2000003", "-timeout", "5m"), noEnv)
	time.Sleep(1500 * time.Millisecond)
	start := time.Now()
	// A stopped process keeps its sockets and memory but sends nothing:
	// only heartbeats can tell.
	p.cmds[1].Process.Signal(syscall.SIGSTOP)
	for _, r := range []int{0, 2} {
		code, out := p.waitExit(t, r, 30*time.Second)
		assertLost(t, r, code, out)
	}
	t.Logf("survivors failed within %v of the stall", time.Since(start).Round(time.Millisecond))
}

func TestRendezvousStoppedBeforeAllJoined(t *testing.T) {
	// Rank 2 never starts; rank 0, which serves the rendezvous, is killed.
	env := func(int) []string { return []string{"GCCL_BOOTSTRAP_TIMEOUT=60s"} }
	p := startRanks(t, 3, []int{0, 1}, collcheckArgv(), env)
	time.Sleep(time.Second)
	p.cmds[0].Process.Signal(syscall.SIGKILL)
	code, out := p.waitExit(t, 1, 30*time.Second)
	if code == 0 {
		t.Fatalf("rank 1 initialised without a rendezvous:\n%s", out)
	}
	mustContain(t, out, "collcheck: init:")
}

func TestWrongSecretRefused(t *testing.T) {
	env := func(r int) []string {
		e := []string{"GCCL_BOOTSTRAP_TIMEOUT=5s"}
		if r == 1 {
			e = append(e, "GCCL_SECRET=00000000000000000000000000000000")
		}
		return e
	}
	p := startRanks(t, 2, []int{0, 1}, collcheckArgv(), env)
	code, out := p.waitExit(t, 1, 30*time.Second)
	if code == 0 {
		t.Fatalf("a rank with the wrong secret joined:\n%s", out)
	}
	mustContain(t, out, "secret")
	code, out = p.waitExit(t, 0, 30*time.Second)
	if code == 0 {
		t.Fatalf("rank 0 initialised without rank 1:\n%s", out)
	}
}

func TestVersionMismatchRefused(t *testing.T) {
	argv := func(r int) []string {
		if r == 1 {
			return []string{bins.collcheckOld}
		}
		return []string{bins.collcheck}
	}
	env := func(int) []string { return []string{"GCCL_BOOTSTRAP_TIMEOUT=5s"} }
	p := startRanks(t, 2, []int{0, 1}, argv, env)
	code, out := p.waitExit(t, 1, 30*time.Second)
	if code == 0 {
		t.Fatalf("a rank of another version joined:\n%s", out)
	}
	mustContain(t, out, "0.0.1-old")
	if code, out := p.waitExit(t, 0, 30*time.Second); code == 0 {
		t.Fatalf("rank 0 initialised without rank 1:\n%s", out)
	}
}

func TestWatchdogNamesTheRankThatNeverArrived(t *testing.T) {
	// Rank 1 stops just before the 30th collective (the large in-place
	// all-reduce); the watchdog of the ranks waiting in it names rank 1,
	// then the heartbeat timeout fails them.
	env := func(int) []string { return []string{"GCCL_WATCHDOG=0.5"} }
	p := startRanks(t, 3, []int{0, 1, 2}, collcheckArgv("-stall-at", "29", "-victim", "1"), env)
	for _, r := range []int{0, 2} {
		code, out := p.waitExit(t, r, 30*time.Second)
		if code == 0 {
			t.Fatalf("rank %d succeeded:\n%s", r, out)
		}
		mustContain(t, out, "watchdog: AllReduce #30 has waited", "ranks [1] have not reached it")
	}
}
