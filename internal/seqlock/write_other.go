//go:build !amd64 || race

package seqlock

import "sync/atomic"

func write(s *Slot, even uint64, w *[Words]uint64, count *atomic.Uint64, c uint64) {
	writeAtomic(s, even, w, count, c)
}
