package reduce

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
)

// Scalar reference model used by the tests. It works on element bit patterns
// held in uint64 and computes in float64 or exact integer arithmetic, rounding
// once at the end with roundFormat, which does not share code with the
// package's conversion functions.

// format describes a binary floating-point format for the reference.
type format struct {
	mantBits  int     // stored fraction bits
	expBits   int     // exponent field bits
	emin      int     // exponent of the smallest normal
	maxFinite float64 // largest finite magnitude
	hasInf    bool    // false: overflow gives NaN (E4M3FN)
}

var formats = map[DType]format{
	Float16:    {10, 5, -14, 65504, true},
	BFloat16:   {7, 8, -126, 0x1.fep127, true},
	Float32:    {23, 8, -126, math.MaxFloat32, true},
	Float64:    {52, 11, -1022, math.MaxFloat64, true},
	Float8E4M3: {3, 4, -6, 448, false},
	Float8E5M2: {2, 5, -14, 57344, true},
}

// roundFormat rounds x to the format, to nearest even, with the format's
// overflow rule. It is exact for any float64 x.
func roundFormat(f format, x float64) float64 {
	if x == 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		if math.IsInf(x, 0) && !f.hasInf {
			return math.NaN()
		}
		return x
	}
	_, e := math.Frexp(x) // x = frac * 2^e, frac in [0.5, 1)
	exp := max(e-1, f.emin)
	quantum := math.Ldexp(1, exp-f.mantBits)
	r := math.RoundToEven(x/quantum) * quantum
	if math.Abs(r) > f.maxFinite {
		if !f.hasInf {
			return math.NaN()
		}
		return math.Copysign(math.Inf(1), x)
	}
	return r
}

// decodeFloat returns the value of the element bits v of float type dt,
// computed from the bit fields (not with the package's conversions).
func decodeFloat(dt DType, v uint64) float64 {
	switch dt {
	case Float32:
		return float64(math.Float32frombits(uint32(v)))
	case Float64:
		return math.Float64frombits(v)
	}
	f := formats[dt]
	mant := v & (1<<f.mantBits - 1)
	exp := int(v>>f.mantBits) & (1<<f.expBits - 1)
	neg := v>>(f.mantBits+f.expBits)&1 == 1
	bias := 1 - f.emin
	var x float64
	switch {
	case exp == 1<<f.expBits-1 && f.hasInf:
		if mant != 0 {
			return math.NaN()
		}
		x = math.Inf(1)
	case exp == 1<<f.expBits-1 && mant == 1<<f.mantBits-1: // E4M3FN NaN
		return math.NaN()
	case exp == 0:
		x = math.Ldexp(float64(mant), f.emin-f.mantBits)
	default:
		x = math.Ldexp(float64(mant|1<<f.mantBits), exp-bias-f.mantBits)
	}
	if neg {
		x = -x
	}
	return x
}

// encodeFloat returns the bits of x, which must be representable in dt (or
// NaN, which encodes as the canonical quiet NaN).
func encodeFloat(dt DType, x float64) uint64 {
	switch dt {
	case Float32:
		return uint64(math.Float32bits(float32(x)))
	case Float64:
		return math.Float64bits(x)
	}
	f := formats[dt]
	var sign uint64
	if math.Signbit(x) {
		sign = 1 << (f.mantBits + f.expBits)
	}
	x = math.Abs(x)
	top := uint64(1<<f.expBits - 1)
	switch {
	case math.IsNaN(x):
		return sign | top<<f.mantBits | 1<<f.mantBits - 1
	case math.IsInf(x, 0):
		return sign | top<<f.mantBits
	case x == 0:
		return sign
	}
	_, e := math.Frexp(x)
	exp := e - 1
	if exp < f.emin { // subnormal
		return sign | uint64(math.Ldexp(x, f.mantBits-f.emin))
	}
	mant := uint64(math.Ldexp(x, f.mantBits-exp)) &^ (1 << f.mantBits)
	return sign | uint64(exp+1-f.emin)<<f.mantBits | mant
}

func isNaNBits(dt DType, v uint64) bool { return dt.IsFloat() && math.IsNaN(decodeFloat(dt, v)) }

// refResult is the expected element; anyNaN means "some NaN", skip means
// the result is unspecified (Min/Max with a NaN operand).
type refResult struct {
	bits   uint64
	anyNaN bool
	skip   bool
}

