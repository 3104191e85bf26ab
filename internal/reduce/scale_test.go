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

func TestScaleAxpyDiv(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, dt := range allDTypes {
		size := dt.Size()
		factors := []float64{1.5, -0.3, 1e-3, 3, 0, 7.9, -2.9, 1e5}
		divisors := []int{1, 2, 3, 7, 8, 100, 127}
		for _, n := range []int{0, 1, 7, 64, 257} {
			nb := n * size
			src, other := offsetBuf(nb, rng.IntN(8)), offsetBuf(nb, rng.IntN(8))
			for i := 0; i < nb; i += size {
				x, y := randPair(dt, rng)
				storeElem(dt, src[i:], x)
				storeElem(dt, other[i:], y)
			}
			s := factors[rng.IntN(len(factors))]
			div := divisors[rng.IntN(len(divisors))]
			check := func(kind string, got []byte) {
				t.Helper()
				for i := 0; i < nb; i += size {
					x, y, g := loadElem(dt, src[i:]), loadElem(dt, other[i:]), loadElem(dt, got[i:])
					want := scaleRef(dt, kind, x, y, s, div)
					if want.anyNaN && isNaNBits(dt, g) || !want.anyNaN && g == want.bits {
						continue
					}
					t.Fatalf("%v %s(s=%v, n=%d) element %d: x=%#x y=%#x got %#x want %#x", dt, kind, s, div, i/size, x, y, g, want.bits)
				}
			}
			what := fmt.Sprintf("%v n=%d", dt, n)
			dst := offsetBuf(nb, rng.IntN(8))
			Scale(dt)(dst, src, s)
			check("scale", dst)
			inPlace := slices.Clone(src)
			Scale(dt)(inPlace, inPlace, s)
			if _, ok := sameBits(dt, inPlace, dst); !ok {
				t.Errorf("%s: in-place Scale differs", what)
			}

			Axpy(dt)(dst, src, other, s)
			check("axpy", dst)
			inPlace = slices.Clone(src)
			Axpy(dt)(inPlace, inPlace, other, s)
			if _, ok := sameBits(dt, inPlace, dst); !ok {
				t.Errorf("%s: in-place Axpy differs", what)
			}

			Div(dt)(dst, src, div)
			check("div", dst)
			inPlace = slices.Clone(src)
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
