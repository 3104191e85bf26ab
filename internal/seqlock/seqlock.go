// Package seqlock publishes records of a few words from one writer to
// readers on other goroutines, without a lock: a sequence lock per slot.
// The writer owns the slot; readers copy it and retry when the writer was
// there meanwhile.
//
// Readers load every word atomically. On amd64 (outside race builds) the
// writer stores with plain moves: x86 makes stores visible in program order
// and Go's atomic loads are plain moves there, so the sequence lock holds
// without the locked instruction each atomic store costs (about 5 ns each,
// seven per record).
package seqlock

import "sync/atomic"

// Words is the number of data words of a Slot.
const Words = 5

// Slot is one record. Its sequence is odd while the writer writes it and
// even once it is there; the writer chooses the even values, increasing.
type Slot struct {
	seq atomic.Uint64
	w   [Words]atomic.Uint64
}

// Write publishes w as the slot's record with sequence even, then, unless
// count is nil, stores c into *count (a count of records readers use to
// find the newest: stored after the record, so a reader that sees c finds
// the record there). One goroutine writes a slot and its count.
func (s *Slot) Write(even uint64, w *[Words]uint64, count *atomic.Uint64, c uint64) {
	write(s, even, w, count, c)
}

// Seq is the slot's sequence now.
func (s *Slot) Seq() uint64 { return s.seq.Load() }

// Read copies the slot's record into w and returns its sequence; ok is
// false when the writer was writing it (the sequence is odd) or changed it
// while it was read, and then w is not a record.
func (s *Slot) Read(w *[Words]uint64) (seq uint64, ok bool) {
	seq = s.seq.Load()
	if seq&1 != 0 {
		return seq, false
	}
	for i := range w {
		w[i] = s.w[i].Load()
	}
	return seq, s.seq.Load() == seq
}

// writeAtomic is Write with atomic stores: the form for architectures
// whose plain stores may be reordered, and for race builds, where the
// detector must see the writes.
func writeAtomic(s *Slot, even uint64, w *[Words]uint64, count *atomic.Uint64, c uint64) {
	s.seq.Store(even - 1)
	for i := range w {
		s.w[i].Store(w[i])
	}
	s.seq.Store(even)
	if count != nil {
		count.Store(c)
	}
}
