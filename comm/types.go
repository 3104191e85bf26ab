package comm

import (
	"fmt"
	"unsafe"

	"github.com/gccl/gccl/internal/reduce"
)

// DataType is the element type of a buffer. The values match NCCL's set.
type DataType uint8

const (
	Int8       DataType = DataType(reduce.Int8)
	Uint8      DataType = DataType(reduce.Uint8)
	Int32      DataType = DataType(reduce.Int32)
	Uint32     DataType = DataType(reduce.Uint32)
	Int64      DataType = DataType(reduce.Int64)
	Uint64     DataType = DataType(reduce.Uint64)
	Float16    DataType = DataType(reduce.Float16)
	BFloat16   DataType = DataType(reduce.BFloat16)
	Float32    DataType = DataType(reduce.Float32)
	Float64    DataType = DataType(reduce.Float64)
	Float8E4M3 DataType = DataType(reduce.Float8E4M3)
	Float8E5M2 DataType = DataType(reduce.Float8E5M2)
)

// DataTypes lists every supported data type.
var DataTypes = []DataType{Int8, Uint8, Int32, Uint32, Int64, Uint64, Float16, BFloat16, Float32, Float64, Float8E4M3, Float8E5M2}

func (d DataType) kernel() reduce.DType { return reduce.DType(d) }

// Size returns the size of one element in bytes, 0 for an unknown type.
func (d DataType) Size() int { return d.kernel().Size() }

// Valid reports whether d is a supported data type.
func (d DataType) Valid() bool { return d.kernel().Valid() }

// IsFloat reports whether d is a floating-point type.
func (d DataType) IsFloat() bool { return d.kernel().IsFloat() }

func (d DataType) String() string {
	if !d.Valid() {
		return fmt.Sprintf("DataType(%d)", uint8(d))
	}
	return d.kernel().String()
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

// Float returns the value as a float32.
func (h Float16Bits) Float() float32 { return reduce.F16ToF32(uint16(h)) }

// Float returns the value as a float32.
func (h BFloat16Bits) Float() float32 { return reduce.BF16ToF32(uint16(h)) }

// Float returns the value as a float32.
func (h Float8E4M3Bits) Float() float32 { return reduce.E4M3ToF32(uint8(h)) }

// Float returns the value as a float32.
func (h Float8E5M2Bits) Float() float32 { return reduce.E5M2ToF32(uint8(h)) }

// ToFloat16 rounds f to the nearest float16.
func ToFloat16(f float32) Float16Bits { return Float16Bits(reduce.F32ToF16(f)) }

// ToBFloat16 rounds f to the nearest bfloat16.
func ToBFloat16(f float32) BFloat16Bits { return BFloat16Bits(reduce.F32ToBF16(f)) }

// ToFloat8E4M3 rounds f to the nearest E4M3 value (NaN when out of range).
func ToFloat8E4M3(f float32) Float8E4M3Bits { return Float8E4M3Bits(reduce.F32ToE4M3(f)) }

// ToFloat8E5M2 rounds f to the nearest E5M2 value (infinity when out of range).
func ToFloat8E5M2(f float32) Float8E5M2Bits { return Float8E5M2Bits(reduce.F32ToE5M2(f)) }

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

// OpKind names a reduction operation.
type OpKind uint8

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
