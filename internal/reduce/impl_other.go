//go:build !amd64 || purego

package reduce

// simdSets returns no SIMD kernel sets: only the generic kernels exist here.
func simdSets() []*kernelSet { return nil }

// streamingSets returns nothing: there are no non-temporal store paths.
func streamingSets() []*kernelSet { return nil }
