package reduce

import (
	"math"
	"math/rand/v2"
	"testing"
)

// narrowFormat bundles the package's conversions for one format so the
// tests below can treat all four alike.
type narrowFormat struct {
	dt     DType
	codes  int
	widen  func(uint64) float32
	narrow func(float32) uint64
}

var narrowFormats = []narrowFormat{
	{Float16, 1 << 16, func(v uint64) float32 { return F16ToF32(uint16(v)) }, func(f float32) uint64 { return uint64(F32ToF16(f)) }},
	{BFloat16, 1 << 16, func(v uint64) float32 { return BF16ToF32(uint16(v)) }, func(f float32) uint64 { return uint64(F32ToBF16(f)) }},
	{Float8E4M3, 1 << 8, func(v uint64) float32 { return E4M3ToF32(uint8(v)) }, func(f float32) uint64 { return uint64(F32ToE4M3(f)) }},
	{Float8E5M2, 1 << 8, func(v uint64) float32 { return E5M2ToF32(uint8(v)) }, func(f float32) uint64 { return uint64(F32ToE5M2(f)) }},
}

// TestConversionExhaustive widens every code of every narrow format, checks
// the value against the bit-field decoding and narrows it back.
func TestConversionExhaustive(t *testing.T) {
	for _, nf := range narrowFormats {
		signBit := uint64(nf.codes >> 1)
		nans := 0
		for c := range uint64(nf.codes) {
			f := nf.widen(c)
			want := decodeFloat(nf.dt, c)
			back := nf.narrow(f)
			if math.IsNaN(want) {
				nans++
				if !math.IsNaN(float64(f)) || math.Signbit(float64(f)) != (c&signBit != 0) {
					t.Errorf("%v %#x: widened to %v, want NaN with sign", nf.dt, c, f)
				}
				if !isNaNBits(nf.dt, back) || back&signBit != c&signBit {
					t.Errorf("%v %#x: NaN narrowed back to %#x", nf.dt, c, back)
				}
				continue
			}
			if math.Float64bits(float64(f)) != math.Float64bits(want) {
				t.Errorf("%v %#x: widened to %v, want %v", nf.dt, c, f, want)
			}
			if back != c {
				t.Errorf("%v %#x: round trip gave %#x", nf.dt, c, back)
			}
		}
		wantNaNs := map[DType]int{Float16: 2 * 1023, BFloat16: 2 * 127, Float8E4M3: 2, Float8E5M2: 6}[nf.dt]
		if nans != wantNaNs {
			t.Errorf("%v: %d NaN codes, want %d", nf.dt, nans, wantNaNs)
		}
	}
	if E4M3ToF32(0x7e) != 448 || E5M2ToF32(0x7b) != 57344 || !math.IsInf(float64(E5M2ToF32(0x7c)), 1) {
		t.Error("fp8 extremes wrong")
	}
}

