package reduce

import (
	"math"
	"math/bits"
	"sync/atomic"
	"unsafe"
)

// Pre- and post-operations for PreMulSum and Avg. A float Avg or PreMulSum
// scales each rank's own input (Scale) and folds each received block in as
// a + b*s (Axpy), at every reduction step, so Scale and Axpy of float32,
// float16 and bfloat16 have SIMD kernels in the kernel sets, as the
// reductions do, and so have the fp8 formats' on AVX-512 (and Axpy on
// AVX2). An integer Avg divides once, at the end (Div), in Go.
//
// Float types compute in float32 (float16, bfloat16, fp8 and float32) or
// float64 and round back once. Integer types convert s to int64 first
// (truncating toward zero; s must be finite and in int64 range) and wrap in
// the type's width. Explicit float32(...) conversions keep the compiler from
// fusing a multiply and an add into an FMA, which would round differently on
// different architectures.

// Scale returns the function computing dst[i] = src[i]*s for dt, or nil if
// dt is invalid. dst may alias src exactly. It never allocates.
func Scale(dt DType) func(dst, src []byte, s float64) {
	if !dt.Valid() {
		return nil
	}
	return active.Load().scale[dt]
}

// Axpy returns the function computing dst[i] = a[i] + b[i]*s for dt (the
// product is rounded to the compute type before the add), or nil if dt is
// invalid. dst may alias a or b exactly. It never allocates.
func Axpy(dt DType) func(dst, a, b []byte, s float64) {
	if !dt.Valid() {
		return nil
	}
	return active.Load().axpy[dt]
}

// Div returns the function computing dst[i] = src[i] / n for dt, or nil if
// dt is invalid. Integer types truncate toward zero like Go's /; n is a rank
// count and must be at least 1 (integer types panic otherwise). Float types
// divide in the compute type. dst may alias src exactly. It never allocates.
func Div(dt DType) func(dst, src []byte, n int) {
	if !dt.Valid() {
		return nil
	}
	return divFuncs[dt]
}

type (
	scaleFunc = func(dst, src []byte, s float64)
	axpyFunc  = func(dst, a, b []byte, s float64)
)

// The generic loops, which every kernel set starts from; the SIMD sets
// replace some of Scale and Axpy's. Div is generic only: Avg divides only
// integers, once per collective.
var (
	scaleFuncs [numDTypes + 1]scaleFunc
	axpyFuncs  [numDTypes + 1]axpyFunc
	divFuncs   [numDTypes + 1]func(dst, src []byte, n int)
)

// initScaling fills the generic tables; the package's init calls it before
// it builds the kernel sets.
func initScaling() {
	intScaling[int8](Int8, divSigned[int8])
	intScaling[uint8](Uint8, divUnsigned[uint8])
	intScaling[int32](Int32, divSigned[int32])
	intScaling[uint32](Uint32, divUnsigned[uint32])
	intScaling[int64](Int64, divSigned[int64])
	intScaling[uint64](Uint64, divUnsigned[uint64])
	setScaling(Float32, scaleFloat[float32], axpyFloat[float32], divFloat[float32])
	setScaling(Float64, scaleFloat[float64], axpyFloat[float64], divFloat[float64])
	setScaling(Float16, scaleF16, axpyF16, divF16)
	setScaling(BFloat16, scaleBF16, axpyBF16, divBF16)
	byteScaling(Float8E4M3, E4M3ToF32, F32ToE4M3)
	byteScaling(Float8E5M2, E5M2ToF32, F32ToE5M2)
}

// setScaling installs typed loops; the single-input ones take src twice so
// that all three share typedParam's alignment handling.
func setScaling[T any](dt DType, scale, axpy func(dst, a, b []T, s float64), div func(dst, src, _ []T, n int)) {
	sc, ax, dv := typedParam(scale), typedParam(axpy), typedParam(div)
	scaleFuncs[dt] = func(dst, src []byte, s float64) { sc(dst, src, src, s) }
	axpyFuncs[dt] = ax
	divFuncs[dt] = func(dst, src []byte, n int) { dv(dst, src, src, n) }
}

func intScaling[T integer](dt DType, div func(dst, src, _ []T, n int)) {
	setScaling(dt, scaleInt[T], axpyInt[T], div)
}

