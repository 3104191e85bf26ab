package shm

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

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
	flags := unix.MAP_SHARED
	if populate {
		// Map the pages now, not on the first messages.
		flags |= unix.MAP_POPULATE
	}
	p, err := unix.MmapPtr(fd, 0, nil, uintptr(size), unix.PROT_READ|unix.PROT_WRITE, flags)
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

// createFile creates path exclusively with mode 0600 and reserves size bytes
// of it, so that a full /dev/shm fails here, with an error that says so,
// instead of killing the process with SIGBUS at the first touch of a page
// that tmpfs cannot supply.
func createFile(path string, size int64) (int, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		if errors.Is(err, unix.EEXIST) {
			return -1, fmt.Errorf("shm: %s already exists: a segment of a crashed run with the same job ID? (remove it with CleanJob): %w", path, err)
		}
		return -1, fmt.Errorf("shm: creating %s: %w", path, err)
	}
	fail := func(err error) (int, error) {
		unix.Close(fd)
		unix.Unlink(path)
		return -1, err
	}
	// The umask can only clear bits; make the mode exactly 0600.
	if err := unix.Fchmod(fd, 0o600); err != nil {
		return fail(fmt.Errorf("shm: chmod %s: %w", path, err))
	}
	err = unix.Fallocate(fd, 0, 0, size)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		// Not tmpfs: a file system without fallocate backs pages on demand.
		err = unix.Ftruncate(fd, size)
	}
	if err != nil {
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EFBIG) {
			return fail(fmt.Errorf("shm: not enough space in %s for a %s segment (%s free): enlarge it (docker run --shm-size, or a bigger tmpfs) or lower SlotSize/SlotCount: %w",
				dirOf(path), fmtBytes(size), freeSpace(dirOf(path)), err))
		}
		return fail(fmt.Errorf("shm: reserving %s for %s: %w", fmtBytes(size), path, err))
	}
	return fd, nil
}

func dirOf(path string) string {
	for i := len(path) - 1; i >= 0; i-- {
		if path[i] == '/' {
			if i == 0 {
				return "/"
			}
			return path[:i]
		}
	}
	return "."
}

func freeSpace(dir string) string {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return "unknown"
	}
	return fmtBytes(int64(st.Bavail) * st.Bsize)
}

func fmtBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// openShared opens a segment made by another rank for mapping. It refuses
// anything but a regular file of this user, so a stray name cannot make a
// rank map someone else's memory.
func openShared(path string) (fd int, size int64, err error) {
	fd, err = unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return -1, 0, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("not a regular file")
	}
	if int(st.Uid) != os.Geteuid() {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("owned by uid %d, not by this user (%d)", st.Uid, os.Geteuid())
	}
	return fd, st.Size, nil
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
