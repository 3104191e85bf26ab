package p2p

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
)

// mappedUnder sums this process's mappings of files under dir, as
// /proc/self/maps lists them.
func mappedUnder(t *testing.T, dir string) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	var n int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || !strings.HasPrefix(fields[5], dir+"/") {
			continue
		}
		lo, hi, _ := strings.Cut(fields[0], "-")
		a, err1 := strconv.ParseUint(lo, 16, 64)
		b, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("/proc/self/maps: %q", sc.Text())
		}
		n += int64(b - a)
	}
	return n
}

// TestMemStatsMatchMappings: what two agents report as registered, shared
// and mapped matches what they were given and what the kernel has mapped
// of their shared-memory directory, and deregistering gives it back.
func TestMemStatsMatchMappings(t *testing.T) {
	skipWithout(t, BackendSHM)
	dir := t.TempDir()
	a := newAgent(t, "a", Config{SHMDir: dir})
	b := newAgent(t, "b", Config{SHMDir: dir})
	const heap, shared = 3 * 4096, 16 * 4096
	hr, err := a.RegisterMem(make([]byte, heap))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Alloc(shared); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Alloc(2 * shared); err != nil {
		t.Fatal(err)
	}
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	// b learns a's metadata (and maps a's region) as a connects.
	waitFor(t, func() bool { return b.MemStats().SharedMapped == shared })
	ma, mb := a.MemStats(), b.MemStats()
	want := MemStats{Registered: heap, Shared: shared, SharedMapped: 2 * shared, Regions: 2}
	if ma != want {
		t.Errorf("a: %+v, want %+v", ma, want)
	}
	if mb.Shared != 2*shared || mb.SharedMapped != shared || mb.Registered != 0 {
		t.Errorf("b: %+v", mb)
	}
	if got, mapped := ma.Shared+ma.SharedMapped+mb.Shared+mb.SharedMapped, mappedUnder(t, dir); got != mapped {
		t.Errorf("agents report %d bytes of shared memory; %d mapped", got, mapped)
	}
	if err := a.DeregisterMem(hr); err != nil {
		t.Fatal(err)
	}
	if m := a.MemStats(); m.Registered != 0 || m.Regions != 1 {
		t.Errorf("after DeregisterMem: %+v", m)
	}
	a.Close()
	if m := a.MemStats(); m != (MemStats{}) {
		t.Errorf("after Close: %+v", m)
	}
}
