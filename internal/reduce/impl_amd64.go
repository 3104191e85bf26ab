//go:build amd64 && !purego

package reduce

import (
	"math"
	"unsafe"

	"golang.org/x/sys/cpu"
)

// asmKernel is the signature of every kernel in kernels_amd64.s: n counts
// bytes, and stream asks for non-temporal stores (dst must then be aligned
// to the kernel's vector size).
type asmKernel func(dst, a, b *byte, n int, stream bool)

// streamThreshold is the output size in bytes from which kernels write dst
// with non-temporal stores when dst is a separate buffer. Below it the
// result is likely to be read again soon (sent, or reduced into again) and
// is better left in cache; above it the buffers outgrow the caches, and
// skipping dst's read-for-ownership saves a quarter of the memory traffic.
// In place (dst == a or b) the line was just read, so a normal store is
// cheaper. See docs/PERFORMANCE.md for the measurements.
const streamThreshold = 1 << 20

// simdSets returns the SIMD kernel sets this CPU and OS support, slowest
// first. x/sys/cpu only reports AVX and AVX-512 when the OS saves their
// register state.
func simdSets() []*kernelSet {
	return simdSetsStreamingFrom(streamThreshold, "")
}

// streamingSets returns the SIMD sets with non-temporal stores used at every
// size, so that tests cover that path on small buffers.
func streamingSets() []*kernelSet { return simdSetsStreamingFrom(0, "+stream") }

func simdSetsStreamingFrom(threshold int, suffix string) []*kernelSet {
	var sets []*kernelSet
	if hasAVX2() {
		sets = append(sets, avx2Set(threshold, suffix))
	}
	if hasAVX512() {
		sets = append(sets, avx512Set(threshold, suffix))
	}
	return sets
}

func hasAVX2() bool {
	const f16cBit = 1 << 29 // CPUID.1:ECX.F16C; x/sys/cpu does not report it
	return cpu.X86.HasAVX2 && cpuidECX(1, 0)&f16cBit != 0
}

func hasAVX512() bool {
	x := &cpu.X86
	return x.HasAVX512F && x.HasAVX512BW && x.HasAVX512VL && x.HasAVX512DQ && hasAVX2()
}

// avx512Set takes every kernel from assembly. The AVX-512 kernels finish
// any length with a masked vector, so step is 1.
func avx512Set(streamFrom int, suffix string) *kernelSet {
	s := genericSet()
	s.name = "avx512" + suffix
	t := &s.funcs
	set := func(dt DType, op Op, k asmKernel) { t[dt][op] = simdKernel(dt, k, 1, 64, streamFrom, t[dt][op]) }
	set(Float32, Sum, sumF32AVX512)
	set(Float32, Prod, prodF32AVX512)
	set(Float32, Min, minF32AVX512)
	set(Float32, Max, maxF32AVX512)
	set(Float64, Sum, sumF64AVX512)
	set(Float64, Prod, prodF64AVX512)
	set(Float64, Min, minF64AVX512)
	set(Float64, Max, maxF64AVX512)
	set(Float16, Sum, sumF16AVX512)
	set(Float16, Prod, prodF16AVX512)
	set(Float16, Min, minF16AVX512)
	set(Float16, Max, maxF16AVX512)
	set(BFloat16, Sum, sumBF16AVX512)
	set(BFloat16, Prod, prodBF16AVX512)
	set(BFloat16, Min, minBF16AVX512)
	set(BFloat16, Max, maxBF16AVX512)
	set(Int8, Sum, sum8AVX512)
	set(Uint8, Sum, sum8AVX512)
	set(Int8, Prod, prod8AVX512)
	set(Uint8, Prod, prod8AVX512)
	set(Int8, Min, minI8AVX512)
	set(Int8, Max, maxI8AVX512)
	set(Uint8, Min, minU8AVX512)
	set(Uint8, Max, maxU8AVX512)
	for _, dt := range []DType{Int32, Uint32} {
		set(dt, Sum, sum32AVX512)
		set(dt, Prod, prod32AVX512)
	}
	set(Int32, Min, minI32AVX512)
	set(Int32, Max, maxI32AVX512)
	set(Uint32, Min, minU32AVX512)
	set(Uint32, Max, maxU32AVX512)
	for _, dt := range []DType{Int64, Uint64} {
		set(dt, Sum, sum64AVX512)
		set(dt, Prod, prod64AVX512)
	}
	set(Int64, Min, minI64AVX512)
	set(Int64, Max, maxI64AVX512)
	set(Uint64, Min, minU64AVX512)
	set(Uint64, Max, maxU64AVX512)
	s.setScaling(Float32, 1, 64, streamFrom, scaleF32AVX512, axpyF32AVX512)
	s.setScaling(Float16, 1, 64, streamFrom, scaleF16AVX512, axpyF16AVX512)
	s.setScaling(BFloat16, 1, 64, streamFrom, scaleBF16AVX512, axpyBF16AVX512)
	set(Float8E4M3, Sum, sumE4M3AVX512)
	set(Float8E4M3, Prod, prodE4M3AVX512)
	set(Float8E4M3, Min, minE4M3AVX512)
	set(Float8E4M3, Max, maxE4M3AVX512)
	set(Float8E5M2, Sum, sumE5M2AVX512)
	set(Float8E5M2, Prod, prodE5M2AVX512)
	set(Float8E5M2, Min, minE5M2AVX512)
	set(Float8E5M2, Max, maxE5M2AVX512)
	s.setScaling(Float8E4M3, 1, 64, streamFrom, scaleE4M3AVX512, axpyE4M3AVX512)
	s.setScaling(Float8E5M2, 1, 64, streamFrom, scaleE5M2AVX512, axpyE5M2AVX512)
	return s
}

