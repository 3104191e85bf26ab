// Package commtest holds helpers for tests and checkers of comm's users:
// reading and writing elements of every comm.DataType in raw buffers (for
// device buffers, which tests fill and read as bytes), the expected
// failure of a mismatched collective, and the check that every rank ends
// an all-reduce with the same bits.
package commtest

import (
	"errors"
	"math"
	"testing"
	"unsafe"

	"github.com/gccl/gccl/comm"
)

// Put stores v as element i of b, rounded or converted to dt as the
// conversions of Go (integers: truncated to int64, then wrapped) and comm
// (ToFloat16 and friends) do.
func Put(dt comm.DataType, b []byte, i int, v float64) {
	p := unsafe.Pointer(&b[i*dt.Size()])
	switch dt {
	case comm.Int8:
		*(*int8)(p) = int8(int64(v))
	case comm.Uint8:
		*(*uint8)(p) = uint8(int64(v))
	case comm.Int32:
		*(*int32)(p) = int32(int64(v))
	case comm.Uint32:
		*(*uint32)(p) = uint32(int64(v))
	case comm.Int64:
		*(*int64)(p) = int64(v)
	case comm.Uint64:
		*(*uint64)(p) = uint64(int64(v))
	case comm.Float16:
		*(*comm.Float16Bits)(p) = comm.ToFloat16(float32(v))
	case comm.BFloat16:
		*(*comm.BFloat16Bits)(p) = comm.ToBFloat16(float32(v))
	case comm.Float32:
		*(*float32)(p) = float32(v)
	case comm.Float64:
		*(*float64)(p) = v
	case comm.Float8E4M3:
		*(*comm.Float8E4M3Bits)(p) = comm.ToFloat8E4M3(float32(v))
	case comm.Float8E5M2:
		*(*comm.Float8E5M2Bits)(p) = comm.ToFloat8E5M2(float32(v))
	}
}

// Raw returns element i of an integer-typed b as 64 bits, sign-extended
// for the signed types; for float types it returns 0.
func Raw(dt comm.DataType, b []byte, i int) uint64 {
	p := unsafe.Pointer(&b[i*dt.Size()])
	switch dt {
	case comm.Int8:
		return uint64(int64(*(*int8)(p)))
	case comm.Uint8:
		return uint64(*(*uint8)(p))
	case comm.Int32:
		return uint64(int64(*(*int32)(p)))
	case comm.Uint32:
		return uint64(*(*uint32)(p))
	case comm.Int64, comm.Uint64:
		return *(*uint64)(p)
	}
	return 0
}

// Get returns element i of b as a float64 (64-bit integers beyond 2^53
// lose precision: use Raw for exact integers).
func Get(dt comm.DataType, b []byte, i int) float64 {
	p := unsafe.Pointer(&b[i*dt.Size()])
	switch dt {
	case comm.Int8, comm.Int32, comm.Int64:
		return float64(int64(Raw(dt, b, i)))
	case comm.Uint8, comm.Uint32, comm.Uint64:
		return float64(Raw(dt, b, i))
	case comm.Float16:
		return float64((*(*comm.Float16Bits)(p)).Float())
	case comm.BFloat16:
		return float64((*(*comm.BFloat16Bits)(p)).Float())
	case comm.Float32:
		return float64(*(*float32)(p))
	case comm.Float64:
		return *(*float64)(p)
	case comm.Float8E4M3:
		return float64((*(*comm.Float8E4M3Bits)(p)).Float())
	case comm.Float8E5M2:
		return float64((*(*comm.Float8E5M2Bits)(p)).Float())
	}
	return math.NaN()
}

// WantMismatch checks that a mismatched collective failed every rank: the
// ranks that saw the mismatch with ErrMismatch (at least one), the others,
// whose peer aborted, with ErrMismatch or ErrPeerLost.
func WantMismatch(t testing.TB, errs []error) {
	t.Helper()
	mismatch := false
	for r, err := range errs {
		mismatch = mismatch || errors.Is(err, comm.ErrMismatch)
		if !errors.Is(err, comm.ErrMismatch) && !errors.Is(err, comm.ErrPeerLost) {
			t.Errorf("rank %d: %v, want ErrMismatch or ErrPeerLost", r, err)
		}
	}
	if !mismatch {
		t.Errorf("no rank reported ErrMismatch: %v", errs)
	}
}
