//go:build !unix

package main

import "time"

// monotonicNow is the wall clock where CLOCK_MONOTONIC is not to be had
// (the soak, which reads these times, runs on Unix only).
func monotonicNow() int64 { return time.Now().UnixNano() }
