package reduce

import (
	"math"
	"sync"
	"unsafe"
)

// The pure-Go kernels. They are the reference the SIMD kernels must match
// bit for bit, the tail handlers of the AVX2 kernels, and the only kernels
// on other architectures. Loops work on typed views of the byte buffers and
// go four elements at a time through array pointers, so the compiler checks
// bounds once per group instead of once per element.

type integer interface {
	~int8 | ~uint8 | ~int32 | ~uint32 | ~int64 | ~uint64
}

type float interface{ ~float32 | ~float64 }

// view reinterprets b as a slice of T (native byte order). The caller
// guarantees len(b) is a multiple of T's size and, where the architecture
// needs it, that b is aligned (see typed).
func view[T any](b []byte) []T {
	var zero T
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b))/unsafe.Sizeof(zero))
}

// typed adapts a kernel on element slices to a Func on byte slices.
func typed[T any](kernel func(dst, a, b []T)) Func {
	return func(dst, a, b []byte) {
		if mustAlign && anyMisaligned[T](dst, a, b) {
			bounce(func(d, x, y []T, _ struct{}) { kernel(d, x, y) }, dst, a, b, struct{}{})
			return
		}
		kernel(view[T](dst), view[T](a), view[T](b))
	}
}

// typedParam is typed for kernels that take one extra argument (a scale
// factor or a divisor).
func typedParam[T, P any](kernel func(dst, a, b []T, p P)) func(dst, a, b []byte, p P) {
	return func(dst, a, b []byte, p P) {
		if mustAlign && anyMisaligned[T](dst, a, b) {
			bounce(kernel, dst, a, b, p)
			return
		}
		kernel(view[T](dst), view[T](a), view[T](b), p)
	}
}

func anyMisaligned[T any](dst, a, b []byte) bool {
	var zero T
	align := unsafe.Alignof(zero)
	return uintptr(unsafe.Pointer(unsafe.SliceData(dst)))%align != 0 ||
		uintptr(unsafe.Pointer(unsafe.SliceData(a)))%align != 0 ||
		uintptr(unsafe.Pointer(unsafe.SliceData(b)))%align != 0
}

// bounce runs kernel through aligned stack buffers, for architectures whose
// loads fault on misaligned words.
func bounce[T, P any](kernel func(dst, a, b []T, p P), dst, a, b []byte, p P) {
	var bufs [3][32]uint64
	d := unsafe.Slice((*byte)(unsafe.Pointer(&bufs[0])), 256)
	x := unsafe.Slice((*byte)(unsafe.Pointer(&bufs[1])), 256)
	y := unsafe.Slice((*byte)(unsafe.Pointer(&bufs[2])), 256)
	for len(dst) > 0 {
		n := min(len(dst), 256)
		copy(x, a[:n])
		copy(y, b[:n])
		kernel(view[T](d[:n]), view[T](x[:n]), view[T](y[:n]), p)
		copy(dst, d[:n])
		dst, a, b = dst[n:], a[n:], b[n:]
	}
}

func sumLoop[T integer | float](dst, a, b []T) {
	n := len(dst)
	a, b = a[:n], b[:n]
	i := 0
	for ; i+4 <= n; i += 4 {
		d, x, y := (*[4]T)(dst[i:]), (*[4]T)(a[i:]), (*[4]T)(b[i:])
		d[0], d[1], d[2], d[3] = x[0]+y[0], x[1]+y[1], x[2]+y[2], x[3]+y[3]
	}
	for ; i < n; i++ {
		dst[i] = a[i] + b[i]
	}
}

func prodLoop[T integer | float](dst, a, b []T) {
	n := len(dst)
	a, b = a[:n], b[:n]
	i := 0
	for ; i+4 <= n; i += 4 {
		d, x, y := (*[4]T)(dst[i:]), (*[4]T)(a[i:]), (*[4]T)(b[i:])
		d[0], d[1], d[2], d[3] = x[0]*y[0], x[1]*y[1], x[2]*y[2], x[3]*y[3]
	}
	for ; i < n; i++ {
		dst[i] = a[i] * b[i]
	}
}