func scaleInt[T integer](dst, src, _ []T, s float64) {
	m := T(int64(s))
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = src[i] * m
	}
}

func axpyInt[T integer](dst, a, b []T, s float64) {
	m := T(int64(s))
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = a[i] + b[i]*m
	}
}

// Integer Div multiplies by a magic number instead of dividing: a divide
// instruction costs 20-90 cycles per element, which made an integer Avg
// 5-20 times slower than a Sum. The 32-bit types need a single multiply;
// the 8-bit types look the quotient up in a table of all 256 on buffers
// large enough to repay building it.

// divisor divides unsigned 64-bit integers by a constant d >= 1 with a
// multiply, an add, a subtract and two shifts: Granlund and Montgomery,
// "Division by Invariant Integers using Multiplication" (PLDI 1994),
// figure 4.1, exact for every dividend.
type divisor struct {
	m        uint64
	sh1, sh2 uint
}

// newDivisor returns the divisor for d >= 1.
func newDivisor(d uint64) divisor {
	l := uint(bits.Len64(d - 1)) // ceil(log2(d))
	// m = floor(2^64 * (2^l - d) / d) + 1; 2^l - d < d, so the quotient
	// fits, and 1<<64 is 0 in Go, which gives 2^l - d mod 2^64 for l = 64.
	m, _ := bits.Div64(uint64(1)<<l-d, 0, d)
	return divisor{m: m + 1, sh1: min(l, 1), sh2: max(l, 1) - 1}
}

func (v divisor) div(x uint64) uint64 {
	t, _ := bits.Mul64(v.m, x)
	return (t + (x-t)>>v.sh1) >> v.sh2
}

// divisor32 divides integers below 2^32 by a constant 2 <= d < 2^32 with
// one multiply: x/d = (c*x) >> 64 for c = ceil(2^64/d) (Lemire, Kaser and
// Kurz, "Faster Remainder by Direct Computation", 2019, theorem 1).
type divisor32 uint64

func newDivisor32(d uint64) divisor32 { return divisor32(^uint64(0)/d + 1) }

func (c divisor32) div(x uint64) uint64 {
	hi, _ := bits.Mul64(uint64(c), x)
	return hi
}

// fits32 reports whether the 32-bit types can use divisor32 for n.
func fits32[T integer](n int) bool {
	return unsafe.Sizeof(T(0)) == 4 && n > 1 && uint64(n) < 1<<32
}

// divSigned truncates toward zero, as Go's / does: it divides the
// magnitude and restores the sign (s is 0 or all ones).
func divSigned[T int8 | int32 | int64](dst, src, _ []T, n int) {
	src = src[:len(dst)]
	if fits32[T](n) {
		c := newDivisor32(uint64(n))
		for i := range dst {
			s := uint64(int64(src[i]) >> 63)
			dst[i] = T((c.div(uint64(int64(src[i]))^s-s) ^ s) - s)
		}
		return
	}
	v := newDivisor(divisorOf(n))
	quo := func(x T) T {
		s := uint64(int64(x) >> 63)
		return T((v.div(uint64(int64(x))^s-s) ^ s) - s)
	}
	if unsafe.Sizeof(T(0)) == 1 && len(dst) >= byteMapMin {
		mapByTable(dst, src, quo)
		return
	}
	for i := range dst {
		dst[i] = quo(src[i])
	}
}

func divUnsigned[T uint8 | uint32 | uint64](dst, src, _ []T, n int) {
	src = src[:len(dst)]
	if fits32[T](n) {
		c := newDivisor32(uint64(n))
		for i := range dst {
			dst[i] = T(c.div(uint64(src[i])))
		}
		return
	}
	v := newDivisor(divisorOf(n))
	quo := func(x T) T { return T(v.div(uint64(x))) }
	if unsafe.Sizeof(T(0)) == 1 && len(dst) >= byteMapMin {
		mapByTable(dst, src, quo)
		return
	}
	for i := range dst {
		dst[i] = quo(src[i])
	}
}

// divisorOf checks Div's n, which is a rank count.
func divisorOf(n int) uint64 {
	if n < 1 {
		panic("reduce: Div by n < 1")
	}
	return uint64(n)
}

