// Package shmem is gccl's shared memory on one host: files in /dev/shm
// (or another tmpfs) created 0600 with their space reserved, opened only if
// they are this user's regular files, and named after the job and rank that
// own them, so that CleanJob can remove what a crashed job left. Regions
// (Alloc, MapRegion) are buffers that local peers map to read and write
// each other's memory directly: the shm transport's symmetric memory and
// the p2p agent's Alloc'd regions. The shm transport's mailboxes are files
// of the same kind (CreateFile, OpenShared, MailboxPath).
//
// Regions and files work on Linux; elsewhere Alloc and MapRegion return
// ErrNotSupported. Error texts start with "shm:", the subsystem users know.
package shmem

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gccl/gccl/internal/errs"
)

// DefaultDir is where segments are made unless a caller names another
// directory.
const DefaultDir = "/dev/shm"

// ErrNotSupported is returned where there is no shared memory (off Linux).
var ErrNotSupported error = errs.New(errs.ErrNotSupported, "shm: shared memory not supported on this system")

const maxJobIDLen = 128

// CheckJobID keeps segment names inside their directory and recognisable
// by CleanJob.
func CheckJobID(jobID string) error {
	if jobID == "" || len(jobID) > maxJobIDLen || jobID[0] == '.' || jobID[0] == '-' {
		return fmt.Errorf("shm: invalid job ID %q (1 to %d characters of [A-Za-z0-9._-], not starting with '.' or '-')", jobID, maxJobIDLen)
	}
	for _, c := range jobID {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return fmt.Errorf("shm: invalid job ID %q: character %q (allowed: [A-Za-z0-9._-])", jobID, c)
		}
	}
	return nil
}

// MailboxPath is the mailbox of rank in job: <dir>/gccl-<jobID>-<rank>.
func MailboxPath(dir, jobID string, rank int) string {
	return filepath.Join(dir, "gccl-"+jobID+"-"+strconv.Itoa(rank))
}

// RegionPath is region n of rank in job: <dir>/gccl-<jobID>-<rank>-buf<n>.
func RegionPath(dir, jobID string, rank, n int) string {
	return MailboxPath(dir, jobID, rank) + "-buf" + strconv.Itoa(n)
}

// IsJobSegment reports whether base is the name of a mailbox or region of
// jobID. It matches the exact forms, so that cleaning job "7" leaves job
// "7-1" alone.
func IsJobSegment(base, jobID string) bool {
	rest, ok := strings.CutPrefix(base, "gccl-"+jobID+"-")
	if !ok {
		return false
	}
	rank, buf, hasBuf := strings.Cut(rest, "-buf")
	if !allDigits(rank) {
		return false
	}
	return !hasBuf || allDigits(buf)
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// CleanJob removes the segments (mailboxes and regions) of jobID left in dir
// (empty: DefaultDir), for example by ranks that crashed before unlinking
// them, and returns how many it removed. Peers that still map a removed
// segment keep their mapping.
func CleanJob(dir, jobID string) (int, error) {
	if err := CheckJobID(jobID); err != nil {
		return 0, err
	}
	if dir == "" {
		dir = DefaultDir
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("shm: cleaning job %s: %w", jobID, err)
	}
	n := 0
	var first error
	for _, e := range entries {
		if !IsJobSegment(e.Name(), jobID) {
			continue
		}
		err := os.Remove(filepath.Join(dir, e.Name()))
		switch {
		case err == nil:
			n++
		case errors.Is(err, os.ErrNotExist):
			// Unlinked meanwhile by its owner.
		case first == nil:
			first = fmt.Errorf("shm: cleaning job %s: %w", jobID, err)
		}
	}
	return n, first
}
