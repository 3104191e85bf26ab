package main

import (
	"encoding/binary"
	"math"

	"github.com/gccl/gccl/comm"
)

// Result checking (-c). Each rank fills its input with small non-negative
// integers that depend on the rank and the element index, runs the
// collective once, and compares every output element with the value
// computed here: with wrapping integer arithmetic for integer types (exact),
// and in float64 for floating-point types, where the inputs are chosen so
// that every partial result is exactly representable in the type whatever
// order the library reduces in. Only where that cannot hold (Avg, whose 1/n
// is inexact, and sums over more ranks than the type can count) is a
// relative tolerance allowed, sized by the rounding error of the reduction.

// poisonByte fills outputs before a check pass, so that elements the
// collective fails to write are caught: 0xA5 has the sign bit set in every
// type, and inputs are non-negative integers below 128.
const poisonByte = 0xA5

// checkSpec is the input pattern and acceptance rule for one data type,
// reduction op and rank count.
type checkSpec struct {
	dt       comm.DataType
	op       comm.OpKind // opNone for data-movement tests
	n        int
	maxInput int64   // inputs lie in [0, maxInput]
	tol      float64 // relative tolerance for floating-point results; 0: exact
}

// maxExactInt returns the largest integer m such that every integer in
// [0, m] is exact in floating-point type dt: 2^(significand bits).
func maxExactInt(dt comm.DataType) int64 {
	return 1 << significandBits(dt)
}

// significandBits counts the significand bits of dt, the implicit one
// included.
func significandBits(dt comm.DataType) uint {
	switch dt {
	case comm.Float8E5M2:
		return 3
	case comm.Float8E4M3:
		return 4
	case comm.BFloat16:
		return 8
	case comm.Float16:
		return 11
	case comm.Float32:
		return 24
	}
	return 53 // float64
}

// prodRanks is how many ranks feed a 2 into Prod (the rest feed 1s), so that
// products stay at most 2^7 = 128: exact in every float type (E4M3's largest
// value is 448) and wrapping, as specified, in int8.
const prodRanks = 7

// maxPatternValue caps the inputs of data-movement tests and integer
// reductions: below 128 so that they fit int8 and never equal the poison.
const maxPatternValue = 100

func newCheckSpec(dt comm.DataType, op comm.OpKind, n int) checkSpec {
	s := checkSpec{dt: dt, op: op, n: n, maxInput: maxPatternValue}
	if !dt.IsFloat() {
		// Integer results are exact (wrapping the same way the library
		// does), but an 8-bit sum could wrap onto the poison and hide an
		// unwritten element: keep such sums below it where n allows.
		if dt.Size() == 1 && (op == comm.OpSum || op == comm.OpAvg || op == comm.OpPreMulSum) {
			terms := int64(n)
			if op == comm.OpPreMulSum {
				terms *= 2 // the largest PreMulSum factor
			}
			s.maxInput = max(1, min(maxPatternValue, (poisonByte-1)/terms))
		}
		return s
	}
	exact := maxExactInt(dt)
	unit := math.Ldexp(1, -int(significandBits(dt))) // unit roundoff
	// terms is how many rank inputs a result adds up, scaled by the largest
	// PreMulSum factor.
	terms := int64(0)
	switch op {
	case opNone, comm.OpMin, comm.OpMax:
		// Copies and comparisons are exact for any representable input.
		s.maxInput = min(exact, maxPatternValue)
	case comm.OpProd:
		s.maxInput = 2 // only 1s and 2s, see prodRanks
	case comm.OpSum, comm.OpAvg:
		terms = int64(n)
	case comm.OpPreMulSum:
		terms = 2 * int64(n)
	}
	if terms > 0 {
		// Every partial sum of non-negative integers is at most the total, so
		// a total within the exact range makes every addition exact.
		s.maxInput = max(1, min(exact/terms, maxPatternValue))
		if terms*s.maxInput > exact {
			// Too many ranks for the type to count exactly: each of the n-1
			// additions of non-negative terms rounds by at most one unit
			// roundoff of the running total, itself at most the result.
			s.tol = float64(n) * unit
		}
	}
	if op == comm.OpAvg {
		// Each input is scaled by a rounded 1/n (two roundings) before the
		// n-1 rounded additions.
		s.tol = float64(n+2) * unit
	}
	return s
}

// input is the value rank puts at element i of its send buffer.
func (s *checkSpec) input(rank, i int) int64 {
	if s.op == comm.OpProd {
		if rank < prodRanks && (i>>rank)&1 == 1 {
			return 2
		}
		return 1
	}
	return int64(i*7+rank*13) % (s.maxInput + 1)
}

// encode returns the bits of integer v (exactly representable) in s.dt.
func (s *checkSpec) encode(v int64) uint64 {
	switch s.dt {
	case comm.Float32:
		return uint64(math.Float32bits(float32(v)))
	case comm.Float64:
		return math.Float64bits(float64(v))
	case comm.Float16:
		return uint64(comm.ToFloat16(float32(v)))
	case comm.BFloat16:
		return uint64(comm.ToBFloat16(float32(v)))
	case comm.Float8E4M3:
		return uint64(comm.ToFloat8E4M3(float32(v)))
	case comm.Float8E5M2:
		return uint64(comm.ToFloat8E5M2(float32(v)))
	}
	return uint64(v) & s.mask()
}

