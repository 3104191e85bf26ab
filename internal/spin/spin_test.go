package spin

import (
	"testing"
	"time"
)

func TestBackoffEndsSpinning(t *testing.T) {
	var b Backoff
	n := 0
	for b.Spin() {
		n++
		if n > 10*(PauseRounds+YieldRounds) {
			t.Fatal("backoff never tells the caller to sleep")
		}
	}
	if n != PauseRounds+YieldRounds {
		t.Fatalf("spun %d rounds, want %d", n, PauseRounds+YieldRounds)
	}
	b.Reset()
	if !b.Spin() {
		t.Fatal("Reset did not restart spinning")
	}
}

// TestCrowdedBackoffSleepsSooner: with OSYield (more ranks than cores) the
// waiter gives up its core after the shorter crowded budget.
func TestCrowdedBackoffSleepsSooner(t *testing.T) {
	b := Backoff{OSYield: true}
	n := 0
	for b.Spin() {
		n++
		if n > PauseRounds+YieldRounds {
			t.Fatal("crowded backoff spins as long as the uncrowded one")
		}
	}
	if n != CrowdedPauseRounds+CrowdedYieldRounds {
		t.Fatalf("spun %d rounds, want %d", n, CrowdedPauseRounds+CrowdedYieldRounds)
	}
}

// TestCrowdedCostlyPollYieldsSooner: where each check is a system call, a
// crowded waiter spins CrowdedCostlyPauseRounds before it yields (counted
// with a stubbed yield), and yields as long as the crowded budget says.
func TestCrowdedCostlyPollYieldsSooner(t *testing.T) {
	yields := 0
	defer func(f func()) { osYieldFn = f }(osYieldFn)
	osYieldFn = func() { yields++ }
	for _, tc := range []struct {
		costly      bool
		pause, rest int
	}{{false, CrowdedPauseRounds, CrowdedYieldRounds}, {true, CrowdedCostlyPauseRounds, CrowdedYieldRounds}} {
		b := Backoff{OSYield: true, CostlyPoll: tc.costly}
		yields = 0
		n, firstYield := 0, -1
		for b.Spin() {
			n++
			if firstYield < 0 && yields > 0 {
				firstYield = n
			}
			if n > PauseRounds+YieldRounds {
				t.Fatal("crowded backoff never tells the caller to sleep")
			}
		}
		if firstYield != tc.pause+1 || yields != tc.rest {
			t.Errorf("CostlyPoll=%v: first yield in round %d after %d pauses, %d yields; want round %d, %d yields",
				tc.costly, firstYield, tc.pause, yields, tc.pause+1, tc.rest)
		}
	}
	if CrowdedCostlyPauseRounds >= CrowdedPauseRounds {
		t.Errorf("CrowdedCostlyPauseRounds = %d, not below CrowdedPauseRounds = %d", CrowdedCostlyPauseRounds, CrowdedPauseRounds)
	}
}

func TestPauseAllocatesNothing(t *testing.T) {
	if a := testing.AllocsPerRun(100, func() { Pause(10) }); a != 0 {
		t.Fatalf("Pause allocates %v", a)
	}
}

// Pause returns for counts of zero or less at once (an assembly loop that
// decremented first would run for 2^64 rounds), and for a few thousand soon.
func TestPauseReturns(t *testing.T) {
	for _, n := range []int{-1, 0, 1, 5000} {
		done := make(chan struct{})
		go func() { Pause(n); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("Pause(%d) did not return", n)
		}
	}
}
