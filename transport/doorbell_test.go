package transport

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestDoorbellWakesItsSleeper: a ring wakes the one sleeper, and a ring
// before the sleep is not lost.
func TestDoorbellWakesItsSleeper(t *testing.T) {
	d := NewDoorbell()
	seen := d.Seq()
	d.Ring()
	if err := d.Wait(context.Background(), seen, time.Now().Add(time.Second)); err != nil {
		t.Fatalf("wait after a ring: %v", err)
	}
	seen = d.Seq()
	woke := make(chan error, 1)
	go func() { woke <- d.Wait(context.Background(), seen, time.Now().Add(10*time.Second)) }()
	for d.sleepers.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	d.Ring()
	if err := <-woke; err != nil {
		t.Fatalf("sleeper: %v", err)
	}
	if err := d.Wait(context.Background(), d.Seq(), time.Now().Add(10*time.Millisecond)); !errors.Is(err, ErrTimeout) {
		t.Fatalf("wait with nothing rung: %v, want ErrTimeout", err)
	}
}

// TestDoorbellRefusesASecondSleeper: two goroutines sleeping on one bell
// could each take the other's wake-up; the second is told so at once.
func TestDoorbellRefusesASecondSleeper(t *testing.T) {
	d := NewDoorbell()
	seen := d.Seq()
	first := make(chan error, 1)
	go func() { first <- d.Wait(context.Background(), seen, time.Now().Add(10*time.Second)) }()
	for d.sleepers.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	if err := d.Wait(context.Background(), seen, time.Now().Add(5*time.Second)); !errors.Is(err, ErrConcurrentWait) {
		t.Fatalf("second sleeper: %v, want ErrConcurrentWait", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("the second sleeper was refused after %v, not at once", took)
	}
	d.Ring()
	if err := <-first; err != nil {
		t.Fatalf("first sleeper: %v", err)
	}
	// The refused wait left no sleeper behind: the next one sleeps.
	if err := d.Wait(context.Background(), d.Seq(), time.Now().Add(10*time.Millisecond)); !errors.Is(err, ErrTimeout) {
		t.Fatalf("wait after the refusal: %v, want ErrTimeout", err)
	}
}
