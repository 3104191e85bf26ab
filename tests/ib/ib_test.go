package ib

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The ranks of one VM are one host: shared memory would carry them, so
// GCCL_SHM_DISABLE=1 hands their pairs to the next transport, RDMA (with
// the WARN that says shared memory is off). TCP stays possible, over lo.
var overIB = []string{"GCCL_SHM_DISABLE=1", "GCCL_SOCKET_IFNAME=lo", "GCCL_DEBUG=INFO", "GCCL_DEBUG_SUBSYS=INIT"}

// ibRoute matches the ibverbs endpoint's own INFO line for a pair.
func ibRoute(r, p int) *regexp.Regexp {
	return regexp.MustCompile(fmt.Sprintf(`rank %d -> %d via NET/IB/\w+:\d+ \((RoCE v2|RoCE v1|InfiniBand), GID`, r, p))
}

// Every collective of collcheck's matrix (a representative subset of types
// and sizes, checked exactly) on 2, 3 and 4 processes of one rxe device.
func TestCollectivesOverIB(t *testing.T) {
	requireDevice(t)
	for _, np := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			args := []string{"-np", fmt.Sprint(np), bins.collcheck, "-large", "100003"}
			env := overIB
			if np == 3 {
				// Variable sizes, and large messages striped over 2 QPs.
				args = append(args, "-vcoll")
				env = append([]string{"GCCL_IB_QPS_PER_CONNECTION=2"}, overIB...)
			}
			res := run(t, 5*time.Minute, env, append([]string{bins.run}, args...)...)
			if res.code != 0 {
				t.Fatalf("exit %d:\n%s", res.code, res.out)
			}
			for r := range np {
				mustContain(t, res.out, fmt.Sprintf("collcheck: rank %d of %d ok", r, np))
				for p := range np {
					if p == r {
						continue
					}
					mustContain(t, res.out, fmt.Sprintf("rank %d -> %d via IB rank=", r, p))
					if !ibRoute(r, p).MatchString(res.out) {
						t.Fatalf("no NET/IB line for rank %d -> %d:\n%s", r, p, res.out)
					}
				}
			}
			if strings.Contains(res.out, "via TCP") {
				t.Fatalf("a pair went over TCP:\n%s", res.out)
			}
			t.Logf("np=%d: %v", np, res.took.Round(time.Millisecond))
		})
	}
}

// Ranks that are different hosts (GCCL_HOSTID) with RDMA on both: IB is
// what they expect, so nothing is logged as a downgrade; gccl-perf's
// header names the device and port per pair.
func TestSeparateHostsOverIB(t *testing.T) {
	requireDevice(t)
	p := startRanks(t, 3, func(int) []string { return []string{bins.collcheck, "-large", "10007"} },
		func(r int) []string {
			return []string{fmt.Sprintf("GCCL_HOSTID=ibhost%d", r), "GCCL_SOCKET_IFNAME=lo", "GCCL_DEBUG=INFO", "GCCL_DEBUG_SUBSYS=INIT"}
		})
	for r, out := range p.waitAll(t, 5*time.Minute) {
		mustContain(t, out, fmt.Sprintf("collcheck: rank %d of 3 ok", r))
		for q := range 3 {
			if q != r && !ibRoute(r, q).MatchString(out) {
				t.Fatalf("rank %d: no NET/IB line for the pair with %d:\n%s", r, q, out)
			}
		}
		if strings.Contains(out, "WARN") {
			t.Fatalf("rank %d warned:\n%s", r, out)
		}
	}

	res := run(t, 5*time.Minute, []string{"GCCL_SHM_DISABLE=1", "GCCL_SOCKET_IFNAME=lo"},
		bins.perf, "sendrecv", "-np", "2", "-b", "1M", "-e", "1M", "-n", "3", "-w", "1")
	if res.code != 0 {
		t.Fatalf("gccl-perf: exit %d:\n%s", res.code, res.out)
	}
	if !regexp.MustCompile(`#  Transports: all pairs via NET/IB/\w+:\d+`).MatchString(res.out) {
		t.Fatalf("gccl-perf's header does not show NET/IB:\n%s", res.out)
	}
	mustContain(t, res.out, "# Out of bounds values : 0 OK")
}

