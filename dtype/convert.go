package dtype

import "math"

// Conversions between float32 and the narrow float formats. Narrowing
// rounds to nearest, ties to even. NaN handling mirrors the x86 F16C
// instructions (the payload's top bits are kept and the result is quiet) so
// that gccl's generic and SIMD reduction kernels, which use these, agree bit
// for bit.

// Float returns the value as a float32 (exactly). A signalling NaN comes
// back quiet, as VCVTPH2PS does.
func (h Float16Bits) Float() float32 { return f16ToF32(uint16(h)) }

// Float returns the value as a float32 (exactly).
func (h BFloat16Bits) Float() float32 { return bf16ToF32(uint16(h)) }

// Float returns the value as a float32 (exactly).
func (h Float8E4M3Bits) Float() float32 { return e4m3ToF32(uint8(h)) }

// Float returns the value as a float32 (exactly).
func (h Float8E5M2Bits) Float() float32 { return e5m2ToF32(uint8(h)) }

// ToFloat16 rounds f to the nearest float16 (overflow gives an infinity).
func ToFloat16(f float32) Float16Bits { return Float16Bits(f32ToF16(f)) }

// ToBFloat16 rounds f to the nearest bfloat16.
func ToBFloat16(f float32) BFloat16Bits { return BFloat16Bits(f32ToBF16(f)) }

// ToFloat8E4M3 rounds f to the nearest E4M3 value (NaN when out of range).
func ToFloat8E4M3(f float32) Float8E4M3Bits { return Float8E4M3Bits(f32ToE4M3(f)) }

// ToFloat8E5M2 rounds f to the nearest E5M2 value (infinity when out of range).
func ToFloat8E5M2(f float32) Float8E5M2Bits { return Float8E5M2Bits(f32ToE5M2(f)) }

// Conversions between float32 and the narrow float formats. Narrowing
// rounds to nearest, ties to even. NaN handling mirrors the x86 F16C
// instructions (the payload's top bits are kept and the result is quiet) so
// that the generic and SIMD kernels agree bit for bit.

// f16ToF32 widens an IEEE binary16 value to float32 exactly. A signalling
// NaN comes back quiet, as VCVTPH2PS does.
func f16ToF32(h uint16) float32 {
	if f, ok := widenF16Normal(h); ok {
		return f
	}
	return f16ToF32Special(h)
}

// widenF16Normal widens h and reports whether h was a normal number, the
// only case in which the result is right: then the fields just move and the
// exponent is rebiased. It is small enough to inline into the generic loops.
func widenF16Normal(h uint16) (float32, bool) {
	e := h & 0x7c00
	return math.Float32frombits(uint32(h&0x8000)<<16 | (uint32(h&0x7fff)<<13 + (127-15)<<23)), e != 0 && e != 0x7c00
}

// f16ToF32Special widens zeros, subnormals, infinities and NaNs.
func f16ToF32Special(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	mant := uint32(h & 0x3ff)
	if h&0x7c00 != 0 { // Inf or NaN
		if mant == 0 {
			return math.Float32frombits(sign | 0x7f800000)
		}
		return math.Float32frombits(sign | 0x7fc00000 | mant<<13)
	}
	// Zero or subnormal: mant * 2^-24, exact in float32.
	f := float32(mant) * 0x1p-24
	if sign != 0 {
		f = -f
	}
	return f
}

// f32ToF16 rounds a float32 to IEEE binary16, to nearest even. Overflow gives
// an infinity, infinities stay infinite and a NaN stays a (quiet) NaN.
func f32ToF16(f float32) uint16 {
	if h, ok := narrowF16Normal(f); ok {
		return h
	}
	x := math.Float32bits(f)
	return uint16(x>>16)&0x8000 | f32ToF16Special(x&0x7fffffff)
}

// narrowF16Normal rounds f to binary16 and reports whether the result is a
// normal number (2^-14 <= |f| < 65520, the overflow threshold), the only
// case it handles. It is small enough to inline into the generic loops.
func narrowF16Normal(f float32) (uint16, bool) {
	x := math.Float32bits(f)
	sign := uint16(x>>16) & 0x8000
	x &= 0x7fffffff
	ok := x-0x38800000 < 0x477ff000-0x38800000
	x += 0xfff + (x>>13)&1
	return sign | uint16((x-(127-15)<<23)>>13), ok
}

