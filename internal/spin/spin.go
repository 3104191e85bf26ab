// Package spin is the waiting policy of gccl's hot path: spin briefly with a
// CPU pause hint, then yield the processor, then let the caller sleep. A
// collective's next message usually arrives within a microsecond, so spinning
// avoids the tens of microseconds a sleeping thread costs to wake; bounding
// the spin keeps more ranks than cores working.
package spin

import "runtime"

// The budget, measured on a Sapphire Rapids VM where PAUSE takes ~20 ns and
// runtime.Gosched ~170 ns: about 2 µs of spinning, one PAUSE per check so a
// peer's write is noticed within tens of nanoseconds, catches a peer running
// on another core; then about 80 µs of yielding lets a peer that shares this
// core (more ranks than cores) run, and costs little when there is none;
// only then does the waiter sleep, paying the tens of microseconds a wake-up
// costs on a VM.
const (
	// PauseRounds is how many pause bursts a waiter spins before yielding.
	PauseRounds = 100
	// YieldRounds is how many times it then yields before sleeping.
	YieldRounds   = 500
	pausePerRound = 1
)

// Backoff is the state of one wait; the zero value starts spinning.
type Backoff struct {
	n int
	// OSYield makes the yield phase give the core to other processes
	// (sched_yield), not only to other goroutines: peers that are processes
	// sharing this core cannot run while this thread spins in the Go
	// scheduler.
	OSYield bool
}

// Reset starts the next wait from the beginning.
func (b *Backoff) Reset() { b.n = 0 }

// Spin waits a little and reports false once the caller should sleep instead.
func (b *Backoff) Spin() bool {
	b.n++
	switch {
	case b.n <= PauseRounds:
		Pause(pausePerRound)
		return true
	case b.n <= PauseRounds+YieldRounds:
		if b.OSYield {
			osYield()
		} else {
			runtime.Gosched()
		}
		return true
	}
	return false
}