// kill -9 one of 4 ranks in the middle of large all-reduces: every
// survivor fails within seconds with an error naming the lost peer, and
// once the job is gone the device holds no more objects than before. A
// rank stopped (SIGSTOP) instead: the heartbeat finds it. The same over
// TCP, for comparison (logged; timing under emulation decides nothing).
func TestKilledRankOverIB(t *testing.T) {
	requireDevice(t)
	for _, c := range []struct {
		name string
		sig  syscall.Signal
		env  []string
	}{
		{"kill/IB", syscall.SIGKILL, overIB[:2]},
		{"stop/IB", syscall.SIGSTOP, overIB[:2]},
		{"kill/TCP", syscall.SIGKILL, []string{"GCCL_IB_DISABLE=1", "GCCL_SHM_DISABLE=1", "GCCL_SOCKET_IFNAME=lo"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := rdmaResources(t)
			base := qpCount(before)
			p := startRanks(t, 4, func(int) []string {
				return []string{bins.collcheck, "-iters", "100000", "-large", "200003", "-timeout", "10m"}
			}, func(int) []string { return append([]string{"GCCL_DEBUG=WARN"}, c.env...) })
			// Wait until every rank's QPs exist (Init is done), then a
			// little more: the ranks are deep in their collectives.
			if !strings.Contains(c.name, "TCP") {
				waitFor(t, 3*time.Minute, func() bool { return before == "" || qpCount(rdmaResources(t)) >= base+4*3 })
			} else {
				time.Sleep(10 * time.Second)
			}
			time.Sleep(3 * time.Second)
			start := time.Now()
			p.cmds[1].Process.Signal(c.sig)
			var worst time.Duration
			for _, r := range []int{0, 2, 3} {
				code, out := p.wait(t, r, 60*time.Second)
				if code == 0 {
					t.Fatalf("rank %d succeeded although rank 1 is gone:\n%s", r, out)
				}
				if !strings.Contains(out, "lost") {
					t.Fatalf("rank %d's error does not report the lost peer:\n%s", r, out)
				}
				d := p.ended[r].Sub(start)
				worst = max(worst, d)
				t.Logf("%s: rank %d failed %v after the signal: %s", c.name, r, d.Round(time.Millisecond), lastLine(out))
			}
			if worst > 20*time.Second {
				t.Errorf("a survivor took %v to fail", worst)
			}
			p.cmds[1].Process.Kill()
			p.wait(t, 1, 10*time.Second)
			if before != "" {
				waitFor(t, 30*time.Second, func() bool { return rdmaResources(t) == before })
			}
		})
	}
}

// qpCount is the number of QPs `rdma resource show` lists.
func qpCount(res string) int {
	n := 0
	for _, m := range regexp.MustCompile(`\bqp (\d+)`).FindAllStringSubmatch(res, -1) {
		var k int
		fmt.Sscan(m[1], &k)
		n += k
	}
	return n
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

func waitFor(t *testing.T, limit time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", limit)
		}
	}
}

