//go:build linux

package comm

import (
	"context"
	"errors"
	"testing"

	"github.com/gccl/gccl/device/devicetest"
)

// A call mixing stream-bound and unbound device buffers is refused before
// it holds any stream: a hold, even one released at once, makes whatever
// synchronizes the device meanwhile (another rank's free) wait for it.
func TestMixedStreamBuffersHoldNothing(t *testing.T) {
	const n = 2
	bound := make([]*devicetest.StreamBuffer, n)
	unbound := make([]*devicetest.Buffer, n)
	for r := range n {
		bound[r] = &devicetest.StreamBuffer{Buffer: newFakeDevBuf(t, 16, fakeEngine()), StreamID: 1}
		unbound[r] = newFakeDevBuf(t, 16, fakeEngine())
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
		if got := bound[r].Holds.Load(); got != 1 {
			t.Errorf("rank %d: %d holds taken, want 1 (none for the refused call)", r, got)
		}
	}
}