// TestConversionRounding narrows random float32 values (biased toward each
// format's range) and compares with roundFormat, then checks hand-picked ties.
func TestConversionRounding(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, nf := range narrowFormats {
		f := formats[nf.dt]
		for range 200000 {
			var x float32
			if rng.IntN(4) == 0 {
				x = math.Float32frombits(rng.Uint32())
			} else {
				// Exponents from below the smallest subnormal to above the max.
				e := f.emin - f.mantBits - 3 + rng.IntN(int(math.Log2(f.maxFinite))-f.emin+f.mantBits+6)
				m := 1 + rng.Float64()
				if rng.IntN(4) == 0 { // land on or next to a midpoint
					m = 1 + math.Ldexp(float64(rng.IntN(1<<f.mantBits)), -f.mantBits) + math.Ldexp(1, -f.mantBits-1)
					m += float64(rng.IntN(3)-1) * 0x1p-23
				}
				x = float32(math.Ldexp(m, e))
				if rng.IntN(2) == 0 {
					x = -x
				}
			}
			got := nf.narrow(x)
			want := roundFormat(f, float64(x))
			if math.IsNaN(want) {
				if !isNaNBits(nf.dt, got) {
					t.Fatalf("%v: narrow(%v) = %#x, want NaN", nf.dt, x, got)
				}
				continue
			}
			if wb := encodeFloat(nf.dt, want); got != wb {
				t.Fatalf("%v: narrow(%v = %#x) = %#x, want %#x (%v)", nf.dt, x, math.Float32bits(x), got, wb, want)
			}
		}
	}

	ties := []struct {
		dt   DType
		in   float64
		want float64
	}{
		{Float16, 1 + 0x1p-11, 1},                      // tie, down to even
		{Float16, 1 + 3*0x1p-11, 1 + 0x1p-9},           // tie, up to even
		{Float16, 1 + 0x1p-11 + 0x1p-20, 1 + 0x1p-10},  // just above the tie
		{Float16, 65504 + 16, math.Inf(1)},             // max + half ulp ties to even = overflow
		{Float16, 65520 - 0x1p-8, 65504},               // below that stays finite
		{Float16, 0x1p-25, 0},                          // half the smallest subnormal ties to 0
		{Float16, 3 * 0x1p-25, 0x1p-23},                // 1.5 subnormal units ties to 2
		{Float16, -0x1p-26, math.Copysign(0, -1)},      // underflow keeps the sign
		{BFloat16, 1 + 0x1p-8, 1},                      // tie, down
		{BFloat16, 1 + 3*0x1p-8, 1 + 0x1p-6},           // tie, up
		{BFloat16, 0x1.ffp127, math.Inf(1)},            // max + half ulp
		{BFloat16, 0x1p-133 * 1.5, 0x1p-132},           // subnormal tie up to even
		{Float8E4M3, 464, 448},                         // tie between 448 and the NaN code: even is 448
		{Float8E4M3, 464.5, math.NaN()},                // out of range
		{Float8E4M3, math.Inf(-1), math.NaN()},         // no infinities
		{Float8E4M3, 0x1p-10, 0},                       // half the smallest subnormal
		{Float8E4M3, 3 * 0x1p-10, 0x1p-8},              // 1.5 units ties to 2
		{Float8E5M2, 61440, math.Inf(1)},               // max + half ulp
		{Float8E5M2, 61439, 57344},                     // stays finite
		{Float8E5M2, 1.125, 1},                         // tie down
		{Float8E5M2, 1.375, 1.5},                       // tie up
		{Float8E5M2, math.Inf(-1), math.Inf(-1)},       // infinities kept
		{Float16, math.Inf(1), math.Inf(1)},            // infinities kept
		{BFloat16, math.Inf(-1), math.Inf(-1)},         // infinities kept
		{Float16, float64(math.Float32frombits(1)), 0}, // float32 subnormal
	}
	for _, c := range ties {
		nf := narrowFormats[map[DType]int{Float16: 0, BFloat16: 1, Float8E4M3: 2, Float8E5M2: 3}[c.dt]]
		got := nf.narrow(float32(c.in))
		if float64(float32(c.in)) != c.in && !math.IsInf(c.in, 0) {
			t.Fatalf("test case %v is not a float32", c.in)
		}
		if math.IsNaN(c.want) {
			if !isNaNBits(c.dt, got) {
				t.Errorf("%v(%v) = %#x, want NaN", c.dt, c.in, got)
			}
			continue
		}
		if want := encodeFloat(c.dt, c.want); got != want {
			t.Errorf("%v(%v) = %#x, want %#x", c.dt, c.in, got, want)
		}
	}
}

// TestNaNConversions checks that NaNs stay NaNs with their sign and come out
// quiet, including float32 NaNs whose payload lies only in the bits the
// narrowing drops.
func TestNaNConversions(t *testing.T) {
	for _, bits := range []uint32{0x7f800001, 0xff800001, 0x7fc00000, 0x7f80ffff, 0xffffffff} {
		f := math.Float32frombits(bits)
		neg := bits>>31 == 1
		if h := F32ToF16(f); h&0x7e00 != 0x7e00 || (h>>15 == 1) != neg {
			t.Errorf("F32ToF16(%#x) = %#x", bits, h)
		}
		if h := F32ToBF16(f); h&0x7fc0 != 0x7fc0 || (h>>15 == 1) != neg {
			t.Errorf("F32ToBF16(%#x) = %#x", bits, h)
		}
		if b := F32ToE4M3(f); b&0x7f != 0x7f || (b>>7 == 1) != neg {
			t.Errorf("F32ToE4M3(%#x) = %#x", bits, b)
		}
		if b := F32ToE5M2(f); b&0x7e != 0x7e || (b>>7 == 1) != neg {
			t.Errorf("F32ToE5M2(%#x) = %#x", bits, b)
		}
	}
	// A signalling float16 NaN widens to a quiet float32 NaN, as F16C does.
	if got := math.Float32bits(F16ToF32(0x7c01)); got != 0x7fc02000 {
		t.Errorf("F16ToF32(0x7c01) = %#x, want 0x7fc02000", got)
	}
}

// fp8Formats are the two fp8 formats with their conversions.
var fp8Formats = []struct {
	dt     DType
	widen  func(uint8) float32
	narrow func(float32) uint8
}{{Float8E4M3, E4M3ToF32, F32ToE4M3}, {Float8E5M2, E5M2ToF32, F32ToE5M2}}

// The fp8 kernels' tables hold, for every pair of inputs, what widening,
// the float32 op and narrowing give, bit for bit.
func TestFP8KernelsRoundAsTheFloat32Op(t *testing.T) {
	a, b := bytePairs()
	ops := map[Op]func(x, y float32) float32{
		Sum:  func(x, y float32) float32 { return x + y },
		Prod: func(x, y float32) float32 { return x * y },
		Min:  minF32,
		Max:  maxF32,
	}
	for _, f := range fp8Formats {
		for op, fn := range ops {
			for _, set := range testSets() {
				dst := make([]byte, len(a))
				set.funcs[f.dt][op](dst, a, b)
				for i := range dst {
					if want := f.narrow(fn(f.widen(a[i]), f.widen(b[i]))); dst[i] != want {
						t.Fatalf("%s %v %v(%#x, %#x) = %#x, want %#x", set.name, f.dt, op, a[i], b[i], dst[i], want)
					}
				}
			}
		}
	}
}
