package memops

import (
	"sync/atomic"
	"unsafe"
)

// pageSize is the smallest page the kernels gccl runs on map; touching one
// word per pageSize bytes touches every page.
const pageSize = 4096

// touchSink takes the sum of the loads, so that none is dropped.
var touchSink atomic.Uint64

// Prefault makes every page that holds a byte of b ready for use by this
// process now rather than on a hot path: it asks the kernel to map the
// pages (populate, for writing when write is set) and then touches each
// page once, with an atomic add of zero where write is set (a write that
// changes nothing, safe beside other writers) and a load otherwise.
//
// Both steps matter under a hypervisor that tracks a guest's page tables
// itself: there a process's first access to each page of its own traps to
// the hypervisor even after the kernel mapped it. On the 2-vCPU KVM guest
// of docs/PERFORMANCE.md ("First touches"), a page fault costs 7-15 µs, the
// first access to a populated page 6 µs, and the next one 13 ns.
//
// The error is the kernel's answer to populating (before Linux 5.14:
// EINVAL); the pages are touched, and so mapped, either way. A page of a
// file with no page there yet is allocated.
func Prefault(b []byte, write bool) error {
	if len(b) == 0 {
		return nil
	}
	err := populate(b, write)
	base := unsafe.Pointer(unsafe.SliceData(b))
	start := uintptr(base)
	first := (start + 7) &^ 7 // the first aligned word in b, then a word per page
	end := start + uintptr(len(b))
	var sum uint64
	for p := first; p+8 <= end; p = (p &^ (pageSize - 1)) + pageSize {
		w := (*uint64)(unsafe.Add(base, p-start))
		if write {
			atomic.AddUint64(w, 0)
		} else {
			sum += atomic.LoadUint64(w)
		}
	}
	if !write {
		touchSink.Add(sum)
	}
	return err
}