// avx2Set: AVX2 has no 64-bit integer min/max/multiply, so those stay
// generic. The AVX2 kernels take whole steps of 32 bytes (16
// for float16, 8 for the fp8 formats); the generic kernel, which rounds
// identically, finishes the buffer.
func avx2Set(streamFrom int, suffix string) *kernelSet {
	s := genericSet()
	s.name = "avx2" + suffix
	t := &s.funcs
	set := func(dt DType, op Op, step int, k asmKernel) {
		t[dt][op] = simdKernel(dt, k, step, 32, streamFrom, t[dt][op])
	}
	set(Float32, Sum, 32, sumF32AVX2)
	set(Float32, Prod, 32, prodF32AVX2)
	set(Float32, Min, 32, minF32AVX2)
	set(Float32, Max, 32, maxF32AVX2)
	set(Float64, Sum, 32, sumF64AVX2)
	set(Float64, Prod, 32, prodF64AVX2)
	set(Float64, Min, 32, minF64AVX2)
	set(Float64, Max, 32, maxF64AVX2)
	set(Float16, Sum, 16, sumF16AVX2)
	set(Float16, Prod, 16, prodF16AVX2)
	set(Float16, Min, 16, minF16AVX2)
	set(Float16, Max, 16, maxF16AVX2)
	set(BFloat16, Sum, 32, sumBF16AVX2)
	set(BFloat16, Prod, 32, prodBF16AVX2)
	set(BFloat16, Min, 32, minBF16AVX2)
	set(BFloat16, Max, 32, maxBF16AVX2)
	// E5M2's reductions go through binary16, 8 codes a step; like the fp8
	// Axpy below, they store 8 bytes at a time and never stream.
	const never = math.MaxInt
	for op, k := range map[Op]asmKernel{Sum: sumE5M2AVX2, Prod: prodE5M2AVX2, Min: minE5M2AVX2, Max: maxE5M2AVX2} {
		t[Float8E5M2][op] = simdKernel(Float8E5M2, k, 8, 32, never, t[Float8E5M2][op])
	}
	set(Int8, Sum, 32, sum8AVX2)
	set(Uint8, Sum, 32, sum8AVX2)
	set(Int8, Prod, 32, prod8AVX2)
	set(Uint8, Prod, 32, prod8AVX2)
	set(Int8, Min, 32, minI8AVX2)
	set(Int8, Max, 32, maxI8AVX2)
	set(Uint8, Min, 32, minU8AVX2)
	set(Uint8, Max, 32, maxU8AVX2)
	for _, dt := range []DType{Int32, Uint32} {
		set(dt, Sum, 32, sum32AVX2)
		set(dt, Prod, 32, prod32AVX2)
	}
	set(Int32, Min, 32, minI32AVX2)
	set(Int32, Max, 32, maxI32AVX2)
	set(Uint32, Min, 32, minU32AVX2)
	set(Uint32, Max, 32, maxU32AVX2)
	set(Int64, Sum, 32, sum64AVX2)
	set(Uint64, Sum, 32, sum64AVX2)
	s.setScaling(Float32, 32, 32, streamFrom, scaleF32AVX2, axpyF32AVX2)
	s.setScaling(Float16, 16, 32, streamFrom, scaleF16AVX2, axpyF16AVX2)
	s.setScaling(BFloat16, 32, 32, streamFrom, scaleBF16AVX2, axpyBF16AVX2)
	// fp8 Axpy computes where the generic set has no table for the factor
	// (12x faster than the Go loop) and looks up where it has one (1.5x
	// faster than this kernel). E4M3's reductions and both formats' Scale
	// stay generic: their tables are as fast as computing with AVX2 (E5M2's
	// reductions above are faster, through binary16). See
	// docs/PERFORMANCE.md.
	for dt, k := range map[DType]asmScaling{Float8E4M3: axpyE4M3AVX2, Float8E5M2: axpyE5M2AVX2} {
		c := axpyCaches[dt]
		s.axpy[dt] = c.axpy(simdScaling(dt, k, 8, 32, never, c.loop))
	}
	return s
}

