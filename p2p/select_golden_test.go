package p2p

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

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