// decodeFloat reads floating-point bits of s.dt.
func (s *checkSpec) decodeFloat(bits uint64) float64 {
	switch s.dt {
	case comm.Float32:
		return float64(math.Float32frombits(uint32(bits)))
	case comm.Float64:
		return math.Float64frombits(bits)
	case comm.Float16:
		return float64(comm.Float16Bits(bits).Float())
	case comm.BFloat16:
		return float64(comm.BFloat16Bits(bits).Float())
	case comm.Float8E4M3:
		return float64(comm.Float8E4M3Bits(bits).Float())
	}
	return float64(comm.Float8E5M2Bits(bits).Float())
}

// mask keeps the bits of one element.
func (s *checkSpec) mask() uint64 {
	return math.MaxUint64 >> (64 - 8*uint(s.dt.Size()))
}

func loadBits(b []byte, size int) uint64 {
	switch size {
	case 1:
		return uint64(b[0])
	case 2:
		return uint64(binary.NativeEndian.Uint16(b))
	case 4:
		return uint64(binary.NativeEndian.Uint32(b))
	}
	return binary.NativeEndian.Uint64(b)
}

func storeBits(b []byte, size int, v uint64) {
	switch size {
	case 1:
		b[0] = byte(v)
	case 2:
		binary.NativeEndian.PutUint16(b, uint16(v))
	case 4:
		binary.NativeEndian.PutUint32(b, uint32(v))
	default:
		binary.NativeEndian.PutUint64(b, v)
	}
}

// fillInput writes rank's input pattern into dst, element 0 first.
func (s *checkSpec) fillInput(rank int, dst []byte) {
	size := s.dt.Size()
	for i := range len(dst) / size {
		storeBits(dst[i*size:], size, s.encode(s.input(rank, i)))
	}
}

func poison(dst []byte) {
	for i := range dst {
		dst[i] = poisonByte
	}
}

// countWrong returns how many elements of got, rank's output of collective
// t, differ from what the inputs of every rank imply. block is the layout's
// paramCount.
func (s *checkSpec) countWrong(t *collective, rank, root, block int, got []byte) int64 {
	if t.rootOnlyOutput && rank != root {
		return 0 // the output is defined only at the root
	}
	size := s.dt.Size()
	var wrong int64
	for j := range len(got) / size {
		bits := loadBits(got[j*size:], size)
		src, idx := t.source(rank, s.n, root, block, j)
		var ok bool
		switch {
		case src != allRanks:
			ok = bits == s.encode(s.input(src, idx))
		case s.dt.IsFloat():
			ok = s.floatOK(s.decodeFloat(bits), s.reduceFloat(idx))
		default:
			ok = bits == s.reduceInt(idx)
		}
		if !ok {
			wrong++
		}
	}
	return wrong
}

// reduceInt returns the bits of the reduction of every rank's element idx,
// with the wrap-around of the type's width.
func (s *checkSpec) reduceInt(idx int) uint64 {
	acc := uint64(s.input(0, idx))
	if s.op == comm.OpPreMulSum {
		acc *= uint64(preMulScalar(0))
	}
	for r := 1; r < s.n; r++ {
		v := s.input(r, idx) // small and non-negative: compares the same signed or not
		switch s.op {
		case comm.OpSum, comm.OpAvg:
			acc += uint64(v)
		case comm.OpProd:
			acc *= uint64(v)
		case comm.OpPreMulSum:
			acc += uint64(preMulScalar(r)) * uint64(v)
		case comm.OpMin:
			acc = min(acc, uint64(v))
		case comm.OpMax:
			acc = max(acc, uint64(v))
		}
	}
	acc &= s.mask()
	if s.op == comm.OpAvg {
		// The wrapped sum is divided once, truncating toward zero.
		if signed := s.dt == comm.Int8 || s.dt == comm.Int32 || s.dt == comm.Int64; signed {
			shift := 64 - 8*uint(s.dt.Size())
			acc = uint64((int64(acc<<shift)>>shift)/int64(s.n)) & s.mask()
		} else {
			acc /= uint64(s.n)
		}
	}
	return acc
}

// reduceFloat returns the exact reduction of every rank's element idx.
func (s *checkSpec) reduceFloat(idx int) float64 {
	acc := float64(s.input(0, idx))
	if s.op == comm.OpPreMulSum {
		acc *= preMulScalar(0)
	}
	for r := 1; r < s.n; r++ {
		v := float64(s.input(r, idx))
		switch s.op {
		case comm.OpSum, comm.OpAvg:
			acc += v
		case comm.OpProd:
			acc *= v
		case comm.OpPreMulSum:
			acc += preMulScalar(r) * v
		case comm.OpMin:
			acc = min(acc, v)
		case comm.OpMax:
			acc = max(acc, v)
		}
	}
	if s.op == comm.OpAvg {
		acc /= float64(s.n)
	}
	return acc
}

// floatOK accepts got for the exact result want: equal when the pattern
// makes the result exact, else within the relative tolerance.
func (s *checkSpec) floatOK(got, want float64) bool {
	if s.tol == 0 {
		return got == want
	}
	// The inputs are non-negative, so a correct result is too, however it
	// rounded: this keeps the (negative) poison detectable even where the
	// tolerance is wide.
	return got >= 0 && math.Abs(got-want) <= s.tol*want // false for NaN
}