func minLoop[T integer](dst, a, b []T) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = min(a[i], b[i])
	}
}

func maxLoop[T integer](dst, a, b []T) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = max(a[i], b[i])
	}
}

// maxF32 is x86 MAXPS (b unless a > b, so b when either is NaN) plus the
// signed-zero rule: equal operands combine as a&b, which turns {+0,-0} into +0.
func maxF32(a, b float32) float32 {
	if a == b {
		return math.Float32frombits(math.Float32bits(a) & math.Float32bits(b))
	}
	if a > b {
		return a
	}
	return b
}

// minF32 is MINPS (b unless a < b) plus a|b for equal operands: {+0,-0} gives -0.
func minF32(a, b float32) float32 {
	if a == b {
		return math.Float32frombits(math.Float32bits(a) | math.Float32bits(b))
	}
	if a < b {
		return a
	}
	return b
}

func maxF64(a, b float64) float64 {
	if a == b {
		return math.Float64frombits(math.Float64bits(a) & math.Float64bits(b))
	}
	if a > b {
		return a
	}
	return b
}

func minF64(a, b float64) float64 {
	if a == b {
		return math.Float64frombits(math.Float64bits(a) | math.Float64bits(b))
	}
	if a < b {
		return a
	}
	return b
}

func maxF32Loop(dst, a, b []float32) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = maxF32(a[i], b[i])
	}
}

func minF32Loop(dst, a, b []float32) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = minF32(a[i], b[i])
	}
}

func maxF64Loop(dst, a, b []float64) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = maxF64(a[i], b[i])
	}
}

func minF64Loop(dst, a, b []float64) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = minF64(a[i], b[i])
	}
}

// float16: widen, compute in float32, round back once. The loops inline the
// conversions for normal numbers and call the full ones only for zeros,
// subnormals, infinities and NaNs (operands or result); calling them for
// every element would cost several times more.

func sumF16(dst, a, b []uint16) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		x, okx := widenF16Normal(a[i])
		y, oky := widenF16Normal(b[i])
		r, ok := narrowF16Normal(x + y)
		if !(okx && oky && ok) {
			r = F32ToF16(F16ToF32(a[i]) + F16ToF32(b[i]))
		}
		dst[i] = r
	}
}

func prodF16(dst, a, b []uint16) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		x, okx := widenF16Normal(a[i])
		y, oky := widenF16Normal(b[i])
		r, ok := narrowF16Normal(x * y)
		if !(okx && oky && ok) {
			r = F32ToF16(F16ToF32(a[i]) * F16ToF32(b[i]))
		}
		dst[i] = r
	}
}

func minF16(dst, a, b []uint16) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		x, okx := widenF16Normal(a[i])
		y, oky := widenF16Normal(b[i])
		r, ok := narrowF16Normal(minF32(x, y))
		if !(okx && oky && ok) {
			r = F32ToF16(minF32(F16ToF32(a[i]), F16ToF32(b[i])))
		}
		dst[i] = r
	}
}

func maxF16(dst, a, b []uint16) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		x, okx := widenF16Normal(a[i])
		y, oky := widenF16Normal(b[i])
		r, ok := narrowF16Normal(maxF32(x, y))
		if !(okx && oky && ok) {
			r = F32ToF16(maxF32(F16ToF32(a[i]), F16ToF32(b[i])))
		}
		dst[i] = r
	}
}

// bfloat16: as float16. Min and Max pick the raw operand bits (the SIMD
// kernels narrow a chosen operand without touching it, so a signalling NaN
// passes through unquieted, and so must it here).

func sumBF16(dst, a, b []uint16) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = F32ToBF16(BF16ToF32(a[i]) + BF16ToF32(b[i]))
	}
}

func prodBF16(dst, a, b []uint16) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = F32ToBF16(BF16ToF32(a[i]) * BF16ToF32(b[i]))
	}
}

func minBF16(dst, a, b []uint16) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = uint16(math.Float32bits(minF32(BF16ToF32(a[i]), BF16ToF32(b[i]))) >> 16)
	}
}