func reference(dt DType, op Op, x, y uint64) refResult {
	if !dt.IsFloat() {
		return refResult{bits: refInt(dt, op, x, y)}
	}
	a, b := decodeFloat(dt, x), decodeFloat(dt, y)
	var r float64
	switch op {
	case Sum:
		// float64 holds the exact sum for every narrow type; for float32 and
		// bfloat16 its 53 bits are >= 2p+2, so rounding it again is the same as
		// rounding the exact sum once.
		r = a + b
	case Prod:
		// Defined as a float32 product (exact for float16 and fp8).
		r = float64(float32(a) * float32(b))
		if dt == Float64 {
			r = a * b
		}
	case Min, Max:
		if math.IsNaN(a) || math.IsNaN(b) {
			return refResult{skip: true}
		}
		switch {
		case a == b && a == 0: // signed zeros: max prefers +0, min prefers -0
			negative := math.Signbit(a) || math.Signbit(b)
			if op == Max {
				negative = math.Signbit(a) && math.Signbit(b)
			}
			if negative {
				return refResult{bits: encodeFloat(dt, math.Copysign(0, -1))}
			}
			return refResult{bits: encodeFloat(dt, 0)}
		case (op == Max) == (a > b):
			return refResult{bits: x}
		default:
			return refResult{bits: y}
		}
	}
	r = roundFormat(formats[dt], r)
	if math.IsNaN(r) {
		return refResult{anyNaN: true}
	}
	return refResult{bits: encodeFloat(dt, r)}
}

func refInt(dt DType, op Op, x, y uint64) uint64 {
	width := uint(dt.Size() * 8)
	mask := uint64(1)<<width - 1
	if width == 64 {
		mask = math.MaxUint64
	}
	signed := dt == Int8 || dt == Int32 || dt == Int64
	less := x < y
	if signed {
		sx := int64(x<<(64-width)) >> (64 - width)
		sy := int64(y<<(64-width)) >> (64 - width)
		less = sx < sy
	}
	switch op {
	case Sum:
		return (x + y) & mask
	case Prod:
		return (x * y) & mask
	case Min:
		if less {
			return x
		}
		return y
	default:
		if less {
			return y
		}
		return x
	}
}

func loadElem(dt DType, p []byte) uint64 {
	switch dt.Size() {
	case 1:
		return uint64(p[0])
	case 2:
		return uint64(binary.NativeEndian.Uint16(p))
	case 4:
		return uint64(binary.NativeEndian.Uint32(p))
	default:
		return binary.NativeEndian.Uint64(p)
	}
}

func storeElem(dt DType, p []byte, v uint64) {
	switch dt.Size() {
	case 1:
		p[0] = uint8(v)
	case 2:
		binary.NativeEndian.PutUint16(p, uint16(v))
	case 4:
		binary.NativeEndian.PutUint32(p, uint32(v))
	default:
		binary.NativeEndian.PutUint64(p, v)
	}
}

// specials are values every float test should meet.
func specials(dt DType) []float64 {
	f := formats[dt]
	tiny := math.Ldexp(1, f.emin-f.mantBits)
	minNormal := math.Ldexp(1, f.emin)
	vals := []float64{0, math.Copysign(0, -1), 1, -1, tiny, -tiny, minNormal, -minNormal,
		f.maxFinite, -f.maxFinite, math.NaN(), 0.5, 3, -2.75}
	if f.hasInf {
		vals = append(vals, math.Inf(1), math.Inf(-1))
	}
	return vals
}

// randElem returns random element bits for dt: mostly uniform bit patterns
// (covering NaN, infinities and subnormals), sometimes special values.
func randElem(dt DType, rng *rand.Rand) uint64 {
	bits := uint(dt.Size() * 8)
	v := rng.Uint64()
	if bits < 64 {
		v &= 1<<bits - 1
	}
	if rng.IntN(8) == 0 {
		if dt.IsFloat() {
			s := specials(dt)
			return encodeFloat(dt, s[rng.IntN(len(s))])
		}
		ints := []uint64{0, 1, math.MaxUint64, 1 << (bits - 1), 1<<(bits-1) - 1}
		v = ints[rng.IntN(len(ints))]
		if bits < 64 {
			v &= 1<<bits - 1
		}
	}
	return v
}

// randPair returns operands that often make rounding interesting: for float
// types, y is frequently within a few binades of x (or cancels it), so sums
// hit ties, carries and cancellation rather than being dominated by one side.
func randPair(dt DType, rng *rand.Rand) (x, y uint64) {
	x, y = randElem(dt, rng), randElem(dt, rng)
	if !dt.IsFloat() || rng.IntN(2) == 0 {
		return x, y
	}
	f := formats[dt]
	signBit := uint64(1) << (f.mantBits + f.expBits)
	exp := int(x>>f.mantBits) & (1<<f.expBits - 1)
	if exp == 1<<f.expBits-1 { // Inf/NaN: keep y random
		return x, y
	}
	switch rng.IntN(3) {
	case 0: // same magnitude, opposite sign, low mantissa bits changed
		y = x ^ signBit ^ uint64(rng.IntN(4))
	default: // a few binades down, random fraction and sign
		ey := max(exp-rng.IntN(f.mantBits+4), 0)
		y = uint64(ey)<<f.mantBits | rng.Uint64()&(1<<f.mantBits-1) | uint64(rng.IntN(2))*signBit
	}
	return x, y
}
