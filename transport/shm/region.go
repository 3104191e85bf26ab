package shm

import "github.com/gccl/gccl/internal/shmem"

// Region is a buffer in shared memory that local peers map, so that large
// collectives can read each other's data directly (symmetric memory): an
// internal/shmem region, which the p2p agent's Alloc uses too. The owner
// makes it with Alloc, publishes Name, and peers map it with MapRegion.
type Region = shmem.Region

// Alloc creates a region of size bytes in DefaultDir for rank of jobID:
// gccl-<jobID>-<rank>-buf<N>, mode 0600, fully reserved (a full /dev/shm
// fails here), page aligned and zeroed. Off Linux it returns an error
// wrapping ErrNotSupported.
func Alloc(jobID string, rank int, size int) (*Region, error) { return shmem.Alloc(jobID, rank, size) }

// AllocIn is Alloc in dir.
func AllocIn(dir, jobID string, rank int, size int) (*Region, error) {
	return shmem.AllocIn(dir, jobID, rank, size)
}

// MapRegion maps a peer's region by its Name. size must be the region's
// size, or 0 for all of it.
func MapRegion(name string, size int) (*Region, error) { return shmem.MapRegion(name, size) }

// CleanJob removes the segments (mailboxes and regions) of jobID left in dir
// (empty: DefaultDir), for example by ranks that crashed before unlinking
// them, and returns how many it removed. Peers that still map a removed
// segment keep their mapping.
func CleanJob(dir, jobID string) (int, error) { return shmem.CleanJob(dir, jobID) }

// checkJobID and mailboxPath name segments (internal/shmem).
func checkJobID(jobID string) error { return shmem.CheckJobID(jobID) }

func mailboxPath(dir, jobID string, rank int) string { return shmem.MailboxPath(dir, jobID, rank) }
