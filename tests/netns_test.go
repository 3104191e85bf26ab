package tests

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gccl/gccl/internal/launch"
)

// twoHosts makes two network namespaces joined by a veth pair, the project's
// own test hosts, or skips the test with the reason they can't be made.
// shape, if set, is a tc tbf rate (e.g. "2gbit") applied to both ends.
func twoHosts(t *testing.T, shape string) (ns [2]string, addr [2]string, ifname string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("iproute2's ip is not installed")
	}
	id := os.Getpid() % 10000
	ns = [2]string{fmt.Sprintf("gccl%da", id), fmt.Sprintf("gccl%db", id)}
	veth := [2]string{fmt.Sprintf("gv%da", id), fmt.Sprintf("gv%db", id)}
	subnet := fmt.Sprintf("10.%d.%d", 200+id/256%50, id%256)
	addr = [2]string{subnet + ".1", subnet + ".2"}
	ip := func(args ...string) error {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := ip("netns", "add", ns[0]); err != nil {
		t.Skipf("cannot create network namespaces here: %v", err)
	}
	t.Cleanup(func() { ip("netns", "del", ns[0]); ip("netns", "del", ns[1]) })
	steps := [][]string{
		{"netns", "add", ns[1]},
		{"link", "add", veth[0], "netns", ns[0], "type", "veth", "peer", "name", veth[1], "netns", ns[1]},
	}
	for i := 0; i < 2; i++ {
		steps = append(steps,
			[]string{"-n", ns[i], "addr", "add", addr[i] + "/24", "dev", veth[i]},
			[]string{"-n", ns[i], "link", "set", veth[i], "up"},
			[]string{"-n", ns[i], "link", "set", "lo", "up"})
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			t.Fatal(err)
		}
	}
	if shape != "" {
		for i := 0; i < 2; i++ {
			out, err := exec.Command("ip", "netns", "exec", ns[i], "tc", "qdisc", "add", "dev", veth[i], "root",
				"tbf", "rate", shape, "burst", "256kb", "latency", "50ms").CombinedOutput()
			if err != nil {
				t.Skipf("tc tbf unavailable: %v: %s", err, out)
			}
		}
	}
	return ns, addr, "gv"
}

// Two hosts (namespaces) with two ranks each: shared memory inside a host,
// TCP across, every result checked.
func TestTwoHostsSharedMemoryInsideTCPAcross(t *testing.T) {
	ns, addr, ifname := twoHosts(t, "")
	out := runOnTwoHosts(t, ns, addr, []string{"GCCL_SOCKET_IFNAME=" + ifname, "GCCL_DEBUG=INFO", "GCCL_DEBUG_SUBSYS=INIT"})
	for r := 0; r < 4; r++ {
		mustContain(t, out, fmt.Sprintf("collcheck: rank %d of 4 ok", r))
		for p := 0; p < 4; p++ {
			if p == r {
				continue
			}
			via := "TCP"
			if r/2 == p/2 {
				via = "SHM"
			}
			mustContain(t, out, fmt.Sprintf("rank %d -> %d via %s", r, p, via))
		}
	}
}

// Two hosts of two ranks over a link shaped to 2 Gbit/s: the tuner goes
// hierarchical for all-reduces and all-gathers, and says so;
// forcing the hierarchical schedules for every size (GCCL_ALGO=hier) keeps
// every result of every collective right. Which is faster is measured by
// tests/twohosts_bench.sh, not here.
func TestTwoHostsHierarchical(t *testing.T) {
	ns, addr, ifname := twoHosts(t, "2gbit")
	for _, algo := range []string{"", "hier"} {
		t.Run("GCCL_ALGO="+algo, func(t *testing.T) {
			out := runOnTwoHosts(t, ns, addr, []string{"GCCL_SOCKET_IFNAME=" + ifname, "GCCL_DEBUG=INFO",
				"GCCL_DEBUG_SUBSYS=TUNING", "GCCL_ALGO=" + algo})
			for r := 0; r < 4; r++ {
				mustContain(t, out, fmt.Sprintf("collcheck: rank %d of 4 ok", r))
			}
			mustContain(t, out, "2 hosts of 2 ranks: hierarchical all-reduce and all-gather")
		})
	}
}

// runOnTwoHosts runs collcheck as a job of two ranks in each namespace,
// gccl-run on each, and returns their output; a rank that fails fails t.
func runOnTwoHosts(t *testing.T, ns, addr [2]string, env []string) string {
	t.Helper()
	secret, err := launch.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	port, err := launch.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	env = append([]string{"GCCL_SECRET=" + secret}, env...)
	results := make([]result, 2)
	var wg sync.WaitGroup
	for node := 0; node < 2; node++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[node] = run(t, 2*time.Minute, env, "ip", "netns", "exec", ns[node], bins.run,
				"-np", "2", "--nnodes", "2", "--node-rank", fmt.Sprint(node),
				"--master-addr", addr[0], "--master-port", fmt.Sprint(port), bins.collcheck)
		}()
	}
	wg.Wait()
	out := results[0].out + results[1].out
	for node, res := range results {
		if res.code != 0 {
			t.Fatalf("node %d exited %d:\n%s", node, res.code, out)
		}
	}
	return out
}
