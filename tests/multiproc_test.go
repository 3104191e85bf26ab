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
	"github.com/gccl/gccl/topo"
)

// Every collective of the matrix (a representative subset of types and
// sizes, checked exactly by collcheck) across 2, 3 and 4 processes.
func TestCollectivesOverSharedMemory(t *testing.T) {
	for _, np := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			res := run(t, 2*time.Minute, []string{"GCCL_DEBUG=INFO", "GCCL_DEBUG_SUBSYS=INIT"},
				bins.run, "-np", fmt.Sprint(np), bins.collcheck)
			if res.code != 0 {
				t.Fatalf("exit %d:\n%s", res.code, res.out)
			}
			for r := 0; r < np; r++ {
				mustContain(t, res.out, fmt.Sprintf("collcheck: rank %d of %d ok", r, np))
				for p := 0; p < np; p++ {
					if p != r {
						mustContain(t, res.out, fmt.Sprintf("rank %d -> %d via SHM", r, p))
					}
				}
			}
			if strings.Contains(res.out, "via TCP") {
				t.Fatalf("same-host ranks used TCP:\n%s", res.out)
			}
		})
	}
}

func TestCollectivesOverTCP(t *testing.T) {
	for _, np := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			res := run(t, 2*time.Minute, []string{"GCCL_SHM_DISABLE=1", "GCCL_SOCKET_IFNAME=lo", "GCCL_DEBUG=INFO", "GCCL_DEBUG_SUBSYS=INIT"},
				bins.run, "-np", fmt.Sprint(np), bins.collcheck)
			if res.code != 0 {
				t.Fatalf("exit %d:\n%s", res.code, res.out)
			}
			for r := 0; r < np; r++ {
				mustContain(t, res.out, fmt.Sprintf("collcheck: rank %d of %d ok", r, np))
				for p := 0; p < np; p++ {
					if p != r {
						mustContain(t, res.out, fmt.Sprintf("rank %d -> %d via TCP", r, p))
					}
				}
			}
			// Same-host peers over TCP is a downgrade, and says why.
			mustContain(t, res.out, "WARN", "instead of SHM (GCCL_SHM_DISABLE=1)")
		})
	}
}

// Large all-reduces on buffers from Comm.Alloc: read straight from the
// peers' mapped memory over shm, through the transport over tcp.
func TestSymmetricMemoryAcrossProcesses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		env    []string
		mapped bool
	}{
		{"shm", nil, true},
		{"tcp", []string{"GCCL_SHM_DISABLE=1", "GCCL_SOCKET_IFNAME=lo"}, false},
	} {
		for _, np := range []int{2, 3} {
			t.Run(fmt.Sprintf("%s/np=%d", tc.name, np), func(t *testing.T) {
				res := run(t, 2*time.Minute, tc.env, bins.run, "-np", fmt.Sprint(np), bins.collcheck, "-sym", "-iters", "2", "-large", "300001")
				if res.code != 0 {
					t.Fatalf("exit %d:\n%s", res.code, res.out)
				}
				for r := 0; r < np; r++ {
					mustContain(t, res.out, fmt.Sprintf("collcheck: rank %d of %d ok", r, np),
						fmt.Sprintf("collcheck: rank %d: symmetric buffers mapped by every peer: %v", r, tc.mapped))
				}
			})
		}
	}
}

// AllToAllV and AllGatherV across processes, over shm and tcp: counts
// differ per pair of ranks, some are zero, one block spans many slots.
func TestVariableCollectivesAcrossProcesses(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
	}{
		{"shm", nil},
		{"tcp", []string{"GCCL_SHM_DISABLE=1", "GCCL_SOCKET_IFNAME=lo"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := run(t, 2*time.Minute, tc.env, bins.run, "-np", "3", bins.collcheck, "-vcoll", "-large", "300001")
			if res.code != 0 {
				t.Fatalf("exit %d:\n%s", res.code, res.out)
			}
			for r := 0; r < 3; r++ {
				mustContain(t, res.out, fmt.Sprintf("collcheck: rank %d of 3 ok", r))
			}
		})
	}
}

func TestStrictRefusesDowngrade(t *testing.T) {
	res := run(t, time.Minute, []string{"GCCL_SHM_DISABLE=1", "GCCL_STRICT=1", "GCCL_SOCKET_IFNAME=lo"},
		bins.run, "-np", "2", bins.collcheck)
	if res.code == 0 {
		t.Fatalf("GCCL_STRICT=1 accepted a downgrade:\n%s", res.out)
	}
	mustContain(t, res.out, "GCCL_STRICT=1")
}

func TestSplitAcrossProcesses(t *testing.T) {
	for _, env := range [][]string{nil, {"GCCL_SHM_DISABLE=1", "GCCL_SOCKET_IFNAME=lo"}} {
		res := run(t, 2*time.Minute, env, bins.run, "-np", "5", bins.collcheck, "-split", "-large", "1000")
		if res.code != 0 {
			t.Fatalf("env %v: exit %d:\n%s", env, res.code, res.out)
		}
		for r := 0; r < 5; r++ {
			mustContain(t, res.out, fmt.Sprintf("collcheck: rank %d of 5 ok", r))
		}
	}
}

