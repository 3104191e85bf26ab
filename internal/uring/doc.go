// Package uring is a minimal io_uring (Linux 5.1+) on raw system calls:
// one Ring is a submission and a completion queue shared with the kernel
// through mmap, with read, write (plain and on registered buffers) and
// cancel entries. It exists so the p2p file backend can hand a batch of
// block I/Os to the kernel in one io_uring_enter and reap their
// completions without a goroutine per I/O, as libaio does for NIXL.
//
// Contracts:
//   - A Ring is owned by one goroutine at a time (no locking inside).
//   - Memory given to Prep* must stay alive and unchanged (a write) or
//     untouched (a read) until its completion is reaped: the kernel uses
//     the address after Prep* returns. Go's heap does not move objects, so
//     a slice of the heap qualifies; a goroutine's stack does not.
//   - Every submitted entry yields exactly one completion, cancelled ones
//     included (res -ECANCELED), so a caller that counts its entries knows
//     when the kernel is done with its memory.
//   - Available reports why io_uring cannot be used here (not Linux,
//     kernel.io_uring_disabled, a seccomp filter, a kernel without it); New
//     then fails with an error matching errs.ErrNotSupported.
package uring

import "github.com/gccl/gccl/internal/errs"

// ErrNotSupported is returned where io_uring cannot be used.
var ErrNotSupported = errs.New(errs.ErrNotSupported, "uring: io_uring not supported")

// CQE is one completion: the UserData of its entry and its result (bytes
// moved, or a negative errno).
type CQE struct {
	UserData uint64
	Res      int32
	Flags    uint32
}
