package shm

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
)

// mappedUnder sums the sizes of this process's mappings of files under dir,
// from /proc/self/maps: what the kernel says is mapped.
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

// TestMemStatsMatchMappings: the endpoints' MemStats add up to what the
// kernel has mapped of their mailboxes, which is n mailboxes of n-1 rings
// of SlotCount slots, each mapped by its owner and by its n-1 peers.
func TestMemStatsMatchMappings(t *testing.T) {
	const n, slotSize, slotCount = 3, 64 << 10, 4
	dir := testDir(t)
	eps := world(t, n, Config{SlotSize: slotSize, SlotCount: slotCount, Dir: dir})
	var sum int64
	for _, ep := range eps {
		sum += ep.MemStats().Shared
	}
	if mapped := mappedUnder(t, dir); sum != mapped {
		t.Fatalf("MemStats sum to %d bytes; %d mapped", sum, mapped)
	}
	g, err := newGeometry(slotSize, slotCount, n-1)
	if err != nil {
		t.Fatal(err)
	}
	if sum != n*n*g.total || g.total < (n-1)*slotSize*slotCount {
		t.Fatalf("MemStats sum to %d bytes; %d mailboxes of %d mapped %d times expected", sum, n, g.total, n)
	}
	if err := eps[0].Close(); err != nil {
		t.Fatal(err)
	}
	if got := eps[0].MemStats().Shared; got != 0 {
		t.Fatalf("a closed endpoint still counts %d bytes", got)
	}
}
