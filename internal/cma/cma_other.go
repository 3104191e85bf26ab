//go:build !linux

package cma

type reader struct{}

func (*reader) read(int, []byte, uintptr) error  { return ErrNotSupported }
func (*reader) write(int, []byte, uintptr) error { return ErrNotSupported }

// Supported: the system call exists on this kernel (a sandbox may still
// refuse it for some processes: see Refused).
const Supported = false
