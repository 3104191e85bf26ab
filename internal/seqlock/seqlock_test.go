package seqlock

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"
)

// TestLayout: write_amd64.s stores to fixed offsets.
func TestLayout(t *testing.T) {
	var s Slot
	if off := unsafe.Offsetof(s.w); off != 8 {
		t.Fatalf("words at offset %d, write_amd64.s stores them at 8", off)
	}
	if sz := unsafe.Sizeof(s); sz != 8*(1+Words) {
		t.Fatalf("Slot is %d bytes, want %d", sz, 8*(1+Words))
	}
}

func record(k uint64) [Words]uint64 {
	var w [Words]uint64
	for i := range w {
		w[i] = k*1000 + uint64(i)
	}
	return w
}

func TestWriteThenRead(t *testing.T) {
	var s Slot
	var count atomic.Uint64
	for k := uint64(1); k <= 3; k++ {
		w := record(k)
		s.Write(2*k, &w, &count, k)
		var got [Words]uint64
		seq, ok := s.Read(&got)
		if !ok || seq != 2*k || got != w || count.Load() != k || s.Seq() != 2*k {
			t.Fatalf("record %d: Read = %v, %d, %v; count %d; want %v, %d, true; count %d", k, got, seq, ok, count.Load(), w, 2*k, k)
		}
	}
}

func TestWriteWithoutCount(t *testing.T) {
	var s Slot
	w := record(7)
	s.Write(14, &w, nil, 0)
	var got [Words]uint64
	if seq, ok := s.Read(&got); !ok || seq != 14 || got != w {
		t.Fatalf("Read = %v, %d, %v; want %v, 14, true", got, seq, ok, w)
	}
}

// TestReadersSeeWholeRecords: readers racing one writer never accept a
// record mixed from two writes, and never see the count ahead of the
// record it counts.
func TestReadersSeeWholeRecords(t *testing.T) {
	const writes = 200000
	var s Slot
	var count atomic.Uint64
	var done atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan string, 2)
	// The zero slot (sequence 0, words 0) is not record(0): publish the
	// first record before any reader can look.
	first := record(1)
	s.Write(2, &first, &count, 1)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var got [Words]uint64
			for !done.Load() {
				c := count.Load()
				seq, ok := s.Read(&got)
				if !ok {
					continue
				}
				if k := seq / 2; got != record(k) {
					errs <- fmt.Sprintf("torn record: sequence %d holds %v", seq, got)
					return
				} else if k < c {
					errs <- fmt.Sprintf("stale record: sequence %d after count %d", seq, c)
					return
				}
			}
		}()
	}
	for k := uint64(2); k <= writes; k++ {
		w := record(k)
		s.Write(2*k, &w, &count, k)
	}
	done.Store(true)
	wg.Wait()
	select {
	case e := <-errs:
		t.Fatal(e)
	default:
	}
}

func TestWriteAllocatesNothing(t *testing.T) {
	var s Slot
	var count atomic.Uint64
	w := record(1)
	k := uint64(0)
	if a := testing.AllocsPerRun(100, func() { k++; s.Write(2*k, &w, &count, k) }); a != 0 {
		t.Fatalf("%v allocations per Write", a)
	}
}

// BenchmarkWrite against BenchmarkWriteAtomic is what the plain stores save.
func BenchmarkWrite(b *testing.B) {
	var s Slot
	var count atomic.Uint64
	w := record(1)
	for i := uint64(1); b.Loop(); i++ {
		s.Write(2*i, &w, &count, i)
	}
}

func BenchmarkWriteAtomic(b *testing.B) {
	var s Slot
	var count atomic.Uint64
	w := record(1)
	for i := uint64(1); b.Loop(); i++ {
		writeAtomic(&s, 2*i, &w, &count, i)
	}
}
