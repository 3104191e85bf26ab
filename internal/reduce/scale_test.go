package reduce

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// scaleRef computes one element of Scale (y unused), Axpy or Div in the
// reference model: exact integer arithmetic, or the compute type's
// arithmetic rounded once into the element type.
func scaleRef(dt DType, kind string, x, y uint64, s float64, n int) refResult {
	if !dt.IsFloat() {
		width := uint(dt.Size() * 8)
		mask := uint64(math.MaxUint64) >> (64 - width)
		m := uint64(int64(s))
		switch kind {
		case "scale":
			return refResult{bits: x * m & mask}
		case "axpy":
			return refResult{bits: (x + y*m) & mask}
		}
		if dt == Int8 || dt == Int32 || dt == Int64 {
			sx := int64(x<<(64-width)) >> (64 - width)
			return refResult{bits: uint64(sx/int64(n)) & mask}
		}
		return refResult{bits: x / uint64(n)}
	}
	a, b := decodeFloat(dt, x), decodeFloat(dt, y)
	var r float64
	if dt == Float64 {
		switch kind {
		case "scale":
			r = a * s
		case "axpy":
			r = a + float64(b*s)
		default:
			r = a / float64(n)
		}
	} else {
		s32 := float32(s)
		switch kind {
		case "scale":
			r = float64(float32(a) * s32)
		case "axpy":
			r = float64(float32(a) + float32(float32(b)*s32))
		default:
			r = float64(float32(a) / float32(n))
		}
	}
	r = roundFormat(formats[dt], r)
	if math.IsNaN(r) {
		return refResult{anyNaN: true}
	}
	return refResult{bits: encodeFloat(dt, r)}
}

// TestScaleAxpyDiv checks every kernel set's Scale and Axpy, and Div,
// against the reference at every vector tail length, at odd offsets, out of
// place and in place, and checks that the sets agree bit for bit.
func TestScaleAxpyDiv(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	factors := []float64{1.5, -0.3, 1e-3, 3, 0, 7.9, -2.9, 1e5}
	divisors := []int{1, 2, 3, 7, 8, 100, 127}
	for _, dt := range allDTypes {
		size := dt.Size()
		for _, n := range testLengths() {
			nb := n * size
			src, other := offsetBuf(nb, rng.IntN(8)), offsetBuf(nb, rng.IntN(8))
			for i := 0; i < nb; i += size {
				x, y := randPair(dt, rng)
				storeElem(dt, src[i:], x)
				storeElem(dt, other[i:], y)
			}
			s := factors[rng.IntN(len(factors))]
			div := divisors[rng.IntN(len(divisors))]
			check := func(what, kind string, got []byte) {
				t.Helper()
				for i := 0; i < nb; i += size {
					x, y, g := loadElem(dt, src[i:]), loadElem(dt, other[i:]), loadElem(dt, got[i:])
					want := scaleRef(dt, kind, x, y, s, div)
					if want.anyNaN && isNaNBits(dt, g) || !want.anyNaN && g == want.bits {
						continue
					}
					t.Fatalf("%s: %v %s(s=%v, n=%d) element %d of %d: x=%#x y=%#x got %#x want %#x", what, dt, kind, s, div, i/size, n, x, y, g, want.bits)
				}
			}
			var firstScale, firstAxpy []byte // the generic set's outputs
			// sameAsGeneric keeps the generic set's output in *first, the
			// first set's, and compares the other sets' with it.
			sameAsGeneric := func(first *[]byte, got []byte, what, kind string) {
				t.Helper()
				if *first == nil {
					*first = got
				} else if i, ok := sameBits(dt, got, *first); !ok {
					t.Fatalf("%s: %s element %d differs from generic", what, kind, i)
				}
			}
			for _, set := range testSets() {
				what := fmt.Sprintf("%s n=%d", set.name, n)
				dst := offsetBuf(nb, rng.IntN(8))
				set.scale[dt](dst, src, s)
				check(what, "scale", dst)
				inPlace := slices.Clone(src)
				set.scale[dt](inPlace, inPlace, s)
				if _, ok := sameBits(dt, inPlace, dst); !ok {
					t.Errorf("%s: in-place Scale differs", what)
				}
				sameAsGeneric(&firstScale, dst, what, "Scale")

				dst = offsetBuf(nb, rng.IntN(8))
				set.axpy[dt](dst, src, other, s)
				check(what, "axpy", dst)
				inPlace = slices.Clone(src)
				set.axpy[dt](inPlace, inPlace, other, s)
				if _, ok := sameBits(dt, inPlace, dst); !ok {
					t.Errorf("%s: in-place Axpy (dst == a) differs", what)
				}
				inPlace = slices.Clone(other)
				set.axpy[dt](inPlace, src, inPlace, s)
				if _, ok := sameBits(dt, inPlace, dst); !ok {
					t.Errorf("%s: in-place Axpy (dst == b) differs", what)
				}
				sameAsGeneric(&firstAxpy, dst, what, "Axpy")
			}

			what := fmt.Sprintf("%v n=%d", dt, n)
			dst := offsetBuf(nb, rng.IntN(8))
			Div(dt)(dst, src, div)
			check(what, "div", dst)
			inPlace := slices.Clone(src)
			Div(dt)(inPlace, inPlace, div)
			if _, ok := sameBits(dt, inPlace, dst); !ok {
				t.Errorf("%s: in-place Div differs", what)
			}
		}
	}
	if Scale(0) != nil || Axpy(13) != nil || Div(255) != nil {
		t.Error("invalid dtype accepted")
	}
}