// With RDMA devices present but unusable, the pair falls back to TCP with
// a WARN that names it and the reason, and GCCL_STRICT=1 makes that an
// error at Init: RLIMIT_MEMLOCK too low (without CAP_IPC_LOCK), a port
// that is down, QPs that cannot reach RTR (a device whose interface is in
// a network namespace of its own: neither side has a route to the other's
// GID, so both ranks' modify to RTR fails).
func TestUnusableRDMAWarns(t *testing.T) {
	requireDevice(t)
	inVM(t)
	for _, tool := range []string{"setpriv", "prlimit", "ip", "rdma"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	// A device rxe1 whose interface lives in a network namespace of its
	// own (the device is seen from every namespace): no route joins its
	// GID and rxe0's, so QPs between them fail at RTR, on both sides and
	// every time. Two devices whose interfaces share a namespace are not
	// that: their GIDs are both local addresses, and their QPs sometimes
	// reached RTS and then stalled without an error completion. And a
	// device rxe2 on a veth pair of its own whose link is down.
	sh(t, `ip netns add gcclrtr && ip link add veth4 type veth peer name veth5 && ip link set veth4 netns gcclrtr &&
		ip netns exec gcclrtr sh -c 'ip addr add 169.254.80.1/24 dev veth4 && ip link set lo up && ip link set veth4 up' &&
		ip link set veth5 up && ip netns exec gcclrtr rdma link add rxe1 type rxe netdev veth4 &&
		ip link add veth2 type veth peer name veth3 && ip addr add 169.254.79.1/24 dev veth2 &&
		ip link set veth3 up && ip link set veth2 up && rdma link add rxe2 type rxe netdev veth2 && ip link set veth2 down`)
	t.Cleanup(func() {
		exec.Command("sh", "-c", "rdma link delete rxe1; rdma link delete rxe2; ip link delete veth2; ip link delete veth5; ip netns delete gcclrtr").Run()
	})
	waitFor(t, 30*time.Second, func() bool {
		b, _ := os.ReadFile("/sys/class/infiniband/rxe1/ports/1/state")
		return strings.Contains(string(b), "ACTIVE")
	})
	waitFor(t, 30*time.Second, func() bool {
		b, _ := os.ReadFile("/sys/class/infiniband/rxe2/ports/1/state")
		return strings.Contains(string(b), "DOWN")
	})
	noCap := []string{"setpriv", "--bounding-set=-ipc_lock", "--inh-caps=-ipc_lock", "prlimit", "--memlock=65536", "--"}
	for _, c := range []struct {
		name string
		argv []string
		env  func(r int) string
		why  []string // in rank 0's WARN
	}{
		{"memlock", noCap, func(int) string { return "GCCL_IB_HCA=rxe0" },
			[]string{"RLIMIT_MEMLOCK is 65536 bytes, and the slot rings need ", "raise it with `ulimit -l unlimited` (a container: `--ulimit memlock=-1`"}},
		{"port down", nil, func(int) string { return "GCCL_IB_HCA=rxe2" },
			[]string{"no usable RDMA port (", "rxe2:1: port DOWN)"}},
		// Either rank's QP may be the one that fails: rank 0 names its
		// own failure, or rank 1's ("on rank 1: ...").
		{"no RTR", nil, func(r int) string { return fmt.Sprintf("GCCL_IB_HCA=rxe%d", r) },
			[]string{"QP failed to reach RTR/RTS: ", "ibv_modify_qp to RTR: "}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, strict := range []bool{false, true} {
				env := func(r int) []string {
					e := []string{fmt.Sprintf("GCCL_HOSTID=ibhost%d", r), "GCCL_SOCKET_IFNAME=lo", "GCCL_DEBUG=WARN", c.env(r)}
					if strict {
						e = append(e, "GCCL_STRICT=1")
					}
					return e
				}
				p := startRanks(t, 2, func(int) []string { return append(append([]string{}, c.argv...), bins.collcheck, "-large", "1001") }, env)
				if !strict {
					outs := p.waitAll(t, 3*time.Minute)
					for r, out := range outs {
						mustContain(t, out, fmt.Sprintf("WARN INIT rank %d -> %d via TCP instead of IB (", r, 1-r),
							fmt.Sprintf("collcheck: rank %d of 2 ok", r))
					}
					mustContain(t, outs[0], c.why...)
					if !regexp.MustCompile(`via TCP instead of IB \((on rank 1: )?` + regexp.QuoteMeta(c.why[0])).MatchString(outs[0]) {
						t.Fatalf("rank 0's WARN does not give the reason %q first:\n%s", c.why[0], outs[0])
					}
					t.Logf("%s: %s", c.name, firstLine(outs[0], "WARN"))
					continue
				}
				for r := range 2 {
					code, out := p.wait(t, r, 3*time.Minute)
					if code == 0 {
						t.Fatalf("GCCL_STRICT=1: rank %d initialised:\n%s", r, out)
					}
					mustContain(t, out, "GCCL_STRICT=1", fmt.Sprintf("rank %d -> %d via TCP instead of IB", r, 1-r))
				}
			}
		})
	}
}