// f32ToF16Special narrows the magnitude x when the result is not a normal
// binary16: NaN, overflow, subnormal or zero.
func f32ToF16Special(x uint32) uint16 {
	switch {
	case x > 0x7f800000: // NaN
		return 0x7e00 | uint16(x>>13)&0x3ff
	case x >= 0x477ff000: // >= 65520 = max + half an ulp, so it rounds up to Inf
		return 0x7c00
	}
	return uint16(narrowMagnitude(x, 10, 15))
}

// bf16ToF32 widens a bfloat16 value to float32 exactly.
func bf16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// f32ToBF16 rounds a float32 to bfloat16, to nearest even. A NaN stays a
// NaN (made quiet, since dropping the low payload bits could otherwise turn
// it into an infinity).
func f32ToBF16(f float32) uint16 {
	x := math.Float32bits(f)
	if x&0x7fffffff > 0x7f800000 {
		return uint16(x>>16) | 0x0040
	}
	x += 0x7fff + (x>>16)&1
	return uint16(x >> 16)
}

// e4m3ToF32 widens an OCP FP8 E4M3FN value to float32 exactly.
func e4m3ToF32(b uint8) float32 { return e4m3Table[b] }

// e4m3Table holds all 256 E4M3 values.
var e4m3Table = func() (t [256]float32) {
	for i := range t {
		t[i] = e4m3ToF32Slow(uint8(i))
	}
	return t
}()

func e4m3ToF32Slow(b uint8) float32 {
	sign := uint32(b&0x80) << 24
	exp := uint32(b>>3) & 0xf
	mant := uint32(b & 7)
	switch {
	case exp == 0xf && mant == 7:
		return math.Float32frombits(sign | 0x7fc00000)
	case exp == 0:
		f := float32(mant) * 0x1p-9
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+127-7)<<23 | mant<<20)
}

// f32ToE4M3 rounds a float32 to OCP FP8 E4M3FN, to nearest even. The format
// has no infinity: values whose rounded magnitude exceeds 448, infinities and
// NaNs all become NaN (0x7f with the sign).
func f32ToE4M3(f float32) uint8 {
	x := math.Float32bits(f)
	sign := uint8(x>>24) & 0x80
	x &= 0x7fffffff
	// 464 is the midpoint between 448 and the (NaN) encoding above it; it
	// ties to even, which is 448, so only values above it overflow.
	if x > 0x43e80000 {
		return sign | 0x7f
	}
	return sign | uint8(narrowMagnitude(x, 3, 7))
}

// e5m2ToF32 widens an OCP FP8 E5M2 value to float32 exactly. E5M2 is the top
// byte of a binary16.
func e5m2ToF32(b uint8) float32 { return f16ToF32(uint16(b) << 8) }

// f32ToE5M2 rounds a float32 to OCP FP8 E5M2, to nearest even; overflow gives
// an infinity and a NaN stays a (quiet) NaN.
func f32ToE5M2(f float32) uint8 {
	x := math.Float32bits(f)
	sign := uint8(x>>24) & 0x80
	x &= 0x7fffffff
	switch {
	case x > 0x7f800000:
		return sign | 0x7e | uint8(x>>21)&3
	case x >= 0x47700000: // >= 61440 = max 57344 + half an ulp
		return sign | 0x7c
	}
	return sign | uint8(narrowMagnitude(x, 2, 15))
}

// narrowMagnitude rounds the non-negative, finite float32 bit pattern x to a
// binary format with mantBits fraction bits and the given exponent bias,
// ties to even, and returns the encoded magnitude. The caller has already
// handled values that overflow the target.
func narrowMagnitude(x uint32, mantBits, bias uint32) uint32 {
	shift := 23 - mantBits
	minNormal := 127 - bias + 1 // float32 biased exponent of the target's smallest normal
	exp := x >> 23
	if exp >= minNormal {
		x += 1<<(shift-1) - 1 + (x>>shift)&1
		return (x - (127-bias)<<23) >> shift
	}
	// Subnormal in the target: count units of its smallest subnormal.
	s := shift + minNormal - exp
	if s > 24 {
		return 0 // below half the smallest subnormal
	}
	m := x&0x7fffff | 0x800000 // float32 subnormals returned above, so the implicit bit is set
	r := m >> s
	rem := m & (1<<s - 1)
	half := uint32(1) << (s - 1)
	if rem > half || rem == half && r&1 == 1 {
		r++
	}
	return r
}
