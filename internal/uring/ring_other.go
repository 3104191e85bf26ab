//go:build !linux

package uring

import "time"

// Ring is unavailable off Linux; New always fails.
type Ring struct{}

// Available says why io_uring cannot be used: it is Linux's.
func Available() error { return ErrNotSupported }

// New fails off Linux.
func New(entries uint32) (*Ring, error) { return nil, ErrNotSupported }

func (r *Ring) Close() error                                            { return nil }
func (r *Ring) Entries() int                                            { return 0 }
func (r *Ring) Space() int                                              { return 0 }
func (r *Ring) PrepRead(fd int, buf []byte, off int64, ud uint64) bool  { return false }
func (r *Ring) PrepWrite(fd int, buf []byte, off int64, ud uint64) bool { return false }
func (r *Ring) PrepReadFixed(fd int, buf []byte, off int64, index uint16, ud uint64) bool {
	return false
}
func (r *Ring) PrepWriteFixed(fd int, buf []byte, off int64, index uint16, ud uint64) bool {
	return false
}
func (r *Ring) PrepCancelAll(ud uint64) bool                        { return false }
func (r *Ring) Submit(wait int, timeout time.Duration) (int, error) { return 0, ErrNotSupported }
func (r *Ring) Completion() (CQE, bool)                             { return CQE{}, false }
func (r *Ring) RegisterBuffers(bufs [][]byte) error                 { return ErrNotSupported }
func (r *Ring) UnregisterBuffers() error                            { return ErrNotSupported }
