package tests

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

var determcheck struct {
	once sync.Once
	path string
	err  error
}

// determcheckBin builds tests/determcheck once.
func determcheckBin(t *testing.T) string {
	t.Helper()
	determcheck.once.Do(func() {
		determcheck.path = filepath.Join(bins.dir, "determcheck")
		if out, err := exec.Command("go", "build", "-o", determcheck.path, "./determcheck").CombinedOutput(); err != nil {
			determcheck.err = fmt.Errorf("go build ./determcheck: %v\n%s", err, out)
		}
	})
	if determcheck.err != nil {
		t.Fatal(determcheck.err)
	}
	return determcheck.path
}

// The deterministic contract across processes, over shared memory and
// over TCP: every element of AllReduce, ReduceScatter and Reduce has the
// bits of the rank-order fold, at lengths that cross the 1 KiB chunks, the
// owners' blocks and Reduce's windows (tests/determcheck).
func TestDeterministicAcrossProcesses(t *testing.T) {
	bin := determcheckBin(t)
	for _, tc := range []struct {
		name string
		env  []string
		via  string
	}{
		{"shm", nil, "SHM"},
		{"tcp", []string{"GCCL_SHM_DISABLE=1", "GCCL_SOCKET_IFNAME=lo"}, "TCP"},
	} {
		for _, np := range []int{2, 3} {
			t.Run(fmt.Sprintf("%s/np=%d", tc.name, np), func(t *testing.T) {
				env := append([]string{"GCCL_DETERMINISTIC=1", "GCCL_SLOT_SIZE=1024", "GCCL_DEBUG=INFO", "GCCL_DEBUG_SUBSYS=INIT"}, tc.env...)
				res := run(t, 3*time.Minute, env, bins.run, "-np", fmt.Sprint(np), bin, "-slot", "1024")
				if res.code != 0 {
					t.Fatalf("exit %d:\n%s", res.code, res.out)
				}
				for r := 0; r < np; r++ {
					mustContain(t, res.out, fmt.Sprintf("determcheck: rank %d of %d ok", r, np),
						fmt.Sprintf("rank %d -> %d via %s", r, (r+1)%np, tc.via))
				}
			})
		}
	}
}
