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
// on another core; then about 80 µs of yielding to the process's other
// goroutines costs little; only then does the waiter sleep, paying the tens
// of microseconds a wake-up costs on a VM. More ranks than cores take the
// crowded budget below.
const (
	// PauseRounds is how many pause bursts a waiter spins before yielding.
	PauseRounds = 100
	// YieldRounds is how many times it then yields before sleeping.
	YieldRounds   = 500
	pausePerRound = 1
)

// Where ranks outnumber cores (OSYield), the peer a waiter waits for is
// often on the waiter's own core, and cannot run while the waiter spins;
// and each round's poll costs a system call over TCP. There a waiter spins
// only briefly, for a peer on the other core, yields a few rounds, and
// then sleeps, giving the core away. Measured with 3, 4 and 8 processes on
// 2 vCPUs (docs/PERFORMANCE.md, "Against Open MPI"): 8 B all-reduce over
// TCP 136-144 -> 35-45 µs, 240-290 -> 48-80 µs, 967-987 -> 295-298 µs;
// over shared memory no slower (4 ranks 7.7-14.8 -> 4.2-7.6 µs).
const (
	CrowdedPauseRounds = 10
	CrowdedYieldRounds = 50
)

// CrowdedCostlyPauseRounds replaces CrowdedPauseRounds where each check is
// a system call (CostlyPoll): a read that finds a TCP socket empty costs a
// microsecond or two of the core the peer is likely waiting for, so a
// crowded waiter checks twice, for a reply already on its way from the
// other core, and then yields. 4 processes on 2 vCPUs over TCP loopback,
// all-reduce 64 B-4 KiB: 84-93 -> 59-68 µs per call (docs/PERFORMANCE.md,
// "The crowded waiter's polls").
const CrowdedCostlyPauseRounds = 2

// osYieldFn is osYield; a test counts yields through it.
var osYieldFn = osYield

// Backoff is the state of one wait; the zero value starts spinning.
type Backoff struct {
	n int
	// OSYield makes the yield phase give the core to other processes
	// (sched_yield), not only to other goroutines: peers that are processes
	// sharing this core cannot run while this thread spins in the Go
	// scheduler.
	OSYield bool
	// CostlyPoll says each check the caller makes between rounds is a
	// system call (a network transport's read), not a memory load: a
	// crowded waiter then spins CrowdedCostlyPauseRounds.
	CostlyPoll bool
}

// Reset starts the next wait from the beginning.
func (b *Backoff) Reset() { b.n = 0 }

// Spin waits a little and reports false once the caller should sleep instead.
func (b *Backoff) Spin() bool {
	b.n++
	if b.OSYield {
		pause := CrowdedPauseRounds
		if b.CostlyPoll {
			pause = CrowdedCostlyPauseRounds
		}
		switch {
		case b.n <= pause:
			Pause(pausePerRound)
			return true
		case b.n <= pause+CrowdedYieldRounds:
			osYieldFn()
			return true
		}
		return false
	}
	switch {
	case b.n <= PauseRounds:
		Pause(pausePerRound)
		return true
	case b.n <= PauseRounds+YieldRounds:
		runtime.Gosched()
		return true
	}
	return false
}