// mapByTable sets dst[i] = f(src[i]) for a one-byte type through a table of
// f's 256 results, built first: the 8-bit integers' Div and the fp8
// formats' Scale and Div. The callers use it only where T is one byte wide.
func mapByTable[T integer](dst, src []T, f func(T) T) {
	var tab [256]T
	for x := range tab {
		tab[x] = f(T(x)) // T(x) wraps 128..255 to negative for int8
	}
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = tab[uint8(src[i])]
	}
}

func scaleFloat[T float](dst, src, _ []T, s float64) {
	m := T(s)
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = src[i] * m
	}
}

func axpyFloat[T float](dst, a, b []T, s float64) {
	m := T(s)
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = a[i] + T(b[i]*m)
	}
}

func divFloat[T float](dst, src, _ []T, n int) {
	m := T(n)
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = src[i] / m
	}
}

// float16 and bfloat16 have loops of their own so that the conversions
// inline, as in the generic kernels (float16 inlines the normal case and
// calls the full conversions for the rest); through function values each
// element cost two calls and the loops ran 4-8x slower.

func scaleF16(dst, src, _ []uint16, s float64) {
	m := float32(s)
	src = src[:len(dst)]
	for i := range dst {
		x, okx := widenF16Normal(src[i])
		r, ok := narrowF16Normal(x * m)
		if !(okx && ok) {
			r = F32ToF16(F16ToF32(src[i]) * m)
		}
		dst[i] = r
	}
}

func axpyF16(dst, a, b []uint16, s float64) {
	m := float32(s)
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		x, okx := widenF16Normal(a[i])
		y, oky := widenF16Normal(b[i])
		r, ok := narrowF16Normal(x + float32(y*m))
		if !(okx && oky && ok) {
			r = F32ToF16(F16ToF32(a[i]) + float32(F16ToF32(b[i])*m))
		}
		dst[i] = r
	}
}

func divF16(dst, src, _ []uint16, n int) {
	m := float32(n)
	src = src[:len(dst)]
	for i := range dst {
		x, okx := widenF16Normal(src[i])
		r, ok := narrowF16Normal(x / m)
		if !(okx && ok) {
			r = F32ToF16(F16ToF32(src[i]) / m)
		}
		dst[i] = r
	}
}

func scaleBF16(dst, src, _ []uint16, s float64) {
	m := float32(s)
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = F32ToBF16(BF16ToF32(src[i]) * m)
	}
}

func axpyBF16(dst, a, b []uint16, s float64) {
	m := float32(s)
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = F32ToBF16(BF16ToF32(a[i]) + float32(BF16ToF32(b[i])*m))
	}
}

func divBF16(dst, src, _ []uint16, n int) {
	m := float32(n)
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = F32ToBF16(BF16ToF32(src[i]) / m)
	}
}

// narrowScaling installs the loops of the fp8 formats, computed in float32.
// The conversions are passed as function values; byteScaling replaces the
// loops with table lookups where buffers are large.
func narrowScaling(dt DType, widen func(uint8) float32, narrow func(float32) uint8) {
	scale := func(dst, src, _ []uint8, s float64) {
		m := float32(s)
		src = src[:len(dst)]
		for i := range dst {
			dst[i] = narrow(widen(src[i]) * m)
		}
	}
	axpy := func(dst, a, b []uint8, s float64) {
		m := float32(s)
		a, b = a[:len(dst)], b[:len(dst)]
		for i := range dst {
			dst[i] = narrow(widen(a[i]) + float32(widen(b[i])*m))
		}
	}
	div := func(dst, src, _ []uint8, n int) {
		m := float32(n)
		src = src[:len(dst)]
		for i := range dst {
			dst[i] = narrow(widen(src[i]) / m)
		}
	}
	setScaling(dt, scale, axpy, div)
}

