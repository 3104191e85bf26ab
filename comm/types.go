package comm

import (
	"unsafe"

	"github.com/gccl/gccl/dtype"
)

// The element types and reduction operations are package dtype's, under the
// same names here.
type (
	// DataType is the element type of a buffer. The values match NCCL's set.
	DataType = dtype.DataType
	// Float16Bits is an IEEE binary16 value.
	Float16Bits = dtype.Float16Bits
	// BFloat16Bits is a bfloat16 value (the top half of a float32).
	BFloat16Bits = dtype.BFloat16Bits
	// Float8E4M3Bits is an OCP FP8 E4M3FN value.
	Float8E4M3Bits = dtype.Float8E4M3Bits
	// Float8E5M2Bits is an OCP FP8 E5M2 value.
	Float8E5M2Bits = dtype.Float8E5M2Bits
	// Scalar is the set of Go element types a host slice may have.
	Scalar = dtype.Scalar
	// OpKind names a reduction operation.
	OpKind = dtype.OpKind
	// Op is a reduction operation, with its scalar for PreMulSum.
	Op = dtype.Op
)

// The data types.
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
)

// DataTypes lists every supported data type.
var DataTypes = dtype.DataTypes

// The operation kinds.
const (
	OpSum       = dtype.OpSum
	OpProd      = dtype.OpProd
	OpMin       = dtype.OpMin
	OpMax       = dtype.OpMax
	OpAvg       = dtype.OpAvg
	OpPreMulSum = dtype.OpPreMulSum
)

// The reduction operations of NCCL (see dtype.Avg for Avg's rounding).
var (
	Sum  = dtype.Sum
	Prod = dtype.Prod
	Min  = dtype.Min
	Max  = dtype.Max
	Avg  = dtype.Avg
)

// Ops lists the reduction operations with no parameter, and PreMulSum(0.5).
var Ops = dtype.Ops

// PreMulSum multiplies each rank's input by s and sums the products. For
// integer types s is truncated to an integer first.
func PreMulSum(s float64) Op { return dtype.PreMulSum(s) }

// TypeOf returns the DataType of T.
func TypeOf[T Scalar]() DataType { return dtype.TypeOf[T]() }

// ToFloat16 rounds f to the nearest float16.
func ToFloat16(f float32) Float16Bits { return dtype.ToFloat16(f) }

// ToBFloat16 rounds f to the nearest bfloat16.
func ToBFloat16(f float32) BFloat16Bits { return dtype.ToBFloat16(f) }

// ToFloat8E4M3 rounds f to the nearest E4M3 value (NaN when out of range).
func ToFloat8E4M3(f float32) Float8E4M3Bits { return dtype.ToFloat8E4M3(f) }

// ToFloat8E5M2 rounds f to the nearest E5M2 value (infinity when out of range).
func ToFloat8E5M2(f float32) Float8E5M2Bits { return dtype.ToFloat8E5M2(f) }

// asBytes views a typed slice as bytes without copying.
func asBytes[T Scalar](s []T) []byte {
	if len(s) == 0 {
		if s == nil {
			return nil
		}
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(s[0])))
}
