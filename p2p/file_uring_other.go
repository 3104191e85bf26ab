//go:build !linux

package p2p

import "github.com/gccl/gccl/internal/uring"

// uringFiles is Linux's; elsewhere the goroutine pool runs file I/O.
type uringFiles struct{}

func newURingFiles(depth, block int) (*uringFiles, error) { return nil, uring.ErrNotSupported }

func (e *uringFiles) run(h *fileHandle, write bool, mems [][]byte, offs []int64, st *stopper) (bool, error) {
	return false, nil
}

func (e *uringFiles) close() {}
