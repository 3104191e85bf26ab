package clock

import (
	"testing"
	"time"

	"github.com/gccl/gccl/internal/seqlock"
)

// bracket checks that Now lies between two system-clock readings taken
// around it, give or take slack (the counter's scaling error), and returns
// its distance from their midpoint and their distance apart. A reading
// outside is tried again once, after two re-anchorings: the wall clock
// may have been set just then (a CI VM's was), which Now follows within
// reanchorEvery.
func bracket(t *testing.T, now func() int64, slack int64) (off, width int64) {
	t.Helper()
	for try := 0; ; try++ {
		a := system()
		n := now()
		b := system()
		if n >= a-slack && n <= b+slack {
			return max(n-(a+b)/2, (a+b)/2-n), b - a
		}
		if try > 0 {
			t.Fatalf("Now = %d, outside the system clock's [%d, %d] by %d ns", n, a, b, max(a-n, n-b))
		}
		time.Sleep(2 * reanchorEvery * time.Nanosecond)
	}
}

// TestNowFollowsTheSystemClock: through calibration and several
// re-anchorings, every reading falls between the system clock's readings
// around it.
func TestNowFollowsTheSystemClock(t *testing.T) {
	var worst int64 // from readings bracketed within 200 ns
	end := time.Now().Add(3 * reanchorEvery * time.Nanosecond)
	for time.Now().Before(end) {
		if off, width := bracket(t, Now, 2000); width <= 200 {
			worst = max(worst, off)
		}
		time.Sleep(50 * time.Microsecond)
	}
	if counterUsable && source() != counterName {
		t.Fatalf("source = %q after calibrating, want %q", source(), counterName)
	}
	t.Logf("source %s; farthest from the system clock's midpoint: %d ns", source(), worst)
}

// TestNowAgreesWithTime: Now is time.Now's wall clock in ns. The system
// clock's reading keeps the wall clock's offset until it moved by minStep,
// so time.Now may stray from it by less than that: this guest's wall clock
// drifts from its monotonic one between re-anchorings (60 ns in one CI run).
func TestNowAgreesWithTime(t *testing.T) {
	bracket(t, func() int64 { return time.Now().UnixNano() }, minStep)
	for try := 0; ; try++ {
		a := time.Now().UnixNano()
		n := Now()
		b := time.Now().UnixNano()
		if n >= a-1e6 && n <= b+1e6 {
			return
		}
		if try > 0 {
			t.Fatalf("Now = %d, time.Now %d..%d", n, a, b)
		}
		time.Sleep(2 * reanchorEvery * time.Nanosecond) // as in bracket
	}
}

func TestScale(t *testing.T) {
	for _, c := range []struct {
		d    int64
		mult uint64
		want int64
	}{
		{0, 1 << 32, 0},
		{1000, 1 << 32, 1000},           // 1 ns per tick
		{1000, 1 << 31, 500},            // 2 ticks per ns
		{-1000, 1 << 31, -500},          // a counter behind the anchor
		{3_000_000_000, 1 << 30, 750e6}, // products past 2^64
	} {
		if got := scale(c.d, c.mult); got != c.want {
			t.Errorf("scale(%d, %#x) = %d, want %d", c.d, c.mult, got, c.want)
		}
	}
}

func TestNowAllocatesNothing(t *testing.T) {
	if a := testing.AllocsPerRun(1000, func() { Now() }); a != 0 {
		t.Fatalf("%v allocations per Now", a)
	}
}

func BenchmarkNow(b *testing.B) {
	Now()
	time.Sleep(2 * calibrateAfter * time.Nanosecond) // past calibration
	b.Logf("source %s", source())
	for b.Loop() {
		Now()
	}
}

func BenchmarkSystem(b *testing.B) {
	for b.Loop() {
		system()
	}
}

// TestRateChangeIsCaught: a line whose rate is 10% off (as when a VM moves
// to a host whose counter runs at another rate) is dropped at its next
// re-anchoring, readings come from the system clock until the rate is
// measured again, and then from the counter.
func TestRateChangeIsCaught(t *testing.T) {
	if !counterUsable {
		t.Skip("no usable cycle counter here")
	}
	for source() != counterName {
		time.Sleep(time.Millisecond)
	}
	anchorMu.Lock()
	var w [seqlock.Words]uint64
	seq, _ := line.Read(&w)
	w[wordMult] = w[wordMult] / 10 * 11
	w[wordT0] -= w[wordSpan] // due for re-anchoring
	line.Write(seq+2, &w, nil, 0)
	anchorMu.Unlock()

	bracket(t, Now, 2000)
	if s := source(); s != "system" {
		t.Fatalf("source = %q after the rate changed, want system", s)
	}
	for source() != counterName {
		bracket(t, Now, 2000)
		time.Sleep(100 * time.Microsecond)
	}
	bracket(t, Now, 2000)
}

// TestWallClockStepIsFollowed: when the wall clock is set (here through
// the hook: a test cannot set the real one), Now follows within
// reanchorEvery, on the counter's path and the system clock's alike, and
// a change below minStep is not taken for a step.
func TestWallClockStepIsFollowed(t *testing.T) {
	real := wallNanos
	defer func() { wallNanos = real }()
	setWall := func(by int64) {
		wallNanos = func() int64 { return real() + by }
	}
	// follows waits up to three re-anchorings for Now to agree with the
	// wall clock set by; false if it never did. It also returns how far
	// the real wall clock had moved from the monotonic one then: the
	// host's clock may be slewed or set during the test too (a CI run
	// saw 3 ms), and Now follows that as well.
	follows := func(by int64) (bool, int64) {
		end := time.Now().Add(3 * reanchorEvery * time.Nanosecond)
		for time.Now().Before(end) {
			a := time.Now().UnixNano() + by
			n := Now()
			b := time.Now().UnixNano() + by
			if n >= a-2000 && n <= b+2000 {
				return true, real() - monotonic()
			}
			time.Sleep(time.Millisecond)
		}
		return false, 0
	}
	const step = 5 * int64(time.Second) // as a VM's clock set after boot
	for _, by := range []int64{step, -step, 0} {
		setWall(by)
		ok, drift := follows(by)
		if !ok {
			t.Fatalf("wall clock set by %v: Now = %d, time.Now %d (source %s)",
				time.Duration(by), Now(), time.Now().UnixNano(), source())
		}
		if off := stepped.Load() - by - drift; off > minStep || off < -minStep {
			t.Fatalf("wall clock set by %v (and by %v by the host): stepped = %v",
				time.Duration(by), time.Duration(drift), time.Duration(stepped.Load()))
		}
		// The line, which records time operations on, did not move.
		if a, l, b := monotonic(), Line(), monotonic(); l < a-2000 || l > b+2000 {
			t.Fatalf("wall clock set by %v: Line = %d, outside the monotonic clock's [%d, %d]",
				time.Duration(by), l, a, b)
		}
	}
	// A wobble of the two readings' distance is not a step. The offset is
	// set to the host's clock's just before, so that the host's own drift
	// since the last step does not count.
	stepped.Store(real() - monotonic())
	before := stepped.Load()
	setWall(minStep / 2)
	stepDue.Store(0)
	system()
	if got := stepped.Load(); got != before {
		t.Fatalf("a %v change was taken for a step: stepped %v -> %v",
			time.Duration(minStep/2), time.Duration(before), time.Duration(got))
	}
}
