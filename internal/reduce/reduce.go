// Package reduce holds the element-wise reduction kernels of gccl's host
// collectives: SIMD (AVX2 / AVX-512, F16C for float16) chosen at run time,
// with a pure-Go fallback.
//
// # Semantics
//
// Every kernel computes dst[i] = a[i] op b[i] on raw little-endian (native)
// byte buffers:
//
//   - Integer Sum and Prod wrap (two's complement); Min and Max are exact.
//   - float32 and float64 compute in their own precision.
//   - float16, bfloat16 and the two fp8 formats widen to float32, compute
//     and round back once to nearest-even. For Sum this equals a single
//     correct rounding of the exact sum, because float32 carries more than
//     twice the target precision plus two bits.
//   - Min and Max of floats are exact, and of two zeros of different sign
//     Max returns +0 and Min returns -0. With a NaN operand the result is
//     unspecified: in the current kernels it is b (quieted for float16 and
//     the fp8 formats), but callers must not rely on that.
//
// Every kernel set (generic, avx2, avx512) produces bit-identical results for
// every input, so ranks running different kernel sets still agree; only the
// payload of a NaN result may differ. The same holds for Scale and Axpy, the
// pre-scaling of Avg and PreMulSum, which the sets also provide. The
// bfloat16 SIMD kernels therefore narrow with integer round-to-nearest-even
// instead of AVX512-BF16's VCVTNEPS2BF16, which would flush subnormal values
// to zero. The SIMD kernels
// write outputs of 1 MiB or more that do not alias an input with
// non-temporal stores.
//
// The environment variable GCCL_REDUCE_IMPL=generic|avx2|avx512, read once
// at start-up, forces a lower kernel set; a name the CPU cannot run is
// ignored. The purego build tag compiles the generic kernels only.
package reduce

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"unsafe"

	"github.com/gccl/gccl/dtype"
)

// DType is the element type of a buffer: package dtype's DataType.
type DType = dtype.DataType

// The supported element types.
const (
	Int8       = dtype.Int8
	Uint8      = dtype.Uint8
	Int32      = dtype.Int32
	Uint32     = dtype.Uint32
	Int64      = dtype.Int64
	Uint64     = dtype.Uint64
	Float16    = dtype.Float16
	BFloat16   = dtype.BFloat16
	Float32    = dtype.Float32
	Float64    = dtype.Float64
	Float8E4M3 = dtype.Float8E4M3
	Float8E5M2 = dtype.Float8E5M2

	numDTypes = dtype.NumDataTypes
)

// Op is a reduction operator.
type Op uint8

// The supported reduction operators.
const (
	Sum Op = iota + 1
	Prod
	Min
	Max

	numOps = int(Max)
)

var opNames = [...]string{Sum: "sum", Prod: "prod", Min: "min", Max: "max"}

// Valid reports whether o is one of the defined operators.
func (o Op) Valid() bool { return o >= Sum && o <= Max }

func (o Op) String() string {
	if !o.Valid() {
		return "Op(" + strconv.Itoa(int(o)) + ")"
	}
	return opNames[o]
}

// Func computes dst[i] = a[i] op b[i] over len(dst)/Size elements.
// len(dst) == len(a) == len(b) and is a multiple of the element size; a
// shorter a or b panics rather than being read past its end. dst may be
// exactly the same memory as a or b, never a partial overlap. A Func never
// allocates and is safe for concurrent use.
type Func func(dst, a, b []byte)

// kernelTable maps (dtype, op) to a kernel; index 0 of each axis is unused.
type kernelTable [numDTypes + 1][numOps + 1]Func

// kernelSet is one complete family of kernels, e.g. all the AVX2 ones,
// with the Scale and Axpy loops of PreMulSum and Avg.
type kernelSet struct {
	name  string
	funcs kernelTable
	scale [numDTypes + 1]scaleFunc
	axpy  [numDTypes + 1]axpyFunc
}

var (
	// implementations lists the kernel sets this CPU can run, slowest first.
	implementations []*kernelSet
	// active is the set Lookup serves. It is atomic only so that tests can
	// switch sets while other goroutines look kernels up.
	active atomic.Pointer[kernelSet]
)

// implEnv names the environment variable that forces a kernel set.
const implEnv = "GCCL_REDUCE_IMPL"

func init() {
	initScaling() // before the sets, which start from its loops
	implementations = append([]*kernelSet{genericSet()}, simdSets()...)
	best := implementations[len(implementations)-1]
	if forced := findImpl(os.Getenv(implEnv)); forced != nil {
		best = forced
	}
	active.Store(best)
}

func findImpl(name string) *kernelSet {
	for _, s := range implementations {
		if s.name == name {
			return s
		}
	}
	return nil
}

// setImpl makes the named kernel set active and returns a function that
// restores the previous one; ok is false if the CPU cannot run that set.
// It exists for tests.
func setImpl(name string) (restore func(), ok bool) {
	s := findImpl(name)
	if s == nil {
		return func() {}, false
	}
	prev := active.Swap(s)
	return func() { active.Store(prev) }, true
}

// Impl names the kernel set in use: "avx512", "avx2" or "generic".
func Impl() string { return active.Load().name }

// Lookup returns the kernel for dt and op, or nil if either is invalid.
func Lookup(dt DType, op Op) Func {
	if !dt.Valid() || !op.Valid() {
		return nil
	}
	return active.Load().funcs[dt][op]
}

// ErrOverlap is returned by Reduce when dst partially overlaps an input.
var ErrOverlap = errors.New("reduce: dst partially overlaps an input")

// Reduce computes dst = a op b, checking its arguments first; it reports bad
// input as an error and never panics.
func Reduce(dt DType, op Op, dst, a, b []byte) error {
	switch {
	case !dt.Valid():
		return fmt.Errorf("reduce: invalid dtype %v", dt)
	case !op.Valid():
		return fmt.Errorf("reduce: invalid op %v", op)
	case len(a) != len(dst) || len(b) != len(dst):
		return fmt.Errorf("reduce: length mismatch: dst %d, a %d, b %d bytes", len(dst), len(a), len(b))
	case len(dst)%dt.Size() != 0:
		return fmt.Errorf("reduce: %d bytes is not a whole number of %v elements", len(dst), dt)
	case partialOverlap(dst, a) || partialOverlap(dst, b):
		return ErrOverlap
	}
	Lookup(dt, op)(dst, a, b)
	return nil
}

// partialOverlap reports whether x and y share memory without being the
// same slice start (exact aliasing is allowed).
func partialOverlap(x, y []byte) bool {
	if len(x) == 0 || len(y) == 0 {
		return false
	}
	xs := uintptr(unsafe.Pointer(unsafe.SliceData(x)))
	ys := uintptr(unsafe.Pointer(unsafe.SliceData(y)))
	if xs == ys {
		return false
	}
	return xs < ys+uintptr(len(y)) && ys < xs+uintptr(len(x))
}