// TestScalingExhaustiveHalf feeds every float16 and bfloat16 bit pattern
// through each set's Scale and Axpy, with special values as factors and as
// Axpy's other operand, and compares with the generic loops: the SIMD
// kernels' conversions and rounding must agree with the Go code on every
// input, and a NaN factor must not turn into an infinity.
func TestScalingExhaustiveHalf(t *testing.T) {
	factors := []float64{0.125, -1.0 / 3, 0, math.Copysign(0, -1), 3e38, 1e-40, 1e300,
		math.Inf(1), math.Inf(-1), math.NaN(), math.Float64frombits(0x7fffffffffffffff)}
	for _, dt := range []DType{Float16, BFloat16} {
		a := make([]byte, 2<<16)
		for i := range 1 << 16 {
			storeElem(dt, a[2*i:], uint64(i))
		}
		partners := specials(dt)
		for fi, s := range factors {
			b := make([]byte, len(a))
			p := partners[fi%len(partners)]
			for i := 0; i < len(b); i += 2 {
				storeElem(dt, b[i:], encodeFloat(dt, p))
			}
			wantScale, wantAxpy := make([]byte, len(a)), make([]byte, len(a))
			implementations[0].scale[dt](wantScale, a, s)
			implementations[0].axpy[dt](wantAxpy, a, b, s)
			for _, set := range testSets()[1:] {
				got := make([]byte, len(a))
				set.scale[dt](got, a, s)
				if i, ok := sameBits(dt, got, wantScale); !ok {
					t.Fatalf("%s %v: %#x * %v = %#x, generic %#x", set.name, dt, i, s,
						loadElem(dt, got[2*i:]), loadElem(dt, wantScale[2*i:]))
				}
				set.axpy[dt](got, a, b, s)
				if i, ok := sameBits(dt, got, wantAxpy); !ok {
					t.Fatalf("%s %v: %#x + %v * %v = %#x, generic %#x", set.name, dt, i, p, s,
						loadElem(dt, got[2*i:]), loadElem(dt, wantAxpy[2*i:]))
				}
			}
		}
	}
}

// resetAxpyCaches drops every fp8 Axpy table and the record of factors.
func resetAxpyCaches() {
	for _, c := range axpyCaches {
		if c != nil {
			for i := range c.tables {
				c.tables[i].Store(nil)
				c.missed[i].Store(0)
			}
		}
	}
}

