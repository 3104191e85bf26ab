package spin

import "testing"

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

func TestPauseAllocatesNothing(t *testing.T) {
	if a := testing.AllocsPerRun(100, func() { Pause(10) }); a != 0 {
		t.Fatalf("Pause allocates %v", a)
	}
}

func TestOSYieldBackoffEndsSpinning(t *testing.T) {
	b := Backoff{OSYield: true}
	n := 0
	for b.Spin() {
		n++
	}
	if n != PauseRounds+YieldRounds {
		t.Fatalf("spun %d rounds, want %d", n, PauseRounds+YieldRounds)
	}
}
