//go:build linux

package comm

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
)

// countingStreamBuf is a fakeDevBuf bound to a stream that counts the
// holds taken on it.
type countingStreamBuf struct {
	*fakeDevBuf
	holds atomic.Int32
}

func (b *countingStreamBuf) Stream() uintptr { return 1 }
func (b *countingStreamBuf) HoldStream() (StreamHold, error) {
	b.holds.Add(1)
	return nopHold{}, nil
}

type nopHold struct{}

func (nopHold) Ready() error { return nil }
func (nopHold) Release()     {}

// A call mixing stream-bound and unbound device buffers is refused before
// it holds any stream: a hold, even one released at once, makes whatever
// synchronizes the device meanwhile (another rank's free) wait for it.
func TestMixedStreamBuffersHoldNothing(t *testing.T) {
	const n = 2
	bound := make([]*countingStreamBuf, n)
	unbound := make([]*fakeDevBuf, n)
	for r := range n {
		bound[r] = &countingStreamBuf{fakeDevBuf: newFakeDevBuf(t, 16, &fakeEngine{name: "fake"})}
		unbound[r] = newFakeDevBuf(t, 16, &fakeEngine{name: "fake"})
	}
	errs := runFakeRanks(t, n, func(c *Comm) error {
		r := c.Rank()
		err := c.AllReduce(context.Background(), bound[r], unbound[r], Sum)
		if !errors.Is(err, ErrInvalidArgument) {
			return err
		}
		// Bound buffers alone are held once, on their one stream.
		return c.AllReduce(context.Background(), bound[r], bound[r], Sum)
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
		if got := bound[r].holds.Load(); got != 1 {
			t.Errorf("rank %d: %d holds taken, want 1 (none for the refused call)", r, got)
		}
	}
}
