package launch

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ShmPrefix is the start of the name of every shared-memory segment of job
// jobID: the shared-memory transport names its segments
// gccl-<jobID>-<anything>.
func ShmPrefix(jobID string) string { return "gccl-" + jobID + "-" }

// RemoveShmSegments removes the files in dir whose names start with
// ShmPrefix(jobID): what a job's ranks left behind when they crashed before
// unlinking their segments. It returns how many it removed. A missing dir
// (a system without /dev/shm) is not an error.
func RemoveShmSegments(dir, jobID string) (int, error) {
	if jobID == "" {
		// An empty ID would match every job's segments.
		return 0, errors.New("launch: removing shared-memory segments: empty job ID")
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	prefix := ShmPrefix(jobID)
	removed := 0
	var errs []error
	for _, e := range entries {
		if e.IsDir() || !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		err := os.Remove(filepath.Join(dir, e.Name()))
		switch {
		case err == nil:
			removed++
		case !errors.Is(err, fs.ErrNotExist): // a rank may unlink it meanwhile
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}