// TestScalingExhaustiveFP8 runs every fp8 value through each set's Scale,
// and every pair of values through its Axpy, for factors that are exact,
// inexact, zero, huge, tiny and infinite, and checks each result against
// widening, operating in float32 and narrowing, bit for bit (NaNs included:
// the generic loops and the kernels return the same one). Axpy runs on
// halves, below the size that gets a factor a table, so that it computes.
func TestScalingExhaustiveFP8(t *testing.T) {
	resetAxpyCaches()
	factors := []float64{0.125, -1.0 / 3, 0, math.Copysign(0, -1), 3e38, 1e-40, 1e-3, 448, 7.5,
		math.Inf(1), math.Inf(-1)}
	a, b := bytePairs()
	got := make([]byte, len(a))
	for _, f := range fp8Formats {
		for _, s := range factors {
			m := float32(s)
			for _, set := range testSets() {
				set.scale[f.dt](got, b, s)
				for i := range got {
					if want := f.narrow(f.widen(b[i]) * m); got[i] != want {
						t.Fatalf("%s %v: %#x * %v = %#x, want %#x", set.name, f.dt, b[i], s, got[i], want)
					}
				}
				half := len(got) / 2
				set.axpy[f.dt](got[:half], a[:half], b[:half], s)
				set.axpy[f.dt](got[half:], a[half:], b[half:], s)
				for i := range got {
					if want := f.narrow(f.widen(a[i]) + float32(f.widen(b[i])*m)); got[i] != want {
						t.Fatalf("%s %v: %#x + %#x * %v = %#x, want %#x", set.name, f.dt, a[i], b[i], s, got[i], want)
					}
				}
			}
		}
	}
}

// TestDivInts spells out Go's truncating division on the edge cases.
func TestDivInts(t *testing.T) {
	cases := []struct {
		dt     DType
		x      uint64
		n      int
		want   uint64
		reason string
	}{
		{Int8, 0xf9, 2, 0xfd, "-7/2 = -3"},
		{Int8, 0x80, 1, 0x80, "min/1"},
		{Uint8, 0xff, 2, 0x7f, "255/2"},
		{Int32, 0xfffffff9, 4, 0xffffffff, "-7/4 = -1"},
		{Uint32, 0xffffffff, 16, 0x0fffffff, "unsigned, no sign extension"},
		{Int64, 1 << 63, 2, 0xc000000000000000, "min/2"},
		{Uint64, 1 << 63, 2, 1 << 62, "unsigned"},
	}
	for _, c := range cases {
		src, dst := make([]byte, c.dt.Size()), make([]byte, c.dt.Size())
		storeElem(c.dt, src, c.x)
		Div(c.dt)(dst, src, c.n)
		if got := loadElem(c.dt, dst); got != c.want {
			t.Errorf("%v %s: got %#x, want %#x", c.dt, c.reason, got, c.want)
		}
	}
}

// TestDivisor checks the multiply-and-shift division (and the 32-bit
// single multiply, on the dividends' low words) against Go's / for
// divisors small and large (every rank count up to 1000, powers of two and
// their neighbours, the largest) and dividends at the edges, at multiples of
// the divisor and their neighbours, and at random.
func TestDivisor(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	ds := []uint64{math.MaxUint64, math.MaxUint64 - 1, 1<<63 + 1, 65536, 65537, 3 << 40, 0x5555555555555555,
		math.MaxUint32, math.MaxUint32 - 1, 0x55555555, 641, 6700417}
	for d := uint64(1); d <= 1000; d++ {
		ds = append(ds, d)
	}
	for l := 2; l < 64; l++ {
		ds = append(ds, 1<<l-1, 1<<l, 1<<l+1)
	}
	for _, d := range ds {
		v := newDivisor(d)
		xs := []uint64{0, 1, d - 1, d, d + 1, math.MaxUint64, math.MaxUint64 - 1, 1 << 63, 1<<63 - 1,
			math.MaxUint32, 1 << 32, math.MaxUint64 / d * d, math.MaxUint64/d*d - 1}
		for range 200 {
			xs = append(xs, rng.Uint64(), rng.Uint64()>>rng.IntN(64))
		}
		for _, x := range xs {
			if got := v.div(x); got != x/d {
				t.Fatalf("%d / %d = %d, want %d", x, d, got, x/d)
			}
			if x32 := x & math.MaxUint32; d > 1 && d <= math.MaxUint32 {
				if got := newDivisor32(d).div(x32); got != x32/d {
					t.Fatalf("32-bit: %d / %d = %d, want %d", x32, d, got, x32/d)
				}
			}
		}
	}
}