func maxBF16(dst, a, b []uint16) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = uint16(math.Float32bits(maxF32(BF16ToF32(a[i]), BF16ToF32(b[i]))) >> 16)
	}
}

// The generic fp8 kernels look each pair of inputs up in a 64 KiB table of
// the op's results, built on first use from the float32 op and the rounding
// of F32ToE4M3 or F32ToE5M2: they round exactly as widening, operating and
// narrowing would, at one load per element instead of a narrowing. (The
// SIMD sets widen, operate and narrow in vectors instead, faster still.)

// fp8Op is one op on one fp8 format.
type fp8Op struct {
	widen  *[256]float32
	op     func(x, y float32) float32
	narrow func(float32) uint8
	once   sync.Once
	table  *[1 << 16]uint8
}

func (f *fp8Op) results() *[1 << 16]uint8 {
	f.once.Do(func() {
		t := new([1 << 16]uint8)
		for i := range t {
			t[i] = f.narrow(f.op(f.widen[i>>8], f.widen[i&0xff]))
		}
		f.table = t
	})
	return f.table
}

// kernel reduces a and b into dst.
func (f *fp8Op) kernel(dst, a, b []uint8) {
	t := f.results()
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = t[uint16(a[i])<<8|uint16(b[i])]
	}
}

func addF32(x, y float32) float32 { return x + y }
func mulF32(x, y float32) float32 { return x * y }

// fp8Ops are the kernels' tables, by format and op.
var fp8Ops = func() map[DType]*[numOps + 1]*fp8Op {
	ops := map[DType]*[numOps + 1]*fp8Op{}
	for _, f := range []struct {
		dt     DType
		widen  *[256]float32
		narrow func(float32) uint8
	}{{Float8E4M3, &e4m3Table, F32ToE4M3}, {Float8E5M2, &e5m2Table, F32ToE5M2}} {
		ops[f.dt] = &[numOps + 1]*fp8Op{
			Sum:  {widen: f.widen, op: addF32, narrow: f.narrow},
			Prod: {widen: f.widen, op: mulF32, narrow: f.narrow},
			Min:  {widen: f.widen, op: minF32, narrow: f.narrow},
			Max:  {widen: f.widen, op: maxF32, narrow: f.narrow},
		}
	}
	return ops
}()

// intKernels fills the four kernels of one integer type.
func intKernels[T integer](t *kernelTable, dt DType) {
	t[dt] = [numOps + 1]Func{
		Sum:  typed(sumLoop[T]),
		Prod: typed(prodLoop[T]),
		Min:  typed(minLoop[T]),
		Max:  typed(maxLoop[T]),
	}
}

func genericSet() *kernelSet {
	s := &kernelSet{name: "generic", scale: scaleFuncs, axpy: axpyFuncs}
	t := &s.funcs
	intKernels[int8](t, Int8)
	intKernels[uint8](t, Uint8)
	intKernels[int32](t, Int32)
	intKernels[uint32](t, Uint32)
	intKernels[int64](t, Int64)
	intKernels[uint64](t, Uint64)
	t[Float32] = [numOps + 1]Func{
		Sum: typed(sumLoop[float32]), Prod: typed(prodLoop[float32]),
		Min: typed(minF32Loop), Max: typed(maxF32Loop),
	}
	t[Float64] = [numOps + 1]Func{
		Sum: typed(sumLoop[float64]), Prod: typed(prodLoop[float64]),
		Min: typed(minF64Loop), Max: typed(maxF64Loop),
	}
	t[Float16] = [numOps + 1]Func{Sum: typed(sumF16), Prod: typed(prodF16), Min: typed(minF16), Max: typed(maxF16)}
	t[BFloat16] = [numOps + 1]Func{Sum: typed(sumBF16), Prod: typed(prodBF16), Min: typed(minBF16), Max: typed(maxBF16)}
	for _, dt := range []DType{Float8E4M3, Float8E5M2} {
		for _, op := range []Op{Sum, Prod, Min, Max} {
			t[dt][op] = typed(fp8Ops[dt][op].kernel)
		}
	}
	return s
}
