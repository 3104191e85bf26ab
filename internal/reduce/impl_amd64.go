//go:build amd64 && !purego

package reduce

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// asmKernel is the signature of every kernel in kernels_amd64.s; n counts
// bytes.
type asmKernel func(dst, a, b *byte, n int)

// simdSets returns the SIMD kernel sets this CPU and OS support, slowest
// first. x/sys/cpu only reports AVX and AVX-512 when the OS saves their
// register state.
func simdSets() []*kernelSet {
	var sets []*kernelSet
	if hasAVX2() {
		sets = append(sets, avx2Set())
	}
	if hasAVX512() {
		sets = append(sets, avx512Set())
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

// avx512Set takes every Float32, Float64, Float16, BFloat16 and integer kernel
// it has from assembly; Prod of 8-bit integers and the fp8 formats stay generic.
func avx512Set() *kernelSet {
	s := &kernelSet{name: "avx512", funcs: genericSet().funcs}
	t := &s.funcs
	whole := func(dt DType, op Op, k asmKernel) { t[dt][op] = wholeKernel(k) }
	whole(Float32, Sum, sumF32AVX512)
	whole(Float32, Prod, prodF32AVX512)
	whole(Float32, Min, minF32AVX512)
	whole(Float32, Max, maxF32AVX512)
	whole(Float64, Sum, sumF64AVX512)
	whole(Float64, Prod, prodF64AVX512)
	whole(Float64, Min, minF64AVX512)
	whole(Float64, Max, maxF64AVX512)
	whole(Float16, Sum, sumF16AVX512)
	whole(Float16, Prod, prodF16AVX512)
	whole(Float16, Min, minF16AVX512)
	whole(Float16, Max, maxF16AVX512)
	whole(BFloat16, Sum, sumBF16AVX512)
	whole(BFloat16, Prod, prodBF16AVX512)
	whole(BFloat16, Min, minBF16AVX512)
	whole(BFloat16, Max, maxBF16AVX512)
	whole(Int8, Sum, sum8AVX512)
	whole(Uint8, Sum, sum8AVX512)
	whole(Int8, Min, minI8AVX512)
	whole(Int8, Max, maxI8AVX512)
	whole(Uint8, Min, minU8AVX512)
	whole(Uint8, Max, maxU8AVX512)
	for _, dt := range []DType{Int32, Uint32} {
		whole(dt, Sum, sum32AVX512)
		whole(dt, Prod, prod32AVX512)
	}
	whole(Int32, Min, minI32AVX512)
	whole(Int32, Max, maxI32AVX512)
	whole(Uint32, Min, minU32AVX512)
	whole(Uint32, Max, maxU32AVX512)
	for _, dt := range []DType{Int64, Uint64} {
		whole(dt, Sum, sum64AVX512)
		whole(dt, Prod, prod64AVX512)
	}
	whole(Int64, Min, minI64AVX512)
	whole(Int64, Max, maxI64AVX512)
	whole(Uint64, Min, minU64AVX512)
	whole(Uint64, Max, maxU64AVX512)
	return s
}

// avx2Set: AVX2 has no 64-bit integer min/max/multiply nor byte multiply,
// so those and the fp8 formats stay generic.
func avx2Set() *kernelSet {
	s := &kernelSet{name: "avx2", funcs: genericSet().funcs}
	t := &s.funcs
	// The AVX2 kernels take whole steps; the generic kernel, which rounds
	// identically, finishes the buffer.
	body := func(dt DType, op Op, step int, k asmKernel) { t[dt][op] = stepKernel(k, step, t[dt][op]) }
	body(Float32, Sum, 32, sumF32AVX2)
	body(Float32, Prod, 32, prodF32AVX2)
	body(Float32, Min, 32, minF32AVX2)
	body(Float32, Max, 32, maxF32AVX2)
	body(Float64, Sum, 32, sumF64AVX2)
	body(Float64, Prod, 32, prodF64AVX2)
	body(Float64, Min, 32, minF64AVX2)
	body(Float64, Max, 32, maxF64AVX2)
	body(Float16, Sum, 16, sumF16AVX2)
	body(Float16, Prod, 16, prodF16AVX2)
	body(Float16, Min, 16, minF16AVX2)
	body(Float16, Max, 16, maxF16AVX2)
	body(BFloat16, Sum, 32, sumBF16AVX2)
	body(BFloat16, Prod, 32, prodBF16AVX2)
	body(BFloat16, Min, 32, minBF16AVX2)
	body(BFloat16, Max, 32, maxBF16AVX2)
	body(Int8, Sum, 32, sum8AVX2)
	body(Uint8, Sum, 32, sum8AVX2)
	body(Int8, Min, 32, minI8AVX2)
	body(Int8, Max, 32, maxI8AVX2)
	body(Uint8, Min, 32, minU8AVX2)
	body(Uint8, Max, 32, maxU8AVX2)
	for _, dt := range []DType{Int32, Uint32} {
		body(dt, Sum, 32, sum32AVX2)
		body(dt, Prod, 32, prod32AVX2)
	}
	body(Int32, Min, 32, minI32AVX2)
	body(Int32, Max, 32, maxI32AVX2)
	body(Uint32, Min, 32, minU32AVX2)
	body(Uint32, Max, 32, maxU32AVX2)
	body(Int64, Sum, 32, sum64AVX2)
	body(Uint64, Sum, 32, sum64AVX2)
	return s
}

// wholeKernel wraps a kernel that handles any length itself. Indexing the
// last byte of a and b makes a too-short input panic instead of letting the
// assembly read past it; it costs two compares per call.
func wholeKernel(k asmKernel) Func {
	return func(dst, a, b []byte) {
		n := len(dst)
		if n == 0 {
			return
		}
		_, _ = a[n-1], b[n-1]
		k(unsafe.SliceData(dst), unsafe.SliceData(a), unsafe.SliceData(b), n)
	}
}

// stepKernel wraps a kernel that only takes multiples of step bytes (a power
// of two) and finishes the rest with tail.
func stepKernel(k asmKernel, step int, tail Func) Func {
	return func(dst, a, b []byte) {
		n := len(dst)
		if n == 0 {
			return
		}
		_, _ = a[n-1], b[n-1]
		body := n &^ (step - 1)
		if body > 0 {
			k(unsafe.SliceData(dst), unsafe.SliceData(a), unsafe.SliceData(b), body)
		}
		if body < n {
			tail(dst[body:], a[body:n], b[body:n])
		}
	}
}

// cpuidECX returns ECX of CPUID(leaf, subleaf).
func cpuidECX(leaf, subleaf uint32) uint32

// Kernels in kernels_amd64.s.

//go:noescape
func sumF32AVX512(dst, a, b *byte, n int)

//go:noescape
func prodF32AVX512(dst, a, b *byte, n int)

//go:noescape
func minF32AVX512(dst, a, b *byte, n int)

//go:noescape
func maxF32AVX512(dst, a, b *byte, n int)

//go:noescape
func sumF64AVX512(dst, a, b *byte, n int)

//go:noescape
func prodF64AVX512(dst, a, b *byte, n int)

//go:noescape
func minF64AVX512(dst, a, b *byte, n int)

//go:noescape
func maxF64AVX512(dst, a, b *byte, n int)

//go:noescape
func sum8AVX512(dst, a, b *byte, n int)

//go:noescape
func minI8AVX512(dst, a, b *byte, n int)

//go:noescape
func maxI8AVX512(dst, a, b *byte, n int)

//go:noescape
func minU8AVX512(dst, a, b *byte, n int)

//go:noescape
func maxU8AVX512(dst, a, b *byte, n int)

//go:noescape
func sum32AVX512(dst, a, b *byte, n int)

//go:noescape
func prod32AVX512(dst, a, b *byte, n int)

//go:noescape
func minI32AVX512(dst, a, b *byte, n int)

//go:noescape
func maxI32AVX512(dst, a, b *byte, n int)

//go:noescape
func minU32AVX512(dst, a, b *byte, n int)

//go:noescape
func maxU32AVX512(dst, a, b *byte, n int)

//go:noescape
func sum64AVX512(dst, a, b *byte, n int)

//go:noescape
func prod64AVX512(dst, a, b *byte, n int)

//go:noescape
func minI64AVX512(dst, a, b *byte, n int)

//go:noescape
func maxI64AVX512(dst, a, b *byte, n int)

//go:noescape
func minU64AVX512(dst, a, b *byte, n int)

//go:noescape
func maxU64AVX512(dst, a, b *byte, n int)

//go:noescape
func sumF16AVX512(dst, a, b *byte, n int)

//go:noescape
func prodF16AVX512(dst, a, b *byte, n int)

//go:noescape
func minF16AVX512(dst, a, b *byte, n int)

//go:noescape
func maxF16AVX512(dst, a, b *byte, n int)

//go:noescape
func sumBF16AVX512(dst, a, b *byte, n int)

//go:noescape
func prodBF16AVX512(dst, a, b *byte, n int)

//go:noescape
func minBF16AVX512(dst, a, b *byte, n int)

//go:noescape
func maxBF16AVX512(dst, a, b *byte, n int)

//go:noescape
func sumF32AVX2(dst, a, b *byte, n int)

//go:noescape
func prodF32AVX2(dst, a, b *byte, n int)

//go:noescape
func minF32AVX2(dst, a, b *byte, n int)

//go:noescape
func maxF32AVX2(dst, a, b *byte, n int)

//go:noescape
func sumF64AVX2(dst, a, b *byte, n int)

//go:noescape
func prodF64AVX2(dst, a, b *byte, n int)

//go:noescape
func minF64AVX2(dst, a, b *byte, n int)

//go:noescape
func maxF64AVX2(dst, a, b *byte, n int)

//go:noescape
func sum8AVX2(dst, a, b *byte, n int)

//go:noescape
func minI8AVX2(dst, a, b *byte, n int)

//go:noescape
func maxI8AVX2(dst, a, b *byte, n int)

//go:noescape
func minU8AVX2(dst, a, b *byte, n int)

//go:noescape
func maxU8AVX2(dst, a, b *byte, n int)

//go:noescape
func sum32AVX2(dst, a, b *byte, n int)

//go:noescape
func prod32AVX2(dst, a, b *byte, n int)

//go:noescape
func minI32AVX2(dst, a, b *byte, n int)

//go:noescape
func maxI32AVX2(dst, a, b *byte, n int)

//go:noescape
func minU32AVX2(dst, a, b *byte, n int)

//go:noescape
func maxU32AVX2(dst, a, b *byte, n int)

//go:noescape
func sum64AVX2(dst, a, b *byte, n int)

//go:noescape
func sumF16AVX2(dst, a, b *byte, n int)

//go:noescape
func prodF16AVX2(dst, a, b *byte, n int)

//go:noescape
func minF16AVX2(dst, a, b *byte, n int)

//go:noescape
func maxF16AVX2(dst, a, b *byte, n int)

//go:noescape
func sumBF16AVX2(dst, a, b *byte, n int)

//go:noescape
func prodBF16AVX2(dst, a, b *byte, n int)

//go:noescape
func minBF16AVX2(dst, a, b *byte, n int)

//go:noescape
func maxBF16AVX2(dst, a, b *byte, n int)
