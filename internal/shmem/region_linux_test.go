package shmem

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// testDir is a private directory on tmpfs (like production), removed at
// the end of the test.
func testDir(tb testing.TB) string {
	tb.Helper()
	base := DefaultDir
	if st, err := os.Stat(base); err != nil || !st.IsDir() {
		base = ""
	}
	d, err := os.MkdirTemp(base, "gccl-shmemtest-")
	require.NoError(tb, err)
	tb.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func dirEntries(tb testing.TB, dir string) []string {
	tb.Helper()
	es, err := os.ReadDir(dir)
	require.NoError(tb, err)
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func fill(b []byte, i int) {
	for j := range b {
		b[j] = byte(i*131 + j*7 + 1)
	}
}

func check(b []byte, i int) bool {
	for j := range b {
		if b[j] != byte(i*131+j*7+1) {
			return false
		}
	}
	return true
}

func TestRegionSharedBetweenMappings(t *testing.T) {
	dir := testDir(t)
	own, err := AllocIn(dir, "reg", 3, 1<<20+5)
	require.NoError(t, err)
	require.Len(t, own.Bytes(), 1<<20+5)
	require.Zero(t, uintptr(unsafe.Pointer(&own.Bytes()[0]))%uintptr(os.Getpagesize()), "region not page aligned")
	peer, err := MapRegion(own.Name(), own.Len())
	require.NoError(t, err)
	fill(own.Bytes(), 1)
	require.True(t, check(peer.Bytes(), 1), "peer mapping does not see the owner's writes")
	peer.Bytes()[12345] = 0
	require.Zero(t, own.Bytes()[12345], "owner does not see the peer's writes")
	_, err = MapRegion(own.Name(), 4096)
	require.Error(t, err, "mapped a region with the wrong size")
	second, err := AllocIn(dir, "reg", 3, 4096)
	require.NoError(t, err)
	require.NotEqual(t, own.Name(), second.Name(), "two regions share a name")
	for _, r := range []*Region{own, peer, second} {
		require.NoError(t, r.Unlink())
	}
	require.Empty(t, dirEntries(t, dir), "after Unlink")
	for _, r := range []*Region{own, peer, second, own} {
		require.NoError(t, r.Close())
	}
	_, err = AllocIn(dir, "reg", 0, 0)
	require.Error(t, err, "empty region accepted")
}

func TestRegionsAre0600(t *testing.T) {
	dir := testDir(t)
	old := unix.Umask(0)
	defer unix.Umask(old)
	reg, err := AllocIn(dir, "perm", 0, 1<<16)
	require.NoError(t, err)
	defer reg.Close()
	st, err := os.Stat(reg.Name())
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode())
	require.True(t, strings.HasPrefix(filepath.Base(reg.Name()), "gccl-perm-0-buf"), reg.Name())
}

// OpenShared refuses what is not this user's regular file, so a stray name
// cannot make a process map another's memory.
func TestOpenSharedRefusesNonFiles(t *testing.T) {
	dir := testDir(t)
	_, _, err := OpenShared(dir)
	require.Error(t, err, "opened a directory")
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, unix.Mkfifo(fifo, 0o600))
	_, _, err = OpenShared(fifo)
	require.ErrorContains(t, err, "not a regular file")
	link := filepath.Join(dir, "link")
	require.NoError(t, os.Symlink("/etc/passwd", link))
	_, _, err = OpenShared(link)
	require.Error(t, err, "followed a symlink")
	fd, err := CreateFile(filepath.Join(dir, "gccl-j-0"), 4096)
	require.NoError(t, err)
	unix.Close(fd)
	_, err = CreateFile(filepath.Join(dir, "gccl-j-0"), 4096)
	require.ErrorContains(t, err, "CleanJob", "a second create of one name")
	fd, size, err := OpenShared(filepath.Join(dir, "gccl-j-0"))
	require.NoError(t, err)
	unix.Close(fd)
	require.EqualValues(t, 4096, size)
}

func TestFullDirFailsAtAlloc(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1M,mode=0700"); err != nil {
		t.Skipf("cannot mount a small tmpfs to simulate a full /dev/shm (%v); needs root or CAP_SYS_ADMIN", err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	_, err := AllocIn(dir, "full", 0, 2<<20)
	require.ErrorContains(t, err, "not enough space")
	require.Empty(t, dirEntries(t, dir), "failed Alloc left files")
}

func TestCleanJob(t *testing.T) {
	dir := testDir(t)
	var regs []*Region
	for r := 0; r < 3; r++ {
		reg, err := AllocIn(dir, "j7", r, 4096)
		require.NoError(t, err)
		regs = append(regs, reg)
	}
	defer func() {
		for _, r := range regs {
			r.Close()
		}
	}()
	fd, err := CreateFile(MailboxPath(dir, "j7", 0), 4096) // a mailbox of the job
	require.NoError(t, err)
	unix.Close(fd)
	other, err := AllocIn(dir, "j7-1", 0, 4096) // another job whose name extends this one's
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "gccl-j7-x"), nil, 0o600))
	n, err := CleanJob(dir, "j7")
	require.NoError(t, err)
	require.Equal(t, 4, n, "want 3 regions and 1 mailbox")
	require.Equal(t, filepath.Base(other.Name())+" gccl-j7-x",
		strings.Join(dirEntries(t, dir), " "), "want only the other job's region and the unrelated file")
	n, err = CleanJob(dir, "j7")
	require.NoError(t, err)
	require.Zero(t, n, "second CleanJob")
	_, err = CleanJob(dir, "../etc")
	require.Error(t, err, "job ID with a slash accepted")
}

// TestRegionsLeaveNothing: regions made, mapped and closed leave no file
// descriptor, mapping or file.
func TestRegionsLeaveNothing(t *testing.T) {
	dir := testDir(t)
	fds := func() int { es, _ := os.ReadDir("/proc/self/fd"); return len(es) }
	before := fds()
	for i := 0; i < 3; i++ {
		reg, err := AllocIn(dir, "leak", 0, 8192)
		require.NoError(t, err)
		peer, err := MapRegion(reg.Name(), 0)
		require.NoError(t, err)
		require.NoError(t, reg.Close())
		require.NoError(t, peer.Close())
	}
	require.Equal(t, before, fds(), "file descriptors")
	maps, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	require.NotContains(t, string(maps), dir, "regions still mapped")
	require.Empty(t, dirEntries(t, dir), "files left")
}
