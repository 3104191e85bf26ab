package comm

import (
	"unsafe"

	"github.com/gccl/gccl/algo"
)

// validate checks a collective's arguments on this rank. Checks that need
// other ranks' arguments (equal counts, same op) happen as data arrives.
func (c *Comm) validate(cl *call) error {
	if cl.barrier {
		return nil
	}
	if cl.vkind != 0 {
		return c.validateV(cl)
	}
	n, r := c.size, c.rank
	if cl.coll.Rooted() && (cl.root < 0 || cl.root >= n) {
		return invalid("root %d out of range [0,%d)", cl.root, n)
	}
	atRoot := r == cl.root
	// Which buffers this rank uses. One it does not use is dropped, so that
	// nothing (its type included) is taken from it.
	needIn, needOut := true, true
	switch cl.coll {
	case algo.Broadcast, algo.Scatter:
		needIn = atRoot
	case algo.Reduce, algo.Gather:
		needOut = atRoot
	}
	if !needIn {
		cl.in = view{}
	}
	if !needOut {
		cl.out = view{}
	}
	in, out := cl.in, cl.out
	if needIn && !in.ok {
		return invalid("send buffer is nil")
	}
	if needOut && !out.ok {
		return invalid("receive buffer is nil")
	}
	if needIn && needOut && in.dt != out.dt {
		return invalid("send buffer holds %v but receive buffer holds %v", in.dt, out.dt)
	}
	dt := cl.dtype()
	if !dt.Valid() {
		return invalid("unknown data type %v", dt)
	}
	if cl.coll.Reducing() {
		if !cl.op.Valid() {
			return invalid("unknown reduction op %v", cl.op)
		}
	}
	esz := dt.Size()
	ni, no := len(in.b)/esz, len(out.b)/esz
	if len(in.b)%esz != 0 || len(out.b)%esz != 0 {
		return invalid("buffer length is not a multiple of the %v element size", dt)
	}
	switch cl.coll {
	case algo.AllReduce:
		if ni != no {
			return invalid("send has %d elements but receive has %d", ni, no)
		}
		return sameOrDisjoint(in.b, out.b)
	case algo.Broadcast, algo.Reduce:
		if atRoot && ni != no {
			return invalid("at the root, send has %d elements but receive has %d", ni, no)
		}
		if atRoot {
			return sameOrDisjoint(in.b, out.b)
		}
		return nil
	case algo.AllToAll:
		if ni != no {
			return invalid("send has %d elements but receive has %d", ni, no)
		}
		if ni%n != 0 {
			return invalid("%d elements do not split into %d equal blocks", ni, n)
		}
		return sameOrDisjoint(in.b, out.b)
	case algo.ReduceScatter, algo.Scatter:
		// in: n blocks; out: block r of in, or disjoint from it.
		if cl.coll == algo.Scatter && !atRoot {
			return nil
		}
		if ni != n*no {
			return invalid("send has %d elements, want %d ranks x %d receive elements", ni, n, no)
		}
		return ownBlockOrDisjoint(in.b, out.b, r)
	case algo.AllGather, algo.Gather:
		if cl.coll == algo.Gather && !atRoot {
			return nil
		}
		if no != n*ni {
			return invalid("receive has %d elements, want %d ranks x %d send elements", no, n, ni)
		}
		return ownBlockOrDisjoint(out.b, in.b, r)
	}
	return invalid("unknown collective %v", cl.coll)
}

func span(b []byte) (lo, hi uintptr) {
	if len(b) == 0 {
		return 0, 0
	}
	lo = uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return lo, lo + uintptr(len(b))
}

func overlap(a, b []byte) bool {
	alo, ahi := span(a)
	blo, bhi := span(b)
	return alo < bhi && blo < ahi
}

// sameOrDisjoint accepts the same memory (in place) or no overlap at all.
func sameOrDisjoint(a, b []byte) error {
	if len(a) == len(b) && sameMem(a, b) {
		return nil
	}
	if overlap(a, b) {
		return invalid("send and receive buffers overlap without being the same memory")
	}
	return nil
}

// ownBlockOrDisjoint accepts small being exactly block r of big (in place),
// or no overlap at all.
func ownBlockOrDisjoint(big, small []byte, r int) error {
	if len(small) > 0 && sameMem(big[r*len(small):], small) {
		return nil
	}
	if overlap(big, small) {
		return invalid("send and receive buffers overlap, and the smaller one is not this rank's block of the larger")
	}
	return nil
}