// TestShrinkUnderGcclRun: with --keep-going, gccl-run lets the survivors of
// a killed rank shrink and finish, and still exits with the victim's status.
func TestShrinkUnderGcclRun(t *testing.T) {
	res := run(t, 2*time.Minute, nil, bins.run, "-np", "4", "--keep-going",
		bins.collcheck, "-iters", "1000", "-large", "100003", "-die-at", "25", "-victim", "1", "-shrink")
	if res.code != 128+9 {
		t.Fatalf("exit %d, want 137 (rank 1's SIGKILL):\n%s", res.code, res.out)
	}
	for i, r := range []int{0, 2, 3} {
		mustContain(t, res.out, fmt.Sprintf("collcheck: rank %d shrank to rank %d of 3 ok", r, i))
	}
}

// Init describes the host: GCCL_TOPO_DUMP_FILE writes the detected graph
// (NCCL's XML, readable back), GCCL_TOPO_FILE replaces detection and a bad
// one fails Init with the reason, and a CPU mask of one core is a WARN.
func TestTopologyAtInit(t *testing.T) {
	dump := filepath.Join(t.TempDir(), "topo.xml")
	res := run(t, time.Minute, []string{"GCCL_TOPO_DUMP_FILE=" + dump, "GCCL_DEBUG=INFO", "GCCL_DEBUG_SUBSYS=GRAPH,INIT"},
		bins.run, "-np", "2", bins.collcheck, "-large", "1000")
	if res.code != 0 {
		t.Fatalf("exit %d:\n%s", res.code, res.out)
	}
	mustContain(t, res.out, "topology: 1 host(s); this one has", "progress thread on CPUs")
	g, err := topo.ReadFile(dump)
	if err != nil {
		t.Fatalf("the dump does not read back: %v", err)
	}
	if len(g.Nodes[topo.CPU]) == 0 {
		t.Fatalf("the dump has no NUMA node:\n%s", topo.MarshalXML(g.Doc))
	}

	// The dump as the topology file: the same host, not detected.
	res = run(t, time.Minute, []string{"GCCL_TOPO_FILE=" + dump}, bins.run, "-np", "2", bins.collcheck, "-large", "1000")
	if res.code != 0 {
		t.Fatalf("GCCL_TOPO_FILE=%s: exit %d:\n%s", dump, res.code, res.out)
	}
	res = run(t, time.Minute, []string{"GCCL_TOPO_FILE=/nonexistent/topo.xml"}, bins.run, "-np", "2", bins.collcheck)
	if res.code == 0 {
		t.Fatalf("a missing GCCL_TOPO_FILE was accepted:\n%s", res.out)
	}
	mustContain(t, res.out, "GCCL_TOPO_FILE", "/nonexistent/topo.xml")

	if _, err := exec.LookPath("taskset"); err != nil {
		t.Skip("taskset is not installed")
	}
	res = run(t, time.Minute, nil, "taskset", "-c", "0", bins.run, "-np", "2", bins.collcheck, "-large", "1000")
	if res.code != 0 {
		t.Fatalf("under taskset -c 0: exit %d:\n%s", res.code, res.out)
	}
	mustContain(t, res.out, "WARN", "progress thread: the CPU mask leaves the progress thread one core (CPU 0)")
}

// Hosts of unequal sizes (two ranks on one, one on the other; GCCL_HOSTID
// makes two hosts of this machine): shared memory inside the first, TCP to
// the lone rank, every result checked. Every rank passes Init's barrier
// before shared memory is unlinked, with or without a mailbox of its own.
func TestUnevenHosts(t *testing.T) {
	secret, err := launch.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	port, err := launch.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	const n = 3
	results := make([]result, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			host := "uneven-a"
			if r == 2 {
				host = "uneven-b"
			}
			env := []string{"GCCL_SECRET=" + secret, "GCCL_RANK=" + fmt.Sprint(r), "GCCL_SIZE=" + fmt.Sprint(n),
				"GCCL_BOOTSTRAP_ADDR=127.0.0.1:" + fmt.Sprint(port), "GCCL_HOSTID=" + host,
				"GCCL_SOCKET_IFNAME=lo", "GCCL_DEBUG=INFO", "GCCL_DEBUG_SUBSYS=INIT"}
			results[r] = run(t, 2*time.Minute, env, bins.collcheck)
		}()
	}
	wg.Wait()
	for r, res := range results {
		if res.code != 0 {
			t.Fatalf("rank %d exited %d:\n%s", r, res.code, res.out)
		}
		mustContain(t, res.out, fmt.Sprintf("collcheck: rank %d of %d ok", r, n))
	}
	mustContain(t, results[0].out, "rank 0 -> 1 via SHM", "rank 0 -> 2 via TCP")
	mustContain(t, results[2].out, "rank 2 -> 0 via TCP", "rank 2 -> 1 via TCP")
}
