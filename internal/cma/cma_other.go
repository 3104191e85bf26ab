//go:build !linux

package cma

type vectors struct{}

func (*vectors) move(int, []byte, uintptr, bool) error { return ErrNotSupported }

// Supported: the system call exists on this kernel (a sandbox may still
// refuse it for some processes: see Refused).
const Supported = false
