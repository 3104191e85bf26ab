package tests

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gccl/gccl/internal/launch"
)

// TestTwoHostsTLS: two hosts (network namespaces) run the collectives and
// a p2p transfer with GCCL_TLS=1, every connection across the link under
// TLS 1.3; a rank without the job's secret, a rank without TLS and an
// agent that did not load the target's metadata are refused, each saying
// why.
func TestTwoHostsTLS(t *testing.T) {
	ns, addr, ifname := twoHosts(t, "")
	base := []string{"GCCL_TLS=1", "GCCL_SOCKET_IFNAME=" + ifname, "GCCL_DEBUG=INFO", "GCCL_DEBUG_SUBSYS=INIT,NET"}

	t.Run("collectives", func(t *testing.T) {
		out := runOnTwoHosts(t, ns, addr, base)
		for r := 0; r < 4; r++ {
			mustContain(t, out, fmt.Sprintf("collcheck: rank %d of 4 ok", r))
		}
		// Ranks 0 and 1 are on the first host, 2 and 3 on the second.
		mustContain(t, out, "rank 0 <-> 2 via TCP/", "TLS 1.3")
		if n := strings.Count(out, "TLS 1.3"); n < 8 {
			t.Fatalf("%d TLS links logged, want 8 (each cross-host pair from both sides):\n%s", n, out)
		}
	})

	t.Run("refused", func(t *testing.T) {
		short := append([]string{"GCCL_BOOTSTRAP_TIMEOUT=10"}, base...)
		secret, _ := launch.NewSecret()
		other, _ := launch.NewSecret()
		// Node 1 has another secret: its ranks refuse the rendezvous's key.
		res := runNodes(t, ns, addr, [2][]string{
			append([]string{"GCCL_SECRET=" + secret}, short...),
			append([]string{"GCCL_SECRET=" + other}, short...)})
		if res[1].code == 0 || !strings.Contains(res[1].out, "presented key") {
			t.Fatalf("a node with another secret: exit %d:\n%s", res[1].code, res[1].out)
		}
		// Node 1 without TLS: told so by the rendezvous.
		res = runNodes(t, ns, addr, [2][]string{
			append([]string{"GCCL_SECRET=" + secret}, short...),
			append(append([]string{"GCCL_SECRET=" + secret}, short...), "GCCL_TLS=0")})
		if res[1].code == 0 || !strings.Contains(res[1].out, "uses TLS (GCCL_TLS=1) and this rank does not") {
			t.Fatalf("a node without TLS: exit %d:\n%s", res[1].code, res[1].out)
		}
	})

	t.Run("p2p", func(t *testing.T) {
		bin := filepath.Join(bins.dir, "p2pcheck")
		if out, err := exec.Command("go", "build", "-o", bin, "./p2pcheck").CombinedOutput(); err != nil {
			t.Fatalf("go build p2pcheck: %v\n%s", err, out)
		}
		// Shared memory and process_vm work across network namespaces of
		// one machine: turn them off, as between real hosts.
		env := []string{"GCCL_TLS=1", "GCCL_SHM_DISABLE=1", "GCCL_P2P_PVM_DISABLE=1"}
		md := filepath.Join(t.TempDir(), "target.md")
		var tres result
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			tres = run(t, time.Minute, env, "ip", "netns", "exec", ns[0], bin, "target", addr[0], md)
		}()
		sres := run(t, time.Minute, env, "ip", "netns", "exec", ns[1], bin, "stranger", md)
		ires := run(t, time.Minute, env, "ip", "netns", "exec", ns[1], bin, "initiator", md)
		wg.Wait()
		out := tres.out + sres.out + ires.out
		if tres.code != 0 || sres.code != 0 || ires.code != 0 {
			t.Fatalf("p2pcheck exits %d %d %d:\n%s", tres.code, sres.code, ires.code, out)
		}
		mustContain(t, out, "p2pcheck: stranger refused", "wrong token", "p2pcheck: READ over tcp",
			"p2pcheck: WRITE over tcp", "p2pcheck: initiator ok", "p2pcheck: target ok")
	})
}

// runNodes runs collcheck as two ranks in each namespace with each node's
// own environment and returns the nodes' results, whatever their exits.
func runNodes(t *testing.T, ns, addr [2]string, env [2][]string) [2]result {
	t.Helper()
	port, err := launch.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	var res [2]result
	var wg sync.WaitGroup
	for node := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[node] = run(t, time.Minute, env[node], "ip", "netns", "exec", ns[node], bins.run,
				"-np", "2", "--nnodes", "2", "--node-rank", fmt.Sprint(node),
				"--master-addr", addr[0], "--master-port", fmt.Sprint(port), bins.collcheck)
		}()
	}
	wg.Wait()
	return res
}
