package dtype_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gccl/gccl/dtype"
)

// The exhaustive checks of the conversions (every code of every format,
// rounding, NaNs) run in internal/reduce, against the kernels' reference.

func TestTypeOfAndSizes(t *testing.T) {
	require.Equal(t, dtype.Float32, dtype.TypeOf[float32]())
	require.Equal(t, dtype.BFloat16, dtype.TypeOf[dtype.BFloat16Bits]())
	require.Equal(t, dtype.Float8E5M2, dtype.TypeOf[dtype.Float8E5M2Bits]())
	require.Len(t, dtype.DataTypes, dtype.NumDataTypes)
	for _, dt := range dtype.DataTypes {
		require.True(t, dt.Valid(), "%v", dt)
		require.NotZero(t, dt.Size(), "%v", dt)
	}
	require.False(t, dtype.DataType(0).Valid())
	require.Zero(t, dtype.DataType(99).Size())
	require.Equal(t, "DataType(99)", dtype.DataType(99).String())
	require.Equal(t, "bfloat16", dtype.BFloat16.String())
	require.True(t, dtype.Float8E4M3.IsFloat())
	require.False(t, dtype.Uint64.IsFloat())
}

func TestConversionsRoundTrip(t *testing.T) {
	for _, f := range []float32{0, 1, -2.5, 0.375, 448} {
		require.Equal(t, f, dtype.ToFloat16(f).Float())
		require.Equal(t, f, dtype.ToBFloat16(f).Float())
		require.Equal(t, f, dtype.ToFloat8E4M3(f).Float())
	}
	require.True(t, math.IsInf(float64(dtype.ToFloat16(1e6).Float()), 1))
	require.True(t, math.IsNaN(float64(dtype.ToFloat8E4M3(1e6).Float())), "E4M3 has no infinity")
	require.True(t, math.IsInf(float64(dtype.ToFloat8E5M2(1e6).Float()), 1))
}

func TestOps(t *testing.T) {
	require.Equal(t, "premulsum(0.5)", dtype.PreMulSum(0.5).String())
	require.True(t, dtype.Avg.Valid())
	require.False(t, dtype.Op{}.Valid())
	require.Equal(t, "Op(9)", dtype.Op{Kind: 9}.String())
}
