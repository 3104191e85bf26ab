package shmem

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Region is a buffer in shared memory that local peers map, so that they
// read and write each other's data directly (the shm transport's symmetric
// memory, the p2p agent's Alloc'd regions). The owner makes it with Alloc,
// publishes Name, and peers map it with MapRegion.
type Region struct {
	name     string
	mem      []byte
	owner    bool
	unlinked atomic.Bool
	closeMu  sync.Mutex
	closed   bool
}

// regionSeq numbers the regions this process creates, for unique names.
var regionSeq atomic.Int64

// Alloc creates a region of size bytes in DefaultDir for rank of jobID:
// gccl-<jobID>-<rank>-buf<N>, mode 0600, fully reserved (a full /dev/shm
// fails here), page aligned and zeroed.
func Alloc(jobID string, rank int, size int) (*Region, error) {
	return AllocIn(DefaultDir, jobID, rank, size)
}

// AllocIn is Alloc in dir.
func AllocIn(dir, jobID string, rank int, size int) (*Region, error) {
	if err := CheckJobID(jobID); err != nil {
		return nil, err
	}
	if size <= 0 || rank < 0 {
		return nil, fmt.Errorf("shm: region of %d bytes for rank %d", size, rank)
	}
	if dir == "" {
		dir = DefaultDir
	}
	path := RegionPath(dir, jobID, rank, int(regionSeq.Add(1)-1))
	fd, err := CreateFile(path, int64(size))
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	mem, err := mapRegion(fd, size)
	if err != nil {
		unix.Unlink(path)
		return nil, fmt.Errorf("shm: mapping %s: %w", path, err)
	}
	return &Region{name: path, mem: mem, owner: true}, nil
}

// MapRegion maps a peer's region by its Name. size must be the region's
// size, or 0 for all of it.
func MapRegion(name string, size int) (*Region, error) {
	fd, fsize, err := OpenShared(name)
	if err != nil {
		return nil, fmt.Errorf("shm: opening region %s: %w", name, err)
	}
	defer unix.Close(fd)
	if size == 0 {
		size = int(fsize)
	}
	if size <= 0 || int64(size) != fsize {
		return nil, fmt.Errorf("shm: region %s holds %d bytes, not %d", name, fsize, size)
	}
	mem, err := mapRegion(fd, size)
	if err != nil {
		return nil, fmt.Errorf("shm: mapping region %s: %w", name, err)
	}
	return &Region{name: name, mem: mem}, nil
}

func mapRegion(fd, size int) ([]byte, error) {
	p, err := unix.MmapPtr(fd, 0, nil, uintptr(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), size), nil
}

// Name is what peers pass to MapRegion.
func (r *Region) Name() string { return r.name }

// Bytes is the region's memory, valid until Close.
func (r *Region) Bytes() []byte { return r.mem }

// Len is the region's size in bytes.
func (r *Region) Len() int { return len(r.mem) }

// Unlink removes the region's name once every peer has mapped it; it is
// idempotent. Only the owner unlinks; on a mapped peer region it does
// nothing.
func (r *Region) Unlink() error {
	if !r.owner || r.unlinked.Swap(true) {
		return nil
	}
	if err := unix.Unlink(r.name); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("shm: unlinking %s: %w", r.name, err)
	}
	return nil
}

// Close unmaps the region (and unlinks it, for the owner). Bytes must not be
// used afterwards. Close is idempotent.
func (r *Region) Close() error {
	err := r.Unlink()
	r.closeMu.Lock()
	defer r.closeMu.Unlock()
	if r.closed {
		return err
	}
	r.closed = true
	if e := unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(r.mem)), uintptr(len(r.mem))); e != nil && err == nil {
		err = fmt.Errorf("shm: unmapping %s: %w", r.name, e)
	}
	r.mem = nil
	return err
}
