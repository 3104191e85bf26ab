// Package clock reads the wall clock for per-operation records. Where the
// CPU's cycle counter keeps time (amd64 with an invariant TSC that Linux
// itself uses as its clock source), a reading is the counter scaled onto
// the system clock: about 10 ns on a VM against 28 for the vDSO's
// clock_gettime, and a collective records two. Elsewhere, and until the
// counter's rate is known (the first tens of milliseconds of a process),
// it is the system clock.
//
// Readings are the wall clock at the process's start plus the monotonic
// time since: NTP slews are seen, a step of the wall clock after start is
// not, which matters only across hosts, where records are compared at
// NTP's precision anyway. Two readings of the cycle counter may differ
// from the system clock's by the scaling's error: well under a
// microsecond, as each reading's line is re-anchored on the system clock
// every 100 ms.
package clock

import "time"

var (
	start     = time.Now()
	startWall = start.UnixNano()
)

// Now is the wall clock in nanoseconds since 1970.
func Now() int64 {
	if ns, ok := fromCounter(); ok {
		return ns
	}
	return system()
}

// system is Now from the system clock: one monotonic reading.
func system() int64 { return startWall + int64(time.Since(start)) }

// source names what Now reads now: "tsc" or "system".
func source() string {
	if _, ok := fromCounter(); ok {
		return counterName
	}
	return "system"
}
