//go:build !linux

package shmem

// Region is a shared buffer; on this system Alloc returns ErrNotSupported.
type Region struct{}

// Alloc returns ErrNotSupported on this system.
func Alloc(jobID string, rank int, size int) (*Region, error) { return nil, ErrNotSupported }

// AllocIn returns ErrNotSupported on this system.
func AllocIn(dir, jobID string, rank int, size int) (*Region, error) { return nil, ErrNotSupported }

// MapRegion returns ErrNotSupported on this system.
func MapRegion(name string, size int) (*Region, error) { return nil, ErrNotSupported }

func (r *Region) Name() string  { return "" }
func (r *Region) Bytes() []byte { return nil }
func (r *Region) Len() int      { return 0 }
func (r *Region) Unlink() error { return ErrNotSupported }
func (r *Region) Close() error  { return nil }
