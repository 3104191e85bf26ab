package p2p

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// openDirect opens f's file again with O_DIRECT (through /proc/self/fd, so
// it works for descriptors whose path is gone).
func openDirect(f *os.File) (*os.File, error) {
	path := "/proc/self/fd/" + strconv.Itoa(int(f.Fd()))
	d, err := os.OpenFile(path, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		return nil, fmt.Errorf("%w (tmpfs and some file systems do not support O_DIRECT)", err)
	}
	return d, nil
}

// fileIdentity names a file by device and inode, so that two paths of one
// file share a cache entry.
func fileIdentity(f *os.File, st os.FileInfo) string {
	if s, ok := st.Sys().(*unix.Stat_t); ok {
		return fmt.Sprintf("%d:%d", s.Dev, s.Ino)
	}
	return f.Name()
}
