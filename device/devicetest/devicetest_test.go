//go:build unix

package devicetest_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gccl/gccl/device"
	"github.com/gccl/gccl/device/devicetest"
	"github.com/gccl/gccl/dtype"
)

func TestEngineReducesAsTheContractSays(t *testing.T) {
	eng := devicetest.NewEngine("fake")
	a, b := devicetest.NewBuffer(t, eng, dtype.Float32, 4), devicetest.NewBuffer(t, eng, dtype.Float32, 4)
	copy(a.Float32s(), []float32{1, 2, 3, 4})
	copy(b.Float32s(), []float32{3, 6, 9, 12})
	out := devicetest.NewBuffer(t, eng, dtype.Float32, 4)
	for _, c := range []struct {
		op   dtype.Op
		want []float32
	}{
		{dtype.Sum, []float32{4, 8, 12, 16}},
		{dtype.Max, []float32{3, 6, 9, 12}},
		{dtype.Avg, []float32{2, 4, 6, 8}},
		{dtype.PreMulSum(0.5), []float32{2, 4, 6, 8}},
	} {
		r := &device.Reduce{DataType: dtype.Float32, Op: c.op, Ranks: 2, Count: 4,
			In: []uintptr{a.Ptr(), b.Ptr()}, Out: []uintptr{out.Ptr(), a.Ptr()}}
		before := append([]float32(nil), a.Float32s()...)
		require.NoError(t, eng.Reduce(r))
		require.Equal(t, c.want, out.Float32s(), "%v", c.op)
		require.Equal(t, c.want, a.Float32s(), "%v: an output aliasing an input", c.op)
		copy(a.Float32s(), before)
	}
	// Integer Avg divides the sum, truncating.
	x, y := devicetest.NewBuffer(t, eng, dtype.Int32, 1), devicetest.NewBuffer(t, eng, dtype.Int32, 1)
	x.Bytes()[0], y.Bytes()[0] = 3, 4
	require.NoError(t, eng.Reduce(&device.Reduce{DataType: dtype.Int32, Op: dtype.Avg, Ranks: 2, Count: 1,
		In: []uintptr{x.Ptr(), y.Ptr()}, Out: []uintptr{x.Ptr()}}))
	require.Equal(t, byte(3), x.Bytes()[0])
}

func TestExportImportAndFailures(t *testing.T) {
	eng := devicetest.NewEngine("fake")
	b := devicetest.NewBuffer(t, eng, dtype.Float32, 8)
	desc, err := eng.AppendExport(nil, b.Ptr(), 32)
	require.NoError(t, err)
	require.LessOrEqual(t, len(desc), device.MaxDescLen)
	p, err := eng.Import(desc, 32)
	require.NoError(t, err)
	require.Equal(t, b.Ptr(), p)
	_, err = eng.Import(desc, 64)
	require.Error(t, err, "importing more than was exported")
	_, err = (&devicetest.Engine{FailExport: true}).AppendExport(nil, b.Ptr(), 32)
	require.Error(t, err)
	_, err = (&devicetest.Engine{FailImport: true}).Import(desc, 32)
	require.Error(t, err)
	v := b.View(2, 3)
	require.Equal(t, 3, v.Len())
	require.Equal(t, b.Ptr()+8, v.Ptr())
}
