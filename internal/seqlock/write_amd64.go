//go:build !race

package seqlock

import "sync/atomic"

// write is Write in plain moves (write_amd64.s).
//
//go:noescape
func write(s *Slot, even uint64, w *[Words]uint64, count *atomic.Uint64, c uint64)
