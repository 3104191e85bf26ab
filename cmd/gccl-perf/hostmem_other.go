//go:build !linux && !darwin

package main

// physicalMemory is 0, unknown, where gccl-perf has no way to ask: buffer
// sizes then go unchecked.
func physicalMemory() uint64 { return 0 }
