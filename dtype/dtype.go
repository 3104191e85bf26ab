// Package dtype is gccl's vocabulary of element types and reduction
// operations: DataType (NCCL's set), the Go element types a host slice may
// have (Scalar), the bit-pattern types of the narrow floats and their
// conversions, and Op. It imports nothing of gccl, so every layer (the
// kernels, the GPU engine, the communicator) speaks it; package comm
// re-exports all of it under the same names.
package dtype

import (
	"fmt"
	"strconv"
)

// DataType is the element type of a buffer. The values are gccl's own (the
// set is NCCL's).
type DataType uint8

// The element types.
const (
	Int8 DataType = iota + 1
	Uint8
	Int32
	Uint32
	Int64
	Uint64
	Float16  // IEEE binary16
	BFloat16 // bfloat16: the upper half of a float32
	Float32
	Float64
	Float8E4M3 // OCP FP8 E4M3FN: no infinities, max 448, NaN = S.1111.111
	Float8E5M2 // OCP FP8 E5M2: IEEE-like, has infinities

	// NumDataTypes is the largest DataType value, for tables indexed by
	// type.
	NumDataTypes = int(Float8E5M2)
)

// DataTypes lists every supported data type.
var DataTypes = []DataType{Int8, Uint8, Int32, Uint32, Int64, Uint64, Float16, BFloat16, Float32, Float64, Float8E4M3, Float8E5M2}

var names = [...]string{
	Int8: "int8", Uint8: "uint8", Int32: "int32", Uint32: "uint32",
	Int64: "int64", Uint64: "uint64", Float16: "float16", BFloat16: "bfloat16",
	Float32: "float32", Float64: "float64",
	Float8E4M3: "float8e4m3", Float8E5M2: "float8e5m2",
}

var sizes = [...]int{
	Int8: 1, Uint8: 1, Int32: 4, Uint32: 4, Int64: 8, Uint64: 8,
	Float16: 2, BFloat16: 2, Float32: 4, Float64: 8, Float8E4M3: 1, Float8E5M2: 1,
}

// Valid reports whether d is a supported data type.
func (d DataType) Valid() bool { return d >= Int8 && d <= Float8E5M2 }

// Size returns the size of one element in bytes, 0 for an unknown type.
func (d DataType) Size() int {
	if !d.Valid() {
		return 0
	}
	return sizes[d]
}

// IsFloat reports whether d is a floating-point type.
func (d DataType) IsFloat() bool { return d >= Float16 && d <= Float8E5M2 }

func (d DataType) String() string {
	if !d.Valid() {
		return "DataType(" + strconv.Itoa(int(d)) + ")"
	}
	return names[d]
}

// Host element types that have no Go built-in: raw bit patterns.
type (
	// Float16Bits is an IEEE binary16 value.
	Float16Bits uint16
	// BFloat16Bits is a bfloat16 value (the top half of a float32).
	BFloat16Bits uint16
	// Float8E4M3Bits is an OCP FP8 E4M3FN value.
	Float8E4M3Bits uint8
	// Float8E5M2Bits is an OCP FP8 E5M2 value.
	Float8E5M2Bits uint8
)

// Scalar is the set of Go element types a host slice may have.
type Scalar interface {
	int8 | uint8 | int32 | uint32 | int64 | uint64 | float32 | float64 |
		Float16Bits | BFloat16Bits | Float8E4M3Bits | Float8E5M2Bits
}

// TypeOf returns the DataType of T.
func TypeOf[T Scalar]() DataType {
	// A type switch on a nil pointer allocates nothing, unlike one on a value.
	switch any((*T)(nil)).(type) {
	case *int8:
		return Int8
	case *uint8:
		return Uint8
	case *int32:
		return Int32
	case *uint32:
		return Uint32
	case *int64:
		return Int64
	case *uint64:
		return Uint64
	case *float32:
		return Float32
	case *float64:
		return Float64
	case *Float16Bits:
		return Float16
	case *BFloat16Bits:
		return BFloat16
	case *Float8E4M3Bits:
		return Float8E4M3
	case *Float8E5M2Bits:
		return Float8E5M2
	}
	panic("unreachable")
}

// OpKind names a reduction operation.
type OpKind uint8

// The reduction operations.
const (
	OpSum OpKind = iota + 1
	OpProd
	OpMin
	OpMax
	OpAvg
	OpPreMulSum
)

// Op is a reduction operation, with its scalar for PreMulSum.
type Op struct {
	Kind   OpKind
	Scalar float64 // PreMulSum only
}

// The reduction operations of NCCL.
var (
	Sum  = Op{Kind: OpSum}
	Prod = Op{Kind: OpProd}
	Min  = Op{Kind: OpMin}
	Max  = Op{Kind: OpMax}
	// Avg is the sum divided by the number of ranks: for floating-point
	// types each input is multiplied by 1/n before summing (as NCCL does);
	// for integers the sum is divided, truncating, once complete.
	Avg = Op{Kind: OpAvg}
)

// PreMulSum multiplies each rank's input by s and sums the products. For
// integer types s is truncated to an integer first.
func PreMulSum(s float64) Op { return Op{Kind: OpPreMulSum, Scalar: s} }

// Valid reports whether o is a known operation.
func (o Op) Valid() bool { return o.Kind >= OpSum && o.Kind <= OpPreMulSum }

func (o Op) String() string {
	switch o.Kind {
	case OpSum:
		return "sum"
	case OpProd:
		return "prod"
	case OpMin:
		return "min"
	case OpMax:
		return "max"
	case OpAvg:
		return "avg"
	case OpPreMulSum:
		return fmt.Sprintf("premulsum(%g)", o.Scalar)
	}
	return fmt.Sprintf("Op(%d)", uint8(o.Kind))
}

// Ops lists the reduction operations with no parameter, and PreMulSum(0.5).
var Ops = []Op{Sum, Prod, Min, Max, Avg, PreMulSum(0.5)}
