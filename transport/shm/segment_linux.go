package shm

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gccl/gccl/internal/shmem"
)

// createFile, openShared: the files of internal/shmem, which regions share.
func createFile(path string, size int64) (int, error) { return shmem.CreateFile(path, size) }

func openShared(path string) (fd int, size int64, err error) { return shmem.OpenShared(path) }

// segment is one shared mapping of a file in Dir.
//
// Close and Abort may run while another goroutine is inside a Try call that
// reads or writes the mapping (Comm.Abort is safe from any goroutine), so a
// segment is never unmapped while reachable: drop replaces the file mapping
// with private zero pages in one mmap call, which releases the shared memory
// at once and leaves a late access harmless. The placeholder's address range
// is unmapped by a cleanup once the segment is unreachable.
type segment struct {
	base    unsafe.Pointer
	size    int
	dropped atomic.Bool
}

type mappedRange struct {
	base unsafe.Pointer
	size uintptr
}

func mapSegment(fd, size int, populate bool) (*segment, error) {
	return mapSegmentAt(fd, 0, size, populate)
}

// mapSegmentAt maps size bytes of the file from off (page aligned).
func mapSegmentAt(fd int, off int64, size int, populate bool) (*segment, error) {
	flags := unix.MAP_SHARED
	if populate {
		// Map the pages now, not on the first messages.
		flags |= unix.MAP_POPULATE
	}
	p, err := unix.MmapPtr(fd, off, nil, uintptr(size), unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		return nil, fmt.Errorf("mmap of %d bytes: %w", size, err)
	}
	s := &segment{base: p, size: size}
	runtime.AddCleanup(s, func(r mappedRange) { _ = unix.MunmapPtr(r.base, r.size) }, mappedRange{p, uintptr(size)})
	return s, nil
}

// at returns the address off bytes into the segment.
func (s *segment) at(off int) unsafe.Pointer { return unsafe.Add(s.base, off) }

// bytes returns n bytes at off.
func (s *segment) bytes(off, n int) []byte { return unsafe.Slice((*byte)(s.at(off)), n) }

// drop releases the shared memory behind s; see segment.
func (s *segment) drop() {
	if s.dropped.Swap(true) {
		return
	}
	_, err := unix.MmapPtr(-1, 0, s.base, uintptr(s.size), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED|unix.MAP_NORESERVE)
	// On failure (out of mappings) the file stays mapped until the cleanup
	// runs: memory held longer, but never a fault.
	_ = err
}

// pidNamespace identifies this process's pid namespace: peers in another
// one cannot be watched by pid.
func pidNamespace() uint64 {
	var st unix.Stat_t
	if unix.Stat("/proc/self/ns/pid", &st) != nil {
		return 0
	}
	return st.Ino
}
