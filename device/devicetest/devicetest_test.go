//go:build unix

package devicetest_test

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gccl/gccl/device"
	"github.com/gccl/gccl/device/devicetest"
	"github.com/gccl/gccl/dtype"
	"github.com/gccl/gccl/internal/errs"
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

// The stream calls run in the caller: WaitFlag returns once another
// goroutine writes the word far enough (in wrapping order), and gives up
// after FlagTimeout saying what it waited for; ReduceOn and CopyOn do
// their work at once; every call is counted.
func TestStreamCalls(t *testing.T) {
	eng := &devicetest.Engine{EngineName: "fake", FlagTimeout: 50 * time.Millisecond}
	page, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(page)
	p, err := eng.MapFlags(page)
	require.NoError(t, err)
	require.Equal(t, uintptr(unsafe.Pointer(&page[0])), p)
	_, err = eng.MapFlags(nil)
	require.Error(t, err)
	w := (*uint32)(unsafe.Pointer(&page[8]))

	const s = 1
	done := make(chan error, 1)
	other := devicetest.NewEngine("other") // the default timeout: 30 s
	_, err = other.MapFlags(page)
	require.NoError(t, err)
	go func() { done <- other.WaitFlag(s, p+8, 3) }()
	time.Sleep(10 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("WaitFlag returned before the word was written: %v", err)
	default:
	}
	require.NoError(t, eng.WriteFlag(s, p+8, 2))
	require.Equal(t, uint32(2), atomic.LoadUint32(w))
	require.NoError(t, eng.WriteFlag(s, p+8, 4)) // past 3
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("WaitFlag did not return after the word passed its value")
	}
	require.NoError(t, eng.WaitFlag(s, p+8, 4))

	// Wrapping: 0xFFFFFFFF is short of 1, and 1 is past 0xFFFFFFFF.
	require.NoError(t, eng.WriteFlag(s, p+8, 0xFFFFFFFF))
	start := time.Now()
	err = eng.WaitFlag(s, p+8, 1)
	require.True(t, errors.Is(err, errs.ErrTimeout), "%v", err)
	require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
	require.Contains(t, err.Error(), fmt.Sprintf("%#x is 4294967295", p+8))
	require.Contains(t, err.Error(), "short of 1")
	require.NoError(t, eng.WriteFlag(s, p+8, 1))
	require.NoError(t, eng.WaitFlag(s, p+8, 0xFFFFFFFF))

	// A batch runs in order; one bad word refuses it whole.
	require.ErrorContains(t, eng.Flags(s, []device.FlagOp{{Addr: p + 12, Value: 9}, {Addr: p + 13, Value: 9}}), "not 4-byte aligned")
	require.Equal(t, uint32(0), atomic.LoadUint32((*uint32)(unsafe.Pointer(&page[12]))), "a refused batch wrote its first word")
	require.NoError(t, eng.Flags(s, []device.FlagOp{{Addr: p + 12, Value: 2}, {Addr: p + 12, Value: 2, Wait: true}}))
	require.Equal(t, int64(1), eng.StreamOps.Batches.Load())
	require.Error(t, eng.Flags(s, make([]device.FlagOp, device.MaxFlagOps+1)))

	a, b := devicetest.NewBuffer(t, eng, dtype.Float32, 3), devicetest.NewBuffer(t, eng, dtype.Float32, 3)
	copy(a.Float32s(), []float32{1, 2, 3})
	copy(b.Float32s(), []float32{10, 20, 30})
	require.NoError(t, eng.ReduceOn(s, &device.Reduce{DataType: dtype.Float32, Op: dtype.Sum, Ranks: 2, Count: 3,
		In: []uintptr{a.Ptr(), b.Ptr()}, Out: []uintptr{b.Ptr()}}))
	require.Equal(t, []float32{11, 22, 33}, b.Float32s())
	require.NoError(t, eng.CopyOn(s, a.Ptr(), b.Ptr(), 12))
	require.Equal(t, []float32{11, 22, 33}, a.Float32s())
	require.Error(t, eng.ReduceOn(s, &device.Reduce{DataType: dtype.Float32, Count: 1}), "a reduction of no inputs")
	require.NoError(t, eng.Follow(2, s))

	// Only words of mapped flags, aligned.
	require.ErrorContains(t, eng.WriteFlag(s, p+6, 1), "not 4-byte aligned")
	require.ErrorContains(t, eng.WaitFlag(s, p+4096, 1), "in no memory MapFlags mapped")
	require.ErrorContains(t, eng.WriteFlag(s, b.Ptr(), 1), "in no memory MapFlags mapped")
	require.NoError(t, eng.UnmapFlags(page))
	require.ErrorContains(t, eng.WriteFlag(s, p+8, 5), "in no memory MapFlags mapped")
	require.Equal(t, uint32(1), atomic.LoadUint32(w))
	require.Error(t, eng.UnmapFlags(page), "unmapping twice")

	ops := &eng.StreamOps
	require.Equal(t, []int64{5, 3, 1, 1, 1}, []int64{ops.Writes.Load(), ops.Waits.Load(), ops.Reduces.Load(), ops.Copies.Load(), ops.Follows.Load()},
		"writes, completed waits (not the one that timed out), reduces, copies, follows")
	require.Equal(t, int64(1), eng.Reduces.Load())
	require.Equal(t, int64(1), eng.Copies.Load())
}
