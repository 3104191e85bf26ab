package reduce

import (
	"math/rand/v2"
	"testing"
)

// Benchmarks report GB/s of output: b.SetBytes is the dst size. Compare
// BenchmarkSum with BenchmarkCopy (copy() of the same output bytes, the
// memory-bound floor) and BenchmarkGoLoop (a plain Go loop over []float32).
//
//	go test -run='^$' -bench=. -count=5 ./internal/reduce/

var benchSizes = []struct {
	name  string
	bytes int
}{{"64KiB", 64 << 10}, {"16MiB", 16 << 20}}

// benchBuffers returns dst, a and b of n bytes holding normal values of dt
// in [1, 2) (subnormal operands would measure microcode assists instead);
// for the fp8 formats, whose kernels look pairs up in a table, any value
// but NaN, so that the lookups spread over the table as real data's do.
func benchBuffers(dt DType, n int) (dst, a, b []byte) {
	dst, a, b = make([]byte, n), make([]byte, n), make([]byte, n)
	rng := rand.New(rand.NewPCG(7, 8))
	if dt == Float8E4M3 || dt == Float8E5M2 {
		for _, buf := range [][]byte{a, b} {
			for i := range buf {
				for buf[i] = byte(rng.Uint32()); buf[i]&0x7f >= 0x7c; buf[i] = byte(rng.Uint32()) {
				}
			}
		}
		return dst, a, b
	}
	for i := 0; i < n; i += dt.Size() {
		storeElem(dt, a[i:], encodeFloat(dt, roundFormat(formats[dt], 1+rng.Float64())))
		storeElem(dt, b[i:], encodeFloat(dt, roundFormat(formats[dt], 1+rng.Float64())))
	}
	return dst, a, b
}

// benchImpls is the active kernel set and the generic one.
func benchImpls() []*kernelSet {
	sets := []*kernelSet{active.Load()}
	if sets[0] != implementations[0] {
		sets = append(sets, implementations[0])
	}
	return sets
}

func BenchmarkSum(b *testing.B) {
	for _, dt := range []DType{Float32, BFloat16, Float16, Float64, Float8E4M3, Float8E5M2} {
		b.Run(dt.String(), func(b *testing.B) {
			for _, size := range benchSizes {
				b.Run(size.name, func(b *testing.B) {
					dst, x, y := benchBuffers(dt, size.bytes)
					for _, set := range benchImpls() {
						kernel := set.funcs[dt][Sum]
						b.Run(set.name, func(b *testing.B) {
							b.SetBytes(int64(size.bytes))
							for b.Loop() {
								kernel(dst, x, y)
							}
						})
					}
				})
			}
		})
	}
}

// BenchmarkSumInPlace accumulates into a (dst == a), the common pattern of
// a reduce-scatter step.
func BenchmarkSumInPlace(b *testing.B) {
	for _, dt := range []DType{Float32, BFloat16} {
		b.Run(dt.String()+"/16MiB", func(b *testing.B) {
			_, x, y := benchBuffers(dt, 16<<20)
			kernel := Lookup(dt, Sum)
			b.SetBytes(16 << 20)
			for b.Loop() {
				kernel(x, x, y)
			}
		})
	}
}

func BenchmarkCopy(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(size.name, func(b *testing.B) {
			// Filled from benchBuffers: a never-written source would be backed
			// by the kernel's shared zero page and read from cache.
			dst, src, _ := benchBuffers(Float32, size.bytes)
			b.SetBytes(int64(size.bytes))
			for b.Loop() {
				copy(dst, src)
			}
		})
	}
}

//go:noinline
func goLoopSum(dst, a, b []float32) {
	for i := range dst {
		dst[i] = a[i] + b[i]
	}
}

func BenchmarkGoLoop(b *testing.B) {
	b.Run("float32", func(b *testing.B) {
		b.Run("64KiB", func(b *testing.B) {
			dst, x, y := benchBuffers(Float32, 64<<10)
			d, xs, ys := view[float32](dst), view[float32](x), view[float32](y)
			b.SetBytes(64 << 10)
			for b.Loop() {
				goLoopSum(d, xs, ys)
			}
		})
	})
}

// BenchmarkScaling: PreMulSum and Avg's passes over a buffer (Scale on each
// rank's input, Axpy at every reduction step of a float type, Div once on
// integer results) for the float types, with the active kernel set and the
// generic one. Div is generic only.
func BenchmarkScaling(b *testing.B) {
	for _, dt := range []DType{Float32, Float16, BFloat16, Float8E4M3, Float8E5M2} {
		b.Run(dt.String(), func(b *testing.B) {
			for _, size := range benchSizes {
				dst, x, y := benchBuffers(dt, size.bytes)
				for _, set := range benchImpls() {
					scale, axpy := set.scale[dt], set.axpy[dt]
					b.Run("Scale/"+size.name+"/"+set.name, func(b *testing.B) {
						b.SetBytes(int64(size.bytes))
						for b.Loop() {
							scale(dst, x, 0.125)
						}
					})
					b.Run("Axpy/"+size.name+"/"+set.name, func(b *testing.B) {
						b.SetBytes(int64(size.bytes))
						for b.Loop() {
							axpy(dst, x, y, 0.125)
						}
					})
					// A PreMulSum scalar that changes on every call: the
					// fp8 formats get no table for it.
					b.Run("AxpyNewFactor/"+size.name+"/"+set.name, func(b *testing.B) {
						b.SetBytes(int64(size.bytes))
						s := 1.0
						for b.Loop() {
							s += 1.0 / 1024
							axpy(dst, x, y, s)
						}
					})
				}
				b.Run("Div/"+size.name, func(b *testing.B) {
					b.SetBytes(int64(size.bytes))
					for b.Loop() {
						Div(dt)(dst, x, 3)
					}
				})
			}
		})
	}
}

// BenchmarkDiv: an integer Avg's one pass over the result, dividing by the
// rank count.
func BenchmarkDiv(b *testing.B) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, dt := range []DType{Int8, Int32, Uint32, Int64} {
		for _, size := range benchSizes {
			src, dst := make([]byte, size.bytes), make([]byte, size.bytes)
			for i := range src {
				src[i] = byte(rng.Uint32())
			}
			b.Run(dt.String()+"/"+size.name, func(b *testing.B) {
				b.SetBytes(int64(size.bytes))
				for b.Loop() {
					Div(dt)(dst, src, 7)
				}
			})
		}
	}
}

// BenchmarkProd8: the 8-bit Prod, which has no byte multiply instruction
// (the SIMD sets multiply 16-bit lanes twice).
func BenchmarkProd8(b *testing.B) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, size := range benchSizes {
		dst, x, y := make([]byte, size.bytes), make([]byte, size.bytes), make([]byte, size.bytes)
		for i := range x {
			x[i], y[i] = byte(rng.Uint32()), byte(rng.Uint32())
		}
		for _, set := range benchImpls() {
			kernel := set.funcs[Int8][Prod]
			b.Run(size.name+"/"+set.name, func(b *testing.B) {
				b.SetBytes(int64(size.bytes))
				for b.Loop() {
					kernel(dst, x, y)
				}
			})
		}
	}
}
