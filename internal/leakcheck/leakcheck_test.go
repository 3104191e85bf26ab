package leakcheck

import (
	"strings"
	"testing"
	"time"
)

func parkedHere(stop chan struct{}) { <-stop }

func TestWaitFindsAndForgetsAGoroutine(t *testing.T) {
	before := map[string]bool{}
	for _, g := range goroutines(nil) {
		before[g.id] = true
	}
	stop := make(chan struct{})
	go parkedHere(stop)
	left := Wait(50*time.Millisecond, before)
	if len(left) != 1 || !strings.Contains(left[0], "leakcheck.parkedHere") {
		t.Fatalf("want the parked goroutine, got %q", left)
	}
	if left := Wait(50*time.Millisecond, before, "leakcheck.parkedHere"); len(left) != 0 {
		t.Fatalf("an ignored stack was listed: %q", left)
	}
	close(stop)
	if left := Wait(5*time.Second, before); len(left) != 0 {
		t.Fatalf("an ended goroutine was listed: %q", left)
	}
}
