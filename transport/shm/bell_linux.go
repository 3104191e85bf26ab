package shm

import (
	"context"
	"math"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gccl/gccl/transport"
)

// Futex operations, without FUTEX_PRIVATE_FLAG: waiter and wakers are in
// different processes, which share the word through the file, not through
// one address space.
const (
	futexWaitOp = 0
	futexWakeOp = 1
)

// bell is a rank's transport.Bell over the futex word in its mailbox header.
// Peers in other processes ring it through their mapping of the mailbox;
// goroutines of this process (TCP readers, say) ring it with Ring. Only the
// rank's owner goroutine waits on it.
type bell struct {
	mb     *Mailbox // keeps the segment mapped; the endpoint, once connected
	hdr    *header
	closed atomic.Bool
}

var _ transport.Bell = (*bell)(nil)

// Seq returns the current value of the futex word.
func (b *bell) Seq() uint64 { return uint64(atomic.LoadUint32(&b.hdr.bell)) }

// Ring records a state change and wakes the owner if it sleeps. It costs one
// atomic add and one load unless the owner sleeps.
func (b *bell) Ring() { ring(b.hdr) }

// Close wakes every present and future Wait with transport.ErrClosed.
func (b *bell) Close() {
	if !b.closed.Swap(true) {
		ring(b.hdr)
	}
}

// Wait sleeps until Seq differs from seen, a connection of the rank's shared
// memory endpoint changes state, a peer process is found dead, ctx ends, the
// deadline passes (transport.ErrTimeout) or the bell is closed
// (transport.ErrClosed). It sleeps in slices of at most 5 ms, so
// cancellation, the deadline and peer liveness are noticed within a slice.
func (b *bell) Wait(ctx context.Context, seen uint64, deadline time.Time) error {
	if b.closed.Load() {
		return transport.ErrClosed
	}
	// Announce the sleeper before looking at anything. Peers publish a
	// message (a sequentially consistent store of a ring counter) before
	// they read sleepers; this rank bumps sleepers before it re-reads the
	// counters (Endpoint.poll). So either the peer sees a sleeper and rings,
	// or this rank sees the new counter and returns: no lost wake-up, even
	// though peers skip ringing when nobody sleeps.
	atomic.AddUint32(&b.hdr.sleepers, 1)
	defer atomic.AddUint32(&b.hdr.sleepers, math.MaxUint32) // -1
	ep := b.mb.ep.Load()
	for {
		if b.closed.Load() {
			return transport.ErrClosed
		}
		if atomic.LoadUint32(&b.hdr.bell) != uint32(seen) {
			return nil
		}
		if ep != nil && ep.poll() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		slice := waitSlice
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return transport.ErrTimeout
			}
			slice = min(slice, left)
		}
		futexWait(&b.hdr.bell, uint32(seen), slice)
	}
}

// ring bumps a bell word and wakes its owner if it sleeps. Public rings
// always bump the word, because Seq is all a waiter on a shared bell (a Mux
// with TCP routes) can compare.
func ring(h *header) {
	atomic.AddUint32(&h.bell, 1)
	if atomic.LoadUint32(&h.sleepers) != 0 {
		futexWake(&h.bell)
	}
}

// notify is a peer's ring after a commit or release: nothing at all unless
// the owner sleeps (see bell.Wait for why that is safe). The caller's
// preceding sequentially consistent store orders the load of sleepers after
// the publication.
func notify(h *header) {
	if atomic.LoadUint32(&h.sleepers) != 0 {
		ring(h)
	}
}

func futexWait(addr *uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	// EAGAIN (the word changed), ETIMEDOUT and EINTR all mean: look again.
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitOp, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
}

func futexWake(addr *uint32) {
	// Waking never blocks: skip the scheduler hand-off of Syscall.
	unix.RawSyscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWakeOp, math.MaxInt32, 0, 0, 0)
}