// byteScaling installs narrowScaling's loops for a one-byte format, as
// table lookups on large buffers: scaling one element costs 12-19 ns, a
// lookup under 1 ns. Scale and Div map each of the 256 values the same way
// for the whole call, so the call first builds that map. Axpy's result
// depends on both operands; its 64 KiB tables are kept per factor
// (axpyCache) and built on buffers large enough to repay them. The maps come
// from the same conversions as the loops, and the tables from the loops
// themselves, so the results are the same bits.
func byteScaling(dt DType, widen func(uint8) float32, narrow func(float32) uint8) {
	narrowScaling(dt, widen, narrow)
	scale, axpy, div := scaleFuncs[dt], axpyFuncs[dt], divFuncs[dt]
	scaleFuncs[dt] = func(dst, src []byte, s float64) {
		if len(dst) < byteMapMin {
			scale(dst, src, s)
			return
		}
		m := float32(s)
		mapByTable(dst, src, func(x uint8) uint8 { return narrow(widen(x) * m) })
	}
	divFuncs[dt] = func(dst, src []byte, n int) {
		if len(dst) < byteMapMin {
			div(dst, src, n)
			return
		}
		m := float32(n)
		mapByTable(dst, src, func(x uint8) uint8 { return narrow(widen(x) / m) })
	}
	c := &axpyCache{loop: axpy}
	axpyCaches[dt] = c
	axpyFuncs[dt] = c.axpy(c.loop)
}

// axpy returns an Axpy that looks its results up in c's table for the
// factor, building one for a repeated factor on a large buffer, and
// computes them with compute otherwise.
func (c *axpyCache) axpy(compute axpyFunc) axpyFunc {
	return func(dst, a, b []byte, s float64) {
		m := float32(s)
		t := c.table(m)
		if t == nil {
			if !c.repeated(m) || len(dst) < axpyTableMin {
				compute(dst, a, b, s)
				return
			}
			t = c.build(m)
		}
		a, b = a[:len(dst)], b[:len(dst)]
		for i := range dst {
			dst[i] = t.tab[uint16(a[i])<<8|uint16(b[i])]
		}
	}
}

// axpyCache keeps a one-byte format's Axpy tables for the last few factors
// that came more than once: Avg's is the same on every call, and each
// in-process rank of a PreMulSum has its own scalar (their calls
// interleave, so one table for the last factor would serve none of them).
// A factor gets a table on its second call among the last axpyTables
// misses, so PreMulSum with a new scalar on every call never allocates.
type axpyCache struct {
	loop   axpyFunc // the Go loop, which computes each element and the tables
	tables [axpyTables]atomic.Pointer[axpyTable]
	missed [axpyTables]atomic.Uint64 // 1<<32 | a factor's bits; 0: empty
	nextT  atomic.Uint32             // the slots to overwrite next
	nextM  atomic.Uint32
}

// axpyTables is how many factors keep a table (64 KiB each) per format.
const axpyTables = 8

var axpyCaches [numDTypes + 1]*axpyCache

// table returns m's table, or nil.
func (c *axpyCache) table(m float32) *axpyTable {
	for i := range c.tables {
		if t := c.tables[i].Load(); t != nil && math.Float32bits(t.m) == math.Float32bits(m) {
			return t
		}
	}
	return nil
}

// repeated reports whether m is among the last misses; if not, it records
// m as one, in place of the oldest.
func (c *axpyCache) repeated(m float32) bool {
	key := 1<<32 | uint64(math.Float32bits(m))
	for i := range c.missed {
		if c.missed[i].Load() == key {
			return true
		}
	}
	c.missed[c.nextM.Add(1)%axpyTables].Store(key)
	return false
}

// build makes and publishes m's table, a row per first operand, each row
// computed by the loop, so a lookup gives the loop's bits. Two goroutines
// may build the same one; each is correct, and the spare is overwritten in
// time.
func (c *axpyCache) build(m float32) *axpyTable {
	t := &axpyTable{m: m}
	var xs, ys [256]uint8
	for y := range ys {
		ys[y] = uint8(y)
	}
	for x := range 256 {
		for i := range xs {
			xs[i] = uint8(x)
		}
		c.loop(t.tab[x<<8:(x+1)<<8], xs[:], ys[:], float64(m))
	}
	c.tables[c.nextT.Add(1)%axpyTables].Store(t)
	return t
}

// byteMapMin is the smallest buffer for which Scale and Div build the
// call's map: past its 256 entries, the map costs less than the loop.
const byteMapMin = 257

// axpyTableMin is the smallest buffer for which Axpy builds a table for a
// new factor: about as many elements as the table has entries.
const axpyTableMin = 1 << 16

// axpyTable holds a one-byte format's Axpy results for factor m, indexed by
// a<<8 | b. Immutable once published.
type axpyTable struct {
	m   float32
	tab [1 << 16]uint8
}