// TestDivIntsExhaustive divides every 8-bit value (through the loop and
// through the table) and the 32- and 64-bit edge values by every rank count
// up to 300 and a few larger ones, against Go's /.
func TestDivIntsExhaustive(t *testing.T) {
	ns := []int{65535, 65536, 1 << 20, math.MaxInt32, math.MaxUint32, 1 << 32, math.MaxInt64}
	for n := 1; n <= 300; n++ {
		ns = append(ns, n)
	}
	bytesIn := make([]byte, 2*256) // over byteMapMin, for the table
	for i := range bytesIn {
		bytesIn[i] = byte(i)
	}
	edges := []int64{0, 1, -1, 2, -2, 127, -128, 255, 256, 1<<31 - 1, -1 << 31, 1<<32 - 1,
		1<<63 - 1, -1 << 63, 1e18, -1e18, 123456789, -987654321}
	for _, n := range ns {
		for _, loop := range []bool{true, false} {
			in := bytesIn
			if loop {
				in = bytesIn[:256]
			}
			out := make([]byte, len(in))
			Div(Uint8)(out, in, n)
			for i, x := range in {
				if want := uint8(uint64(x) / uint64(n)); out[i] != want {
					t.Fatalf("uint8 %d / %d = %d, want %d (loop %v)", x, n, out[i], want, loop)
				}
			}
			Div(Int8)(out, in, n)
			for i, x := range in {
				if want := int8(int64(int8(x)) / int64(n)); int8(out[i]) != want {
					t.Fatalf("int8 %d / %d = %d, want %d (loop %v)", int8(x), n, int8(out[i]), want, loop)
				}
			}
		}
		for _, dt := range []DType{Int32, Uint32, Int64, Uint64} {
			size := dt.Size()
			in, out := make([]byte, len(edges)*size), make([]byte, len(edges)*size)
			for i, x := range edges {
				storeElem(dt, in[i*size:], uint64(x))
			}
			Div(dt)(out, in, n)
			for i := range edges {
				x, got := loadElem(dt, in[i*size:]), loadElem(dt, out[i*size:])
				var want uint64
				switch dt {
				case Int32:
					want = uint64(uint32(int64(int32(x)) / int64(n)))
				case Uint32:
					want = x / uint64(n)
				case Int64:
					want = uint64(int64(x) / int64(n))
				case Uint64:
					want = x / uint64(n)
				}
				if got != want {
					t.Fatalf("%v %#x / %d = %#x, want %#x", dt, x, n, got, want)
				}
			}
		}
	}
	for _, n := range []int{0, -1} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Div by %d did not panic", n)
				}
			}()
			Div(Int32)(make([]byte, 4), make([]byte, 4), n)
		}()
	}
}

