//go:build !linux

package cma

import "unsafe"

type reader struct{}

func (*reader) read(int, []byte, uintptr) error { return ErrNotSupported }

func nativeWord(b [8]byte) uint64 { return *(*uint64)(unsafe.Pointer(&b[0])) }

// Supported: the system call exists on this kernel (a sandbox may still
// refuse it for some processes: see Refused).
const Supported = false