func firstLine(s, with string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, with) {
			return l
		}
	}
	return ""
}

// TestTwoHosts is one host's half of a 4-rank job over two VMs (run by
// tests/rxe/run.sh as RXEVM_RANK 0 and 1): 2 ranks per VM, shared memory
// inside each, RDMA between them, every collective checked; then
// gccl-perf's header shows the transports of the pairs.
func TestTwoHosts(t *testing.T) {
	vm := os.Getenv("RXEVM_RANK")
	if vm == "" {
		t.Skip("not one of two VMs (tests/rxe/run.sh runs this test in two)")
	}
	requireDevice(t)
	host := 0
	if vm == "1" {
		host = 1
	}
	server := os.Getenv("RXEVM_SELF_ADDR")
	if host == 1 {
		server = os.Getenv("RXEVM_PEER_ADDR")
	}
	job := func(port int, argv ...string) []string {
		p := startRanks(t, 2, func(int) []string { return argv }, func(r int) []string {
			g := 2*host + r
			return []string{fmt.Sprintf("GCCL_RANK=%d", g), "GCCL_SIZE=4", fmt.Sprintf("GCCL_LOCAL_RANK=%d", r), "GCCL_LOCAL_SIZE=2",
				fmt.Sprintf("GCCL_BOOTSTRAP_ADDR=%s:%d", server, port), "GCCL_SECRET=0123456789abcdef0123456789abcdef",
				fmt.Sprintf("GCCL_JOB_ID=twohosts%d", port), fmt.Sprintf("GCCL_HOSTID=vm%d", host), "GCCL_SOCKET_IFNAME=eth0",
				"GCCL_DEBUG=INFO", "GCCL_DEBUG_SUBSYS=INIT", "GCCL_BOOTSTRAP_TIMEOUT=300s"}
		})
		return p.waitAll(t, 8*time.Minute)
	}
	outs := job(29610, bins.collcheck, "-large", "30011")
	for r, out := range outs {
		g := 2*host + r
		mustContain(t, out, fmt.Sprintf("collcheck: rank %d of 4 ok", g))
		for q := range 4 {
			switch {
			case q == g:
			case q/2 == host:
				mustContain(t, out, fmt.Sprintf("rank %d -> %d via SHM", g, q))
			case !ibRoute(g, q).MatchString(out):
				t.Fatalf("rank %d: no NET/IB line for the pair with %d:\n%s", g, q, out)
			}
		}
		if strings.Contains(out, "instead of") {
			t.Fatalf("rank %d downgraded a pair:\n%s", g, out)
		}
		t.Logf("rank %d: %s", g, firstLine(out, "via NET/IB"))
	}
	outs = job(29611, bins.perf, "all_reduce", "-b", "1M", "-e", "1M", "-n", "3", "-w", "1")
	if host == 0 {
		mustContain(t, outs[0], "# Out of bounds values : 0 OK")
		if !regexp.MustCompile(`#  Transports: rank 0 -> 1 SHM, 2-3 NET/IB/\w+:\d+`).MatchString(outs[0]) {
			t.Fatalf("gccl-perf's header does not show the pairs' transports:\n%s", outs[0])
		}
		t.Logf("gccl-perf:\n%s", outs[0])
	}
}
