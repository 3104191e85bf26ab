package clock

import (
	"math"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/gccl/gccl/internal/seqlock"
)

// A line maps counter readings onto monotonic(): ns = ns0 +
// (t - t0) * mult / 2^32, for t until t0 + span. It is published in a
// sequence-locked slot, so that readers take no lock.
const (
	wordT0 = iota
	wordNs0
	wordMult
	wordSpan
)

const (
	// calibrateAfter is the least system time between the first reading
	// and the one the counter's rate is first taken from: the two
	// readings' own error (tens of ns) over it bounds the rate's.
	calibrateAfter = 10e6 // ns
	// reanchorEvery is how long a line serves before it is re-anchored
	// on the system clock.
	reanchorEvery = 100e6 // ns
	// maxDrift is how far the system clock may be from a line's
	// prediction at re-anchoring before the rate is taken afresh: the
	// counter's rate changed (a VM moved to another host).
	maxDrift = 20e3 // ns
	// ticksBeforeCalibrating bounds how often a process's first readings
	// try to calibrate: 10 ms at 10 GHz.
	ticksBeforeCalibrating = 1e8
)

var (
	line     seqlock.Slot
	anchorMu sync.Mutex // one re-anchoring at a time
	// The pair the rate is measured from (written under anchorMu;
	// firstTicks is read before calibration without it).
	firstTicks atomic.Uint64
	firstNs    int64
)

func init() {
	if counterUsable {
		t, ns := pair()
		firstTicks.Store(t)
		firstNs = ns
	}
}

// fromCounter reads the clock through the cycle counter; ok is false where
// no line serves (no usable counter, not calibrated yet, being
// re-anchored by another goroutine).
func fromCounter() (int64, bool) {
	if !counterUsable {
		return 0, false
	}
	ns, ok, due := fromLine()
	if due {
		reanchor()
		ns, ok, _ = fromLine()
	}
	return ns, ok
}

// fromLine reads the clock through the published line; due is true when
// the line has expired, or none is published yet and it is time to
// calibrate.
func fromLine() (ns int64, ok, due bool) {
	var w [seqlock.Words]uint64
	seq, ok := line.Read(&w)
	t := ticks()
	if !ok || seq == 0 {
		return 0, false, seq == 0 && t-firstTicks.Load() >= ticksBeforeCalibrating
	}
	d := int64(t - w[wordT0])
	if d >= int64(w[wordSpan]) {
		return 0, false, true
	}
	return int64(w[wordNs0]) + scale(d, w[wordMult]), true, false
}

// scale is d ticks in ns at mult ns per 2^32 ticks; d may be negative (a
// reading on a core whose counter is a few ticks behind the anchor's).
func scale(d int64, mult uint64) int64 {
	neg := d < 0
	if neg {
		d = -d
	}
	hi, lo := bits.Mul64(uint64(d), mult)
	ns := int64(hi<<32 | lo>>32)
	if neg {
		return -ns
	}
	return ns
}

// pair reads the counter and the system clock together: the best of a
// few tries, with the counter read on both sides of the clock.
func pair() (t uint64, ns int64) {
	spread := uint64(math.MaxUint64)
	for range 5 {
		a := ticks()
		n := monotonic()
		b := ticks()
		if b-a < spread {
			t, ns, spread = a+(b-a)/2, n, b-a
		}
	}
	return t, ns
}

// reanchor publishes a line through a fresh reading of the system clock,
// with the rate measured since the first pair (the longer the span, the
// smaller the rate's error); a reader that finds another goroutine doing
// it reads the system clock meanwhile.
func reanchor() {
	if !anchorMu.TryLock() {
		return
	}
	defer anchorMu.Unlock()
	checkStep()
	var w [seqlock.Words]uint64
	seq, _ := line.Read(&w) // whole: only the lock's holder writes it
	t, ns := pair()
	if seq != 0 {
		d := int64(t - w[wordT0])
		if d < int64(w[wordSpan]) {
			return // another goroutine re-anchored meanwhile
		}
		if drift := ns - (int64(w[wordNs0]) + scale(d, w[wordMult])); drift > maxDrift || drift < -maxDrift {
			// The rate changed: measure it afresh from here, on the
			// system clock until then.
			firstTicks.Store(t)
			firstNs = ns
			line.Write(0, &[seqlock.Words]uint64{}, nil, 0)
			return
		}
	}
	t0 := firstTicks.Load()
	if ns-firstNs < calibrateAfter || t <= t0 {
		return
	}
	nsPerTick := float64(ns-firstNs) / float64(t-t0)
	w = [seqlock.Words]uint64{
		wordT0:   t,
		wordNs0:  uint64(ns),
		wordMult: uint64(nsPerTick * (1 << 32)),
		wordSpan: uint64(reanchorEvery / nsPerTick),
	}
	line.Write(seq+2, &w, nil, 0)
}
