package p2p

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// TestCopyStopsBetweenBlocks: a stopper whose deadline has passed stops a
// copy after its first block (copyMin bytes or the pieces making that up),
// not before; one that never fires lets all of it through.
func TestCopyStopsBetweenBlocks(t *testing.T) {
	const k = 1 << 10
	lens := []int{512 * k, 768 * k, 2048 * k}
	pieces := func() (dst, src [][]byte) {
		for _, n := range lens {
			dst, src = append(dst, make([]byte, n)), append(src, bytes.Repeat([]byte{1}, n))
		}
		return dst, src
	}
	copied := func(dst [][]byte) int {
		n := 0
		for _, d := range dst {
			n += bytes.Count(d, []byte{1})
		}
		return n
	}
	var late stopper
	late.deadline.Store(monoNow() - 1)
	dst, src := pieces()
	copyPieces(dst, src, &late)
	if n := copied(dst); n != 1280*k || late.why.Load() != stopTimeout {
		t.Fatalf("past the deadline: %d bytes copied (want the first 1280 KiB), why %d", n, late.why.Load())
	}
	dst, src = pieces()
	copyPieces(dst, src, nil)
	if n := copied(dst); n != 3328*k {
		t.Fatalf("without a stopper: %d bytes copied", n)
	}
	// The pool: each share stops after its first block.
	p := newCopyPool(2)
	defer p.close()
	late.why.Store(0)
	dst, src = pieces()
	p.copyAll(dst, src, 3328*k, &late)
	if n := copied(dst); n == 0 || n > 4*copyMin {
		t.Fatalf("pool past the deadline: %d bytes copied", n)
	}
	// Closing stops it too, with ErrClosed.
	closing := make(chan struct{})
	close(closing)
	r := &Request{a: &Agent{}, stop: stopper{closing: closing}}
	r.stop.deadline.Store(monoNow() + int64(time.Hour))
	dst, src = pieces()
	copyPieces(dst, src, &r.stop)
	if err := r.halted(); !errors.Is(err, ErrClosed) || copied(dst) != 1280*k {
		t.Fatalf("closing: %v after %d bytes", err, copied(dst))
	}
}
