package shmem

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// CreateFile creates path exclusively with mode 0600 and reserves size bytes
// of it, so that a full /dev/shm fails here, with an error that says so,
// instead of killing the process with SIGBUS at the first touch of a page
// that tmpfs cannot supply.
func CreateFile(path string, size int64) (int, error) {
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

// OpenShared opens a segment made by another process (a rank's mailbox, a peer's region) for mapping. It refuses
// anything but a regular file of this user, so a stray name cannot make a
// rank map someone else's memory.
func OpenShared(path string) (fd int, size int64, err error) {
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
