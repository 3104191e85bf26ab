package memops

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// minorFaults is this thread's count of minor page faults.
func minorFaults(t *testing.T) int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		t.Fatal(err)
	}
	return ru.Minflt
}

var sink byte

// touch reads or writes one byte of every page of b; it returns the minor
// faults that took.
func touch(t *testing.T, b []byte, write bool) int64 {
	before := minorFaults(t)
	var sum byte
	for i := 0; i < len(b); i += unix.Getpagesize() {
		if write {
			b[i] = byte(i)
		} else {
			sum += b[i]
		}
	}
	sink = sum
	return minorFaults(t) - before
}

// mapping returns pages pages of fresh memory, anonymous for writing and
// of a shared memory file for reading (the shm transport's two cases).
func mapping(t testing.TB, pages int, write bool) []byte {
	ps := unix.Getpagesize()
	fd, err := unix.MemfdCreate("gccl-prefault-test", 0)
	if err != nil {
		t.Skipf("memfd_create: %v", err)
	}
	defer unix.Close(fd)
	if err := unix.Fallocate(fd, 0, 0, int64(pages*ps)); err != nil {
		t.Fatal(err)
	}
	var m []byte
	if write {
		m, err = unix.Mmap(-1, 0, pages*ps, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	} else {
		m, err = unix.Mmap(fd, 0, pages*ps, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	}
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Pages populated or prefaulted take no fault at first use, for anonymous
// memory written and shared file memory read; the same pages left alone
// fault. Pages of b that start before it or end after it are covered too,
// and Prefault leaves what b holds as it was.
func TestPrefault(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	const pages = 16
	ps := unix.Getpagesize()
	for _, write := range []bool{true, false} {
		for _, how := range []string{"none", "populate", "prefault"} {
			m := mapping(t, pages, write)
			part := m[ps/2 : len(m)-ps/2] // from mid first page to mid last page
			var err error
			switch how {
			case "populate":
				err = populate(part, write)
			case "prefault":
				err = Prefault(part, write)
			}
			if err == unix.EINVAL && how == "populate" {
				t.Logf("no MADV_POPULATE_* in this kernel: %v", err)
				unix.Munmap(m)
				continue
			}
			if err != nil && err != unix.EINVAL {
				t.Fatal(err)
			}
			faults := touch(t, m, write)
			switch {
			case how != "none" && faults != 0:
				t.Errorf("write=%v: %d faults after %s, want 0", write, faults, how)
			case how == "none" && faults == 0:
				// Reads of a file fault around: one fault may map 16 pages.
				t.Errorf("write=%v: no fault on fresh pages: the check cannot see faults", write)
			}
			unix.Munmap(m)
		}
	}
	if err := Prefault(nil, true); err != nil {
		t.Errorf("Prefault(nil): %v", err)
	}
	// What b holds is unchanged, at any alignment.
	b := make([]byte, 5*ps+13)
	for i := range b {
		b[i] = byte(i%251 + 1)
	}
	for _, off := range []int{0, 1, 7, 8, ps - 3} {
		if err := Prefault(b[off:], true); err != nil && err != unix.EINVAL {
			t.Fatal(err)
		}
		for i, v := range b {
			if v != byte(i%251+1) {
				t.Fatalf("Prefault from %d: byte %d is %d, want %d", off, i, v, byte(i%251+1))
			}
		}
	}
}

// BenchmarkFirstTouch is the cost of a process's first write to a page of
// fresh anonymous memory, per page: left alone (a page fault), populated
// (a fault the kernel took ahead; what is left is the hypervisor's), and
// prefaulted (nothing left).
func BenchmarkFirstTouch(b *testing.B) {
	const pages = 256
	for _, how := range []string{"fault", "populated", "prefaulted"} {
		b.Run(how, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				m := mapping(b, pages, true)
				switch how {
				case "populated":
					_ = populate(m, true)
				case "prefaulted":
					_ = Prefault(m, true)
				}
				b.StartTimer()
				for i := 0; i < len(m); i += 4096 {
					m[i+64] = 1
				}
				b.StopTimer()
				unix.Munmap(m)
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*pages), "ns/page")
		})
	}
}