// setScaling puts dt's Scale and Axpy kernels in front of the set's
// generic loops. The Scale kernels take src as both inputs and ignore b.
func (s *kernelSet) setScaling(dt DType, step, vecBytes, streamFrom int, scale, axpy asmScaling) {
	genericScale := s.scale[dt]
	sc := simdScaling(dt, scale, step, vecBytes, streamFrom, func(dst, a, _ []byte, f float64) { genericScale(dst, a, f) })
	s.scale[dt] = func(dst, src []byte, f float64) { sc(dst, src, src, f) }
	s.axpy[dt] = simdScaling(dt, axpy, step, vecBytes, streamFrom, s.axpy[dt])
}

// simdKernel wraps an assembly kernel that processes multiples of step bytes
// (a power of two; 1 for kernels that finish any length themselves). The
// generic kernel, which rounds identically, handles what the assembly does
// not: the unaligned head of a streamed dst and the sub-step tail. Outputs of
// streamFrom bytes or more are written with non-temporal stores.
func simdKernel(dt DType, k asmKernel, step, vecBytes, streamFrom int, generic Func) Func {
	size := dt.Size()
	return func(dst, a, b []byte) {
		n := len(dst)
		if n == 0 {
			return
		}
		// Indexing the last byte makes a too-short input panic instead of
		// letting the assembly read past it; it costs two compares.
		_, _ = a[n-1], b[n-1]
		start, end, stream := simdSpan(dst, a, b, size, step, vecBytes, streamFrom)
		if start > 0 {
			generic(dst[:start], a[:start], b[:start])
		}
		if end > start {
			k(&dst[start], &a[start], &b[start], end-start, stream)
		}
		if end < n {
			generic(dst[end:], a[end:n], b[end:n])
		}
	}
}

// simdSpan splits a non-empty dst for a SIMD kernel: the kernel takes
// dst[start:end], a whole number of steps, streaming its stores if stream;
// the generic kernel takes the rest. Non-temporal stores need dst aligned to
// the vector, so streaming starts at the first aligned element boundary
// (start > 0 only then), and only where dst is a separate buffer.
func simdSpan(dst, a, b []byte, size, step, vecBytes, streamFrom int) (start, end int, stream bool) {
	n := len(dst)
	if n >= streamFrom && &dst[0] != &a[0] && &dst[0] != &b[0] {
		head := min(int(-uintptr(unsafe.Pointer(&dst[0])))&(vecBytes-1), n)
		if head%size == 0 {
			start, stream = head, true
		}
	}
	return start, start + (n-start)&^(step-1), stream
}

// asmScaling is the signature of the Scale and Axpy kernels: asmKernel's
// with the factor appended.
type asmScaling func(dst, a, b *byte, n int, stream bool, s float32)

