package tests

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The fault soak: rounds of a 4-rank all-reduce job (over shared memory,
// then over TCP) and of two p2p agents writing to each other (shared
// memory and process_vm, then TCP), each losing a random process to
// SIGKILL or SIGSTOP at a random moment. Every survivor must fail with an
// error that names the lost rank or agent within 2x the detection timeout,
// exit within a hard deadline, and leave nothing behind: no shared-memory
// segment, no fd or goroutine beyond those it had before it joined.
//
// GCCL_SOAK_ROUNDS sets the rounds (default 8: each kind with each fault
// once), GCCL_SOAK_SEED the seed (default: the time; the log prints it, so
// that a failing round can be replayed). tests/soak.sh runs a long soak.

// soakDetect is the detection timeout of both layers in the soak: the
// rendezvous heartbeat (GCCL_HEARTBEAT_TIMEOUT, the default 3 s) and the
// p2p agents' PeerTimeout. A stopped process is noticed only by it; a
// killed one at once, by its closed connections.
const soakDetect = 3 * time.Second

type soakKind struct {
	name string
	p2p  bool
	env  []string
}

var soakKinds = []soakKind{
	{name: "coll-shm"},
	{name: "coll-tcp", env: []string{"GCCL_SHM_DISABLE=1"}},
	{name: "p2p-shm", p2p: true},
	{name: "p2p-tcp", p2p: true, env: []string{"GCCL_SHM_DISABLE=1", "GCCL_P2P_PVM_DISABLE=1"}},
}

var soakBin struct {
	once sync.Once
	path string
	err  error
}

func buildSoakRank(t *testing.T) string {
	t.Helper()
	soakBin.once.Do(func() {
		soakBin.path = filepath.Join(bins.dir, "soakrank")
		out, err := exec.Command("go", "build", "-o", soakBin.path, "./soakrank").CombinedOutput()
		if err != nil {
			soakBin.err = fmt.Errorf("go build ./soakrank: %v\n%s", err, out)
		}
	})
	if soakBin.err != nil {
		t.Fatal(soakBin.err)
	}
	return soakBin.path
}

// soakStats gathers the worst detection time per kind and fault, for the
// summary line (tests/soak.sh greps it).
type soakStats struct {
	mu    sync.Mutex
	worst map[string]time.Duration
	runs  map[string]int
}

func (s *soakStats) add(key string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runs[key]++
	s.worst[key] = max(s.worst[key], d)
}

func TestFaultSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("the soak runs processes for tens of seconds; go test without -short runs it")
	}
	rounds := 8
	if v := os.Getenv("GCCL_SOAK_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("GCCL_SOAK_ROUNDS=%q: want a positive count", v)
		}
		rounds = n
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("GCCL_SOAK_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("GCCL_SOAK_SEED=%q: want an unsigned integer", v)
		}
		seed = n
	}
	t.Logf("fault soak: %d rounds, GCCL_SOAK_SEED=%d", rounds, seed)
	bin := buildSoakRank(t)
	stats := &soakStats{worst: map[string]time.Duration{}, runs: map[string]int{}}
	for i := 0; i < rounds; i++ {
		kind := soakKinds[i%len(soakKinds)]
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		// Each kind meets each fault in turn; the seed picks which first.
		fault := []syscall.Signal{syscall.SIGKILL, syscall.SIGSTOP}[(i/len(soakKinds)+int(seed%2))%2]
		name := fmt.Sprintf("round=%d/%s/%s", i, kind.name, map[syscall.Signal]string{syscall.SIGKILL: "kill", syscall.SIGSTOP: "stop"}[fault])
		if !t.Run(name, func(t *testing.T) { soakRound(t, bin, kind, fault, rng, stats) }) {
			t.Logf("replay: GCCL_SOAK_SEED=%d GCCL_SOAK_ROUNDS=%d go test -run 'TestFaultSoak/%s' ./tests", seed, i+1, regexp.QuoteMeta(name))
		}
	}
	for key, worst := range stats.worst {
		t.Logf("soak summary: %s: %d rounds, worst detection %v", key, stats.runs[key], worst.Round(time.Millisecond))
	}
}

var soakFailedAt = regexp.MustCompile(`soakrank: (.*) failed at (\d+): (.*)`)
var soakResources = regexp.MustCompile(`soakrank: .* resources: fds (-?\d+) -> (-?\d+), goroutines (\d+) -> (\d+)`)
var soakSegments = regexp.MustCompile(`soakrank: .* ready, shared segments: (.*)`)

