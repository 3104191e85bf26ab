package reduce

import (
	"math"

	"github.com/gccl/gccl/dtype"
)

// Conversions between float32 and the narrow float formats, on raw bits:
// package dtype's, plus the normal-number fast paths the generic loops
// inline (they fall back to the full conversion for everything else).

// F16ToF32 widens an IEEE binary16 value to float32 exactly.
func F16ToF32(h uint16) float32 { return dtype.Float16Bits(h).Float() }

// F32ToF16 rounds a float32 to IEEE binary16, to nearest even.
func F32ToF16(f float32) uint16 { return uint16(dtype.ToFloat16(f)) }

// BF16ToF32 widens a bfloat16 value to float32 exactly.
func BF16ToF32(h uint16) float32 { return dtype.BFloat16Bits(h).Float() }

// F32ToBF16 rounds a float32 to bfloat16, to nearest even.
func F32ToBF16(f float32) uint16 { return uint16(dtype.ToBFloat16(f)) }

// E4M3ToF32 widens an OCP FP8 E4M3FN value to float32 exactly.
func E4M3ToF32(b uint8) float32 { return dtype.Float8E4M3Bits(b).Float() }

// F32ToE4M3 rounds a float32 to OCP FP8 E4M3FN, to nearest even.
func F32ToE4M3(f float32) uint8 { return uint8(dtype.ToFloat8E4M3(f)) }

// E5M2ToF32 widens an OCP FP8 E5M2 value to float32 exactly.
func E5M2ToF32(b uint8) float32 { return dtype.Float8E5M2Bits(b).Float() }

// F32ToE5M2 rounds a float32 to OCP FP8 E5M2, to nearest even.
func F32ToE5M2(f float32) uint8 { return uint8(dtype.ToFloat8E5M2(f)) }

// widenF16Normal widens h and reports whether h was a normal number, the
// only case in which the result is right: then the fields just move and the
// exponent is rebiased. It is small enough to inline into the generic loops.
func widenF16Normal(h uint16) (float32, bool) {
	e := h & 0x7c00
	return math.Float32frombits(uint32(h&0x8000)<<16 | (uint32(h&0x7fff)<<13 + (127-15)<<23)), e != 0 && e != 0x7c00
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

// e4m3Table and e5m2Table hold all 256 values of each fp8 format, for the
// fp8 kernels' tables of results.
var e4m3Table, e5m2Table = fp8Table(E4M3ToF32), fp8Table(E5M2ToF32)

func fp8Table(widen func(uint8) float32) (t [256]float32) {
	for i := range t {
		t[i] = widen(uint8(i))
	}
	return t
}
