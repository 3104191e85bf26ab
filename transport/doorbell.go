package transport

import (
	"context"
	"sync/atomic"
	"time"
)

// Doorbell is an event count for goroutines of one process: Ring after
// publishing a state change, Seq before checking for one, Wait to sleep until
// the next Ring. Ring costs one atomic add and one load unless someone sleeps.
// Endpoints whose peers are in the same process use it to implement Seq and
// Wait.
type Doorbell struct {
	seq      atomic.Uint64
	sleepers atomic.Int32
	wake     chan struct{}
	closed   chan struct{}
	closeOne atomic.Bool
	timer    *time.Timer // reused across waits; only the owner waits
}

// NewDoorbell returns a doorbell with no sleepers.
func NewDoorbell() *Doorbell {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &Doorbell{wake: make(chan struct{}, 1), closed: make(chan struct{}), timer: t}
}

// Seq returns the number of rings so far.
func (d *Doorbell) Seq() uint64 { return d.seq.Load() }

// Ring records a state change and wakes a sleeper, if any.
func (d *Doorbell) Ring() {
	d.seq.Add(1)
	if d.sleepers.Load() != 0 {
		select {
		case d.wake <- struct{}{}:
		default:
		}
	}
}

// Close wakes every present and future Wait with ErrClosed.
func (d *Doorbell) Close() {
	if d.closeOne.CompareAndSwap(false, true) {
		close(d.closed)
		d.Ring()
	}
}

// Wait sleeps until Seq differs from seen. Only one goroutine (the endpoint's
// owner) may wait at a time.
//
// A second goroutine waiting while one sleeps gets ErrConcurrentWait at
// once: a ring wakes one sleeper, so the other could sleep through the
// event it waits for, for ever.
func (d *Doorbell) Wait(ctx context.Context, seen uint64, deadline time.Time) error {
	defer d.sleepers.Add(-1)
	if d.sleepers.Add(1) > 1 {
		return ErrConcurrentWait
	}
	// The sleeper count is published before Seq is re-read, and Ring bumps
	// Seq before reading the count, so a ring between the caller's check and
	// this point is never lost.
	if d.seq.Load() != seen {
		return nil
	}
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		dt := time.Until(deadline)
		if dt <= 0 {
			return ErrTimeout
		}
		d.timer.Reset(dt)
		defer d.timer.Stop()
		timeout = d.timer.C
	}
	select {
	case <-d.wake:
		return nil
	case <-d.closed:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	case <-timeout:
		return ErrTimeout
	}
}