func soakRound(t *testing.T, bin string, kind soakKind, fault syscall.Signal, rng *rand.Rand, stats *soakStats) {
	dir := t.TempDir()
	np, names := 4, []string{"soak-a", "soak-b"}
	if kind.p2p {
		np = 2
	}
	readyFile := func(r int) string { return filepath.Join(dir, fmt.Sprintf("ready-%d", r)) }
	argv := func(r int) []string {
		if kind.p2p {
			return []string{bin, "-mode", "p2p", "-name", names[r], "-peer", names[1-r], "-dir", dir,
				"-peer-timeout", soakDetect.String(), "-ready-file", readyFile(r)}
		}
		return []string{bin, "-mode", "coll", "-ready-file", readyFile(r)}
	}
	env := func(int) []string {
		return append([]string{"GCCL_SOCKET_IFNAME=lo", "GCCL_HEARTBEAT_TIMEOUT=" + soakDetect.String()}, kind.env...)
	}
	all := make([]int, np)
	for r := range all {
		all[r] = r
	}
	p := startRanks(t, np, all, argv, env)

	// Every process ready (its first operation done), then a random
	// moment of the steady state.
	deadline := time.Now().Add(60 * time.Second)
	for r := 0; r < np; r++ {
		for {
			if _, err := os.Stat(readyFile(r)); err == nil {
				break
			}
			select {
			case <-p.done[r]:
				_, out := p.waitExit(t, r, time.Second)
				t.Fatalf("process %d ended before it was ready:\n%s", r, out)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("process %d not ready after 60 s:\n%s", r, p.output(r))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	victim := rng.IntN(np)
	time.Sleep(time.Duration(rng.Int64N(int64(500 * time.Millisecond))))
	lost := fmt.Sprintf("rank %d", victim)
	namesLost := regexp.MustCompile(fmt.Sprintf(`peer rank %d\b|rank %d lost`, victim, victim))
	if victim == 0 {
		// Rank 0 serves the rendezvous (unless a gccl-bootstrap server
		// does): its loss may read as the rendezvous's, which names it.
		lost = "rank 0 (the rendezvous)"
		namesLost = regexp.MustCompile(`peer rank 0\b|rank 0 lost|served by rank 0\b`)
	}
	if kind.p2p {
		lost = names[victim]
		namesLost = regexp.MustCompile(regexp.QuoteMeta(names[victim]) + `\b`)
	}
	signalled, signalledMono := time.Now(), monotonicNow(t)
	if err := p.cmds[victim].Process.Signal(fault); err != nil {
		t.Fatal(err)
	}
	t.Logf("%v to %s (pid %d)", fault, lost, p.cmds[victim].Process.Pid)

	// Detection within 2x the timeout; then Close, and the leak checks of
	// soakrank (up to 3 s for goroutines), must end the process: the hard
	// deadline.
	hard := 2*soakDetect + 3*time.Second + 10*time.Second
	var segments []string
	var worst time.Duration
	for r := 0; r < np; r++ {
		if r == victim {
			continue
		}
		code, out := p.waitExit(t, r, time.Until(signalled.Add(hard)))
		m := soakFailedAt.FindStringSubmatch(out)
		if code != 1 || m == nil {
			t.Fatalf("process %d: exit %d without a failure line:\n%s", r, code, out)
		}
		ns, _ := strconv.ParseInt(m[2], 10, 64)
		took := time.Duration(ns - signalledMono)
		worst = max(worst, took)
		t.Logf("%s failed %v after the signal: %s", m[1], took.Round(time.Millisecond), m[3])
		if !namesLost.MatchString(m[3]) {
			t.Errorf("%s's error does not name the lost %s: %s", m[1], lost, m[3])
		}
		if took > 2*soakDetect {
			t.Errorf("%s noticed the loss of %s after %v, more than 2x the detection timeout %v", m[1], lost, took, soakDetect)
		}
		res := soakResources.FindStringSubmatch(out)
		if res == nil {
			t.Fatalf("process %d reported no resources:\n%s", r, out)
		}
		fdsBefore, _ := strconv.Atoi(res[1])
		fdsAfter, _ := strconv.Atoi(res[2])
		gBefore, _ := strconv.Atoi(res[3])
		gAfter, _ := strconv.Atoi(res[4])
		t.Logf("%s: %s", m[1], res[0])
		if fdsAfter > fdsBefore || gAfter > gBefore {
			t.Errorf("%s kept resources after Close: fds %d -> %d, goroutines %d -> %d:\n%s", m[1], fdsBefore, fdsAfter, gBefore, gAfter, out)
		}
		if s := soakSegments.FindStringSubmatch(out); s != nil {
			segments = append(segments, strings.Fields(s[1])...)
		}
	}
	stats.add(fmt.Sprintf("%s/%s", kind.name, map[syscall.Signal]string{syscall.SIGKILL: "kill", syscall.SIGSTOP: "stop"}[fault]), worst)

	// A stopped victim holds its segments until it dies: end it as its
	// launcher would, then nothing of the round may remain.
	p.cmds[victim].Process.Kill()
	_, out := p.waitExit(t, victim, 10*time.Second)
	if s := soakSegments.FindStringSubmatch(out); s != nil {
		victimSegs := strings.Fields(s[1])
		if kind.p2p && fault == syscall.SIGSTOP {
			// A p2p agent's Alloc'd segment stays named for peers that
			// load its metadata later; a survivor unlinks it when the
			// connection breaks (the process died), not when the peer
			// went silent (it may be alive). Killed later, after the
			// survivors are gone, nobody is left to: the launcher
			// removes it, as this does.
			for _, seg := range victimSegs {
				os.Remove(seg)
			}
		}
		segments = append(segments, victimSegs...)
	}
	var left []string
	for _, s := range segments {
		if _, err := os.Stat(s); err == nil {
			left = append(left, s)
		}
	}
	if len(left) > 0 {
		t.Errorf("shared-memory segments outlived the round: %v", left)
	}
}

// monotonicNow reads CLOCK_MONOTONIC, the clock soakrank's failure lines
// are in: one clock for every process of the host, never set.
func monotonicNow(t *testing.T) int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return ts.Nano()
}
