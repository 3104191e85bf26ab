package p2p

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSelectBackend(t *testing.T) {
	cases := []struct {
		pl     placement
		forced Backend
		want   Backend
		err    bool
	}{
		{placement{self: true, remoteType: FILE}, 0, BackendFile, false},
		{placement{self: true, remoteType: DRAM}, 0, BackendLocal, false},
		{placement{remoteType: FILE, sameHost: true, allMapped: true}, 0, BackendTCP, false},
		{placement{remoteType: DRAM, sameHost: true, allMapped: true, pvm: true}, 0, BackendSHM, false},
		{placement{remoteType: DRAM, sameHost: true, allMapped: true, pvm: true, shmOff: true}, 0, BackendPVM, false},
		{placement{remoteType: DRAM, sameHost: true, pvm: true}, 0, BackendPVM, false},
		{placement{remoteType: DRAM, sameHost: true}, 0, BackendTCP, false},
		{placement{remoteType: DRAM}, 0, BackendTCP, false},
		{placement{remoteType: DRAM, sameHost: true, allMapped: true}, BackendTCP, BackendTCP, false},
		{placement{remoteType: DRAM}, BackendSHM, 0, true},
		{placement{self: true, remoteType: FILE}, BackendTCP, 0, true},
		// VRAM.
		{placement{self: true, localType: VRAM, remoteType: FILE}, 0, BackendFile, false},
		{placement{self: true, localType: VRAM, remoteType: VRAM}, 0, BackendLocal, false},
		{placement{self: true, localType: DRAM, remoteType: VRAM}, 0, BackendLocal, false},
		{placement{remoteType: VRAM, sameHost: true, allMapped: true}, 0, BackendCUDAIPC, false},
		{placement{localType: VRAM, remoteType: VRAM, sameHost: true, allMapped: true, pvm: true}, 0, BackendCUDAIPC, false},
		{placement{remoteType: VRAM, sameHost: true, allMapped: true, ipcOff: true}, 0, BackendTCP, false},
		{placement{remoteType: VRAM, sameHost: true, pvm: true}, 0, BackendTCP, false}, // not opened here
		{placement{remoteType: VRAM, allMapped: true}, 0, BackendTCP, false},           // another host
		{placement{remoteType: VRAM, sameHost: true, allMapped: true}, BackendTCP, BackendTCP, false},
		{placement{remoteType: VRAM, sameHost: true, allMapped: true}, BackendSHM, 0, true},
		{placement{remoteType: VRAM, sameHost: true}, BackendCUDAIPC, 0, true},
		{placement{localType: VRAM, remoteType: DRAM, sameHost: true, allMapped: true, pvm: true}, 0, BackendSHM, false},
		{placement{localType: VRAM, remoteType: DRAM, sameHost: true, pvm: true}, 0, BackendTCP, false}, // pvm cannot reach VRAM
		{placement{localType: VRAM, remoteType: DRAM, sameHost: true, pvm: true}, BackendPVM, 0, true},
		{placement{localType: VRAM, remoteType: FILE, sameHost: true}, 0, BackendTCP, false},
		{placement{localType: VRAM, remoteType: DRAM, sameHost: true, allMapped: true}, BackendCUDAIPC, 0, true},
	}
	for _, c := range cases {
		got, why, err := selectBackend(c.pl, c.forced)
		if c.err != (err != nil) || got != c.want || err == nil && why == "" {
			t.Errorf("selectBackend(%+v, %v) = %v (%q), %v; want %v", c.pl, c.forced, got, why, err, c.want)
		}
	}
}

var updateGolden = flag.Bool("update", false, "rewrite testdata/*.golden from the code")

// TestSelectBackendGolden runs selectBackend on every placement (each flag
// on and off, every memory type at either end) and compares the choice, its
// reason and the backends a forced choice may name with
// testdata/select_backend.golden, so that a change to selection, or to a
// reason, shows in review.
func TestSelectBackendGolden(t *testing.T) {
	var b strings.Builder
	for bits := 0; bits < 1<<6; bits++ {
		for _, lt := range []MemType{DRAM, VRAM} {
			for _, rt := range []MemType{DRAM, VRAM, FILE} {
				pl := placement{self: bits&1 != 0, allMapped: bits&2 != 0, sameHost: bits&4 != 0, pvm: bits&8 != 0,
					shmOff: bits&16 != 0, ipcOff: bits&32 != 0, localType: lt, remoteType: rt}
				got, why, err := selectBackend(pl, BackendAuto)
				if err != nil {
					t.Fatalf("%+v: %v", pl, err)
				}
				var may []string
				for f := BackendLocal; f <= BackendCUDAIPC; f++ {
					if c, _, err := selectBackend(pl, f); err == nil {
						if c != f {
							t.Fatalf("%+v forced %v chose %v", pl, f, c)
						}
						may = append(may, f.String())
					}
				}
				fmt.Fprintf(&b, "%+v -> %v %q forced:%s\n", pl, got, why, strings.Join(may, ","))
			}
		}
	}
	path := filepath.Join("testdata", "select_backend.golden")
	if *updateGolden {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.String(); got != string(want) {
		gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Fatalf("line %d:\ngot  %s\nwant %s", i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("%d lines, want %d", len(gl), len(wl))
	}
}

func TestEstimateCost(t *testing.T) {
	for b := BackendLocal; b <= BackendCUDAIPC; b++ {
		small, big := estimateCost(b, 1, 4096, 1), estimateCost(b, 1, 64<<20, 1)
		many := estimateCost(b, 1000, 4096*1000, 1)
		if small <= 0 || big <= small || many <= estimateCost(b, 1, 4096*1000, 1) {
			t.Errorf("%v: 4 KiB %v, 64 MiB %v, 1000 pieces %v: not increasing", b, small, big, many)
		}
	}
	if estimateCost(BackendSHM, 1, 64<<20, 1) >= estimateCost(BackendTCP, 1, 64<<20, 1) {
		t.Error("the model ranks tcp above shm")
	}
}
