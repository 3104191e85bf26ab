//go:build unix

package main

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// monotonicNow reads CLOCK_MONOTONIC: one clock for every process of the
// host which, unlike the wall clock, is never set (a CI VM's wall clock was
// stepped by 5.8 s while tests ran).
func monotonicNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		fmt.Fprintf(os.Stderr, "soakrank: %v\n", err)
		os.Exit(1)
	}
	return ts.Nano()
}