// The one-byte formats' table lookups give the bits of the loops they
// replace, for every input: each of the 256 values through Scale and Div,
// each of the 65536 pairs through Axpy (building its table, then from the
// table kept, then directly for a new factor on a small buffer). These are
// the generic set's Scale and Axpy, called through the names the body
// uses; the SIMD sets compute instead (AVX-512 Scale and Axpy, AVX2 an
// Axpy whose factor has no table: TestScalingExhaustiveFP8).
func TestByteScalingTables(t *testing.T) {
	for _, f := range fp8Formats {
		Scale := func(DType) scaleFunc { return scaleFuncs[f.dt] }
		Axpy := func(DType) axpyFunc { return axpyFuncs[f.dt] }
		all := make([]byte, 512)
		for i := range all {
			all[i] = byte(i)
		}
		dst := make([]byte, len(all))
		for _, s := range []float64{0.125, 1.0 / 3, -2.5, 1e-3, 300, 0} {
			m := float32(s)
			Scale(f.dt)(dst, all, s)
			for i, v := range all {
				if want := f.narrow(f.widen(v) * m); dst[i] != want {
					t.Fatalf("%v Scale(%#x, %v) = %#x, want %#x", f.dt, v, s, dst[i], want)
				}
			}
		}
		for _, n := range []int{1, 2, 3, 7, 100} {
			Div(f.dt)(dst, all, n)
			for i, v := range all {
				if want := f.narrow(f.widen(v) / float32(n)); dst[i] != want {
					t.Fatalf("%v Div(%#x, %d) = %#x, want %#x", f.dt, v, n, dst[i], want)
				}
			}
		}
		a, b := bytePairs() // axpyTableMin long: Axpy builds tables on it
		check := func(what string, got, a, b []byte, s float64) {
			t.Helper()
			m := float32(s)
			for i := range got {
				if want := f.narrow(f.widen(a[i]) + float32(f.widen(b[i])*m)); got[i] != want {
					t.Fatalf("%v Axpy %s(%#x, %#x, %v) = %#x, want %#x", f.dt, what, a[i], b[i], s, got[i], want)
				}
			}
		}
		out := make([]byte, len(a))
		for _, s := range []float64{0.125, -1.0 / 3, 7.5} {
			Axpy(f.dt)(out, a, b, s)
			check("directly, the factor new", out, a, b, s)
			Axpy(f.dt)(out, a, b, s)
			check("building its table", out, a, b, s)
			small := out[:1000]
			Axpy(f.dt)(small, a[5000:6000], b[5000:6000], s)
			check("from its table", small, a[5000:6000], b[5000:6000], s)
			Axpy(f.dt)(small, a[5000:6000], b[5000:6000], s*2)
			check("directly", small, a[5000:6000], b[5000:6000], s*2)
			inPlace := slices.Clone(a)
			Axpy(f.dt)(inPlace, inPlace, b, s)
			check("in place", inPlace, a, b, s)
		}
		// In-process ranks with their own PreMulSum scalars interleave their
		// calls; each factor gets its table on its second call.
		c := axpyCaches[f.dt]
		resetAxpyCaches() // earlier calls may have left tables for these factors
		s1, s2 := 0.3125, -0.6875
		for round := range 2 {
			for _, s := range []float64{s1, s2} {
				Axpy(f.dt)(out, a, b, s)
				check(fmt.Sprintf("interleaved, round %d", round), out, a, b, s)
				if has := c.table(float32(s)) != nil; has != (round == 1) {
					t.Errorf("%v: after %d calls with factor %v, has a table: %v", f.dt, round+1, s, has)
				}
			}
		}
		if n := testing.AllocsPerRun(10, func() { Axpy(f.dt)(out, a, b, 7.5) }); n != 0 {
			t.Errorf("%v Axpy with the factor of its table allocates %v times", f.dt, n)
		}
		s := 1.0
		if n := testing.AllocsPerRun(10, func() { s += 0.25; Axpy(f.dt)(out, a, b, s) }); n != 0 {
			t.Errorf("%v Axpy with a new factor on every call allocates %v times", f.dt, n)
		}
		if n := testing.AllocsPerRun(10, func() { Scale(f.dt)(out, a, 0.5); Div(f.dt)(out, a, 3) }); n != 0 {
			t.Errorf("%v Scale and Div allocate %v times", f.dt, n)
		}
	}
}