// simdScaling wraps a Scale or Axpy kernel as simdKernel wraps a reduction
// kernel. A NaN factor goes to the generic loops: multiplying by it yields
// its own payload, which the bfloat16 kernels' integer rounding could carry
// into the exponent; it is no case worth a vector path.
func simdScaling(dt DType, k asmScaling, step, vecBytes, streamFrom int, generic axpyFunc) axpyFunc {
	size := dt.Size()
	return func(dst, a, b []byte, s float64) {
		n := len(dst)
		m := float32(s)
		if n == 0 || m != m {
			generic(dst, a, b, s)
			return
		}
		_, _ = a[n-1], b[n-1]
		start, end, stream := simdSpan(dst, a, b, size, step, vecBytes, streamFrom)
		if start > 0 {
			generic(dst[:start], a[:start], b[:start], s)
		}
		if end > start {
			k(&dst[start], &a[start], &b[start], end-start, stream, m)
		}
		if end < n {
			generic(dst[end:], a[end:n], b[end:n], s)
		}
	}
}

// cpuidECX returns ECX of CPUID(leaf, subleaf).
func cpuidECX(leaf, subleaf uint32) uint32

// Kernels in kernels_amd64.s.

//go:noescape
func sumF32AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func prodF32AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func minF32AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func maxF32AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func sumF64AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func prodF64AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func minF64AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func maxF64AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func sum8AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func prod8AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func minI8AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func maxI8AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func minU8AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func maxU8AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func sum32AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func prod32AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func minI32AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func maxI32AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func minU32AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func maxU32AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func sum64AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func prod64AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func minI64AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func maxI64AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func minU64AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func maxU64AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func sumF16AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func prodF16AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func minF16AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func maxF16AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func sumBF16AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func prodBF16AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func minBF16AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func maxBF16AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func sumF32AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func prodF32AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func minF32AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func maxF32AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func sumF64AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func prodF64AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func minF64AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func maxF64AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func sum8AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func prod8AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func minI8AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func maxI8AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func minU8AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func maxU8AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func sum32AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func prod32AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func minI32AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func maxI32AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func minU32AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func maxU32AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func sum64AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func sumF16AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func prodF16AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func minF16AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func maxF16AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func sumBF16AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func prodBF16AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func minBF16AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func maxBF16AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func axpyF32AVX512(dst, a, b *byte, n int, stream bool, s float32)

//go:noescape
func scaleF32AVX512(dst, a, b *byte, n int, stream bool, s float32)

//go:noescape
func axpyF16AVX512(dst, a, b *byte, n int, stream bool, s float32)

//go:noescape
func scaleF16AVX512(dst, a, b *byte, n int, stream bool, s float32)

//go:noescape
func axpyBF16AVX512(dst, a, b *byte, n int, stream bool, s float32)

//go:noescape
func scaleBF16AVX512(dst, a, b *byte, n int, stream bool, s float32)

//go:noescape
func axpyF32AVX2(dst, a, b *byte, n int, stream bool, s float32)

//go:noescape
func scaleF32AVX2(dst, a, b *byte, n int, stream bool, s float32)

//go:noescape
func axpyF16AVX2(dst, a, b *byte, n int, stream bool, s float32)

//go:noescape
func scaleF16AVX2(dst, a, b *byte, n int, stream bool, s float32)

//go:noescape
func axpyBF16AVX2(dst, a, b *byte, n int, stream bool, s float32)

//go:noescape
func scaleBF16AVX2(dst, a, b *byte, n int, stream bool, s float32)

//go:noescape
func sumE4M3AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func prodE4M3AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func minE4M3AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func maxE4M3AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func sumE5M2AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func prodE5M2AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func minE5M2AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func maxE5M2AVX512(dst, a, b *byte, n int, stream bool)

//go:noescape
func axpyE4M3AVX512(dst, a, b *byte, n int, stream bool, s float32)

//go:noescape
func scaleE4M3AVX512(dst, a, b *byte, n int, stream bool, s float32)

//go:noescape
func axpyE5M2AVX512(dst, a, b *byte, n int, stream bool, s float32)

//go:noescape
func scaleE5M2AVX512(dst, a, b *byte, n int, stream bool, s float32)

//go:noescape
func axpyE4M3AVX2(dst, a, b *byte, n int, stream bool, s float32)

//go:noescape
func axpyE5M2AVX2(dst, a, b *byte, n int, stream bool, s float32)

//go:noescape
func sumE5M2AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func prodE5M2AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func minE5M2AVX2(dst, a, b *byte, n int, stream bool)

//go:noescape
func maxE5M2AVX2(dst, a, b *byte, n int, stream bool)
