package tests

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gccl/gccl/internal/launch"
	"github.com/gccl/gccl/internal/testutil"
)

// newcomer is a process started after the job, to join its Grow.
type newcomer struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	code int
	done chan struct{}
}

func (n *newcomer) Write(b []byte) (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.out.Write(b)
}

// startNewcomer starts collcheck as a newcomer of p's job: with the job's
// environment (that of the lost rank, as a replacement gets it), GCCL_JOIN=1
// and env, which wins over it.
func startNewcomer(t *testing.T, p *rankProcs, env ...string) *newcomer {
	t.Helper()
	n := &newcomer{done: make(chan struct{})}
	n.cmd = exec.Command(bins.collcheck, "-large", "200003", "-timeout", "2m")
	n.cmd.Env = append(append(p.job.RankEnv(0), "GCCL_JOIN=1", "GCCL_SOCKET_IFNAME=lo"), env...)
	n.cmd.Stdout, n.cmd.Stderr = n, n
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := n.cmd.Wait()
		if ee, ok := err.(*exec.ExitError); ok {
			n.code = ee.ExitCode()
		}
		close(n.done)
	}()
	t.Cleanup(func() {
		n.cmd.Process.Kill()
		<-n.done
	})
	return n
}

func (n *newcomer) wait(t *testing.T, limit time.Duration) (int, string) {
	t.Helper()
	select {
	case <-n.done:
	case <-time.After(limit):
		n.mu.Lock()
		defer n.mu.Unlock()
		t.Fatalf("newcomer still running after %v (hung):\n%s", limit, n.out.String())
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.code, n.out.String()
}

// TestKillShrinkGrowContinue: rank 2 of 4 is SIGKILLed in the middle of the
// check; the survivors' operation fails, they Shrink without it and check
// the 3-rank communicator; a process with another job's secret is refused;
// a replacement process started with GCCL_JOIN=1 joins the survivors'
// Grow, and the 4 ranks pass the whole check at full size.
func TestKillShrinkGrowContinue(t *testing.T) {
	for _, tc := range []struct{ name, env, rank string }{
		{"shm", "", "GCCL_RANK=3"},                    // the newcomer names its rank
		{"tcp", "GCCL_SHM_DISABLE=1", "GCCL_RANK=-1"}, // it takes any
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := func(int) []string { return []string{tc.env, "GCCL_SOCKET_IFNAME=lo"} }
			p := startRanks(t, 4, []int{0, 1, 2, 3},
				collcheckArgv("-iters", "1000", "-large", "200003", "-die-at", "40", "-victim", "2", "-shrink", "-grow", "-timeout", "2m"), env)
			if code, out := p.waitExit(t, 2, 60*time.Second); code == 0 {
				t.Fatalf("the victim exited 0:\n%s", out)
			}
			impostor := startNewcomer(t, p, tc.env, tc.rank, "GCCL_SECRET=0123456789abcdef0123456789abcdef")
			if code, out := impostor.wait(t, 60*time.Second); code == 0 || !strings.Contains(out, "wrong job secret") {
				t.Fatalf("newcomer with another job's secret: exit %d, want a refusal for the wrong secret:\n%s", code, out)
			} else {
				t.Logf("impostor: %s", strings.TrimSpace(out))
			}
			replacement := startNewcomer(t, p, tc.env, tc.rank)
			for i, r := range []int{0, 1, 3} {
				code, out := p.waitExit(t, r, 90*time.Second)
				if code != 0 {
					t.Fatalf("survivor rank %d failed (exit %d):\n%s", r, code, out)
				}
				mustContain(t, out, "peer lost",
					fmt.Sprintf("collcheck: rank %d shrank to rank %d of 3 ok", r, i),
					fmt.Sprintf("collcheck: rank %d grew to rank %d of 4 ok", r, i))
				t.Logf("rank %d: %s", r, strings.TrimSpace(out))
			}
			code, out := replacement.wait(t, 30*time.Second)
			if code != 0 {
				t.Fatalf("replacement failed (exit %d):\n%s", code, out)
			}
			mustContain(t, out, "collcheck: newcomer joined as rank 3 of 4 ok")
			t.Logf("replacement: %s", strings.TrimSpace(out))
		})
	}
}

// TestGcclRunJoinReplacesALostRank: the same, launched as a user would: a
// job under gccl-run --keep-going, and its replacement under gccl-run
// --join, started at once (it waits for the survivors' Grow).
func TestGcclRunJoinReplacesALostRank(t *testing.T) {
	port, err := launch.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	secret, err := launch.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"GCCL_SECRET=" + secret, "GCCL_SOCKET_IFNAME=lo"}
	type result struct {
		out  string
		code int
		err  error
	}
	joined := make(chan result, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	go func() {
		cmd := exec.CommandContext(ctx, bins.run, "--join", "127.0.0.1:"+strconv.Itoa(port), "-np", "1",
			bins.collcheck, "-large", "200003", "-timeout", "2m")
		cmd.Env = append(append(testutil.EnvWithoutJob(), "GCCL_IB_DISABLE=1"), env...)
		out, err := cmd.CombinedOutput()
		res := result{out: string(out), err: err}
		if ee, ok := err.(*exec.ExitError); ok {
			res.code, res.err = ee.ExitCode(), nil
		}
		joined <- res
	}()
	job := run(t, 2*time.Minute, env, bins.run, "--keep-going", "--master-port", strconv.Itoa(port), "-np", "4",
		bins.collcheck, "-iters", "1000", "-large", "200003", "-die-at", "40", "-victim", "2", "-shrink", "-grow", "-timeout", "2m")
	// The victim's SIGKILL decides the job's status; the others went on.
	if job.code != 128+9 {
		t.Fatalf("gccl-run --keep-going: exit %d, want 137 (rank 2 killed):\n%s", job.code, job.out)
	}
	for i, r := range []int{0, 1, 3} {
		mustContain(t, job.out, fmt.Sprintf("[rank %d] collcheck: rank %d grew to rank %d of 4 ok", r, r, i))
	}
	res := <-joined
	if res.err != nil || res.code != 0 {
		t.Fatalf("gccl-run --join: exit %d, %v:\n%s", res.code, res.err, res.out)
	}
	mustContain(t, res.out, "[join 0] collcheck: newcomer joined as rank 3 of 4 ok")
	if left := shmLeftovers(t, launch.JobIDFromSecret(secret)); len(left) > 0 {
		t.Errorf("shared-memory segments left behind: %v", left)
	}
}
