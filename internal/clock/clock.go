// Package clock reads the wall clock for per-operation records. Where the
// CPU's cycle counter keeps time (amd64 with an invariant TSC that Linux
// itself uses as its clock source), a reading is the counter scaled onto
// the system clock: about 10 ns on a VM against 28 for the vDSO's
// clock_gettime, and a collective records two. Elsewhere, and until the
// counter's rate is known (the first tens of milliseconds of a process),
// it is the system clock.
//
// A reading is a line, the wall clock at the process's start plus the
// monotonic time since, and the wall clock's offset from it: NTP slews are
// seen at once (they slew both), and a step of the wall clock (an NTP
// step, settimeofday, a VM's clock set after it resumed) within
// reanchorEvery of it, as records are compared across hosts. Durations are
// taken on the line alone (Read, Line), which no step moves. Two readings
// of the cycle counter may differ from the system clock's by the scaling's
// error: well under a microsecond, as each reading's line is re-anchored
// on the system clock every 100 ms.
package clock

import (
	"math"
	"sync/atomic"
	"time"
)

var (
	start     = time.Now()
	startWall = start.UnixNano()
	// stepped is how far the wall clock was set since start: the wall
	// clock minus monotonic(). It is read afresh when stepDue (monotonic
	// ns since start) has passed, or when the counter's line is
	// re-anchored.
	stepped atomic.Int64
	stepDue atomic.Int64
)

// minStep is the least change of the wall clock's offset from the
// monotonic clock taken as a step: the two clocks are read one after the
// other, tens of ns apart, and a step below it is under the precision
// records are compared at across hosts.
const minStep = 100e3 // ns

// wallNanos reads the wall clock (a variable for tests, which cannot set
// the real one).
var wallNanos = func() int64 { return time.Now().UnixNano() }

// Now is the wall clock in nanoseconds since 1970.
func Now() int64 {
	line, off := Read()
	return line + off
}

// Read returns Now in its two parts: a reading of the line, the wall clock
// at the process's start plus the monotonic time since, and the wall
// clock's offset from it (how far it was set since start). Two readings of
// the line are apart by the time between them, whatever the wall clock
// did: records time their operations on it.
func Read() (line, offset int64) {
	if ns, ok := fromCounter(); ok {
		return ns, stepped.Load()
	}
	return readSystem()
}

// Line is Read's first part alone.
func Line() int64 {
	if ns, ok := fromCounter(); ok {
		return ns
	}
	return monotonic()
}

// monotonic is the wall clock at start plus the monotonic time since: the
// scale the counter's line maps onto.
func monotonic() int64 { return startWall + int64(time.Since(start)) }

// readSystem is Read from the system clock alone: one monotonic reading,
// and the wall clock's once per reanchorEvery.
func readSystem() (line, offset int64) {
	since := int64(time.Since(start))
	if since >= stepDue.Load() {
		checkStep()
	}
	return startWall + since, stepped.Load()
}

// system is Now from the system clock alone.
func system() int64 {
	line, off := readSystem()
	return line + off
}

// checkStep re-reads the wall clock's offset from monotonic() and keeps
// it when it moved by minStep or more. The wall clock is read between two
// monotonic readings, the closest of three tries, and set against their
// midpoint: the offset's error is then half their distance.
func checkStep() {
	var off, spread int64 = 0, math.MaxInt64
	var since int64
	for range 3 {
		a := int64(time.Since(start))
		w := wallNanos()
		b := int64(time.Since(start))
		if b-a < spread {
			off, spread, since = w-(startWall+a+(b-a)/2), b-a, b
		}
	}
	if d := off - stepped.Load(); d >= minStep || d <= -minStep {
		stepped.Store(off)
	}
	stepDue.Store(since + reanchorEvery)
}

// source names what Now reads now: "tsc" or "system".
func source() string {
	if _, ok := fromCounter(); ok {
		return counterName
	}
	return "system"
}
