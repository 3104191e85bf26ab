//go:build linux && cgo

package engine_test

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/gccl/gccl/gpu/internal/engine"

	"github.com/gccl/gccl/device"
	"github.com/gccl/gccl/dtype"
	"github.com/gccl/gccl/internal/commtest"
	"github.com/gccl/gccl/internal/cuda"
	"github.com/gccl/gccl/internal/cuda/cudatest"
	"github.com/gccl/gccl/internal/cuda/devtest"
	"github.com/gccl/gccl/internal/errs"
	"github.com/gccl/gccl/internal/kernels"
	"github.com/gccl/gccl/internal/reduce"
)

// engine opens device 0 of the fake driver, or of the real one with
// GCCL_TEST_REAL_GPU=1 (on a GPU machine).
func openEngine(t testing.TB) (*cuda.Context, *engine.Engine) {
	t.Helper()
	cudatest.Driver(t)
	sh := devtest.Shared(t)
	ctx, err := sh.Context(0)
	if err != nil {
		t.Fatal(err)
	}
	bus, _ := sh.PCIBusID(0)
	e, err := engine.NewEngine(sh, 0, bus)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return ctx, e
}

func alloc(t testing.TB, ctx *cuda.Context, n int) cuda.DevicePtr {
	t.Helper()
	p, err := ctx.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Free(p) })
	return p
}

// Descriptions: a range inside the allocation round-trips to the same
// address in this process; a range past it, or garbage, is refused.
func TestExportImport(t *testing.T) {
	ctx, e := openEngine(t)
	p := alloc(t, ctx, 1<<16)
	d, err := e.AppendExport(nil, uintptr(p)+4096, 8192)
	if err != nil {
		t.Fatal(err)
	}
	if len(d) > device.MaxDescLen {
		t.Fatalf("description of %d bytes, more than comm allows (%d)", len(d), device.MaxDescLen)
	}
	if d2, err := e.AppendExport([]byte("xy"), uintptr(p)+4096, 8192); err != nil || string(d2[:2]) != "xy" || !bytes.Equal(d2[2:], d) {
		t.Fatalf("AppendExport after 2 bytes: %q, %v; want xy then %q", d2, err, d)
	}
	if got, err := e.Import(d, 8192); err != nil || got != uintptr(p)+4096 {
		t.Fatalf("Import in the exporting process: %#x, %v; want %#x", got, err, uintptr(p)+4096)
	}
	if _, err := e.AppendExport(nil, uintptr(p)+4096, 1<<16); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("Export past the allocation: %v", err)
	}
	if _, err := e.Import(d, 1<<16); err == nil || !strings.Contains(err.Error(), "run past") {
		t.Errorf("Import of more bytes than exported: %v", err)
	}
	if _, err := e.Import([]byte("garbage"), 1); err == nil {
		t.Error("Import of garbage succeeded")
	}
	if !strings.Contains(e.Name(), "CUDA IPC") {
		t.Errorf("Name %q", e.Name())
	}
}

// The context's first engine loads every kernel (on a GPU the driver
// compiles them, unless its cache has them: the log says how long that
// took); the next engine on the context finds them loaded.
func TestFirstEngineLoadsTheKernels(t *testing.T) {
	cudatest.Driver(t)
	sh := devtest.Shared(t)
	d := sh.Driver()
	bus, _ := sh.PCIBusID(0)
	start := time.Now()
	e1, err := engine.NewEngine(sh, 0, bus)
	if err != nil {
		t.Fatal(err)
	}
	defer e1.Close()
	first := time.Since(start)
	start = time.Now()
	e2, err := engine.NewEngine(sh, 0, bus)
	if err != nil {
		t.Fatal(err)
	}
	second := time.Since(start)
	t.Logf("the first engine on the context, which loads every type's kernels, opened in %v; the second in %v", first.Round(time.Millisecond), second.Round(time.Microsecond))
	if n := engine.LoadedModules(e2); n != len(dtype.DataTypes) {
		t.Errorf("%d modules loaded on the context, want one per type (%d)", n, len(dtype.DataTypes))
	}
	// Where machine code is embedded for the device, the driver took it:
	// the PTX would be compiled, for seconds.
	major, _ := d.Attribute(0, cuda.AttrComputeCapabilityMajor)
	minor, _ := d.Attribute(0, cuda.AttrComputeCapabilityMinor)
	for _, ct := range dtype.DataTypes {
		dt := reduce.DType(ct)
		arch, img, err := kernels.Cubin(major, minor, dt)
		if err != nil {
			t.Fatal(err)
		}
		got := engine.LoadedFrom(e2, dt)
		if img != nil && got != arch+" machine code" {
			t.Errorf("%v: loaded %q, want the embedded %s machine code", dt, got, arch)
		}
		if dt == reduce.Float32 {
			t.Logf("compute capability %d.%d: %v kernels loaded from %s", major, minor, dt, got)
		}
	}
	e2.Close()
	if n := engine.LoadedModules(e1); n != len(dtype.DataTypes) {
		t.Errorf("after the second engine closed, %d modules loaded, want %d: the first still uses them", n, len(dtype.DataTypes))
	}
}

// Every (type, op) kernel the engine maps comm's operations to loads from
// the embedded PTX and launches, and reduces 3 inputs into 2 outputs right:
// float64 data of small integers, exact in every op.
func TestReduceEveryKernel(t *testing.T) {
	ctx, e := openEngine(t)
	const count, nin = 1000, 3
	rng := rand.New(rand.NewPCG(1, 2))
	ops := []dtype.Op{dtype.Sum, dtype.Prod, dtype.Min, dtype.Max, dtype.Avg, dtype.PreMulSum(2)}
	for _, dt := range dtype.DataTypes {
		esz := dt.Size()
		ins := make([]uintptr, nin)
		vals := make([][]int64, nin)
		for j := range ins {
			vals[j] = make([]int64, count)
			host := make([]byte, count*esz)
			for i := range vals[j] {
				vals[j][i] = int64(rng.IntN(5)) - 2 // -2..2: exact in every type, even fp8
				if !dt.IsFloat() && (dt == dtype.Uint8 || dt == dtype.Uint32 || dt == dtype.Uint64) {
					vals[j][i] += 2
				}
				commtest.Put(dt, host, i, float64(vals[j][i]))
			}
			p := alloc(t, ctx, count*esz)
			if err := ctx.CopyToDevice(p, host); err != nil {
				t.Fatal(err)
			}
			ins[j] = uintptr(p)
		}
		outs := []uintptr{uintptr(alloc(t, ctx, count*esz)), uintptr(alloc(t, ctx, count*esz))}
		for _, op := range ops {
			if err := e.Reduce(&device.Reduce{DataType: dt, Op: op, Ranks: nin, Count: count, In: ins, Out: outs}); err != nil {
				t.Fatalf("%v %v: %v", dt, op, err)
			}
			if err := e.Wait(); err != nil {
				t.Fatal(err)
			}
			for _, o := range outs {
				host := make([]byte, count*esz)
				if err := ctx.CopyFromDevice(host, cuda.DevicePtr(o)); err != nil {
					t.Fatal(err)
				}
				for i := 0; i < count; i++ {
					want := ref(dt, op, nin, vals, i)
					got := commtest.Get(dt, host, i)
					if op.Kind == dtype.OpAvg && dt.IsFloat() {
						// x*(1/n) summed is not (sum x)/n rounded once.
						if math.Abs(got-want) > 0.13*math.Abs(want) {
							t.Fatalf("%v %v element %d: %v, want %v", dt, op, i, got, want)
						}
						continue
					}
					if got != want {
						t.Fatalf("%v %v element %d: %v, want %v", dt, op, i, got, want)
					}
				}
			}
		}
	}
	if err := e.Reduce(&device.Reduce{DataType: dtype.Float32, Op: dtype.Sum, Count: 1, In: make([]uintptr, 9), Out: make([]uintptr, 1)}); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("a reduction of 9 inputs: %v", err)
	}
}

// ref is the exact result of op over the inputs' element i, as a float64.
func ref(dt dtype.DataType, op dtype.Op, n int, vals [][]int64, i int) float64 {
	acc := float64(vals[0][i])
	if op.Kind == dtype.OpPreMulSum {
		acc *= op.Scalar
	}
	for j := 1; j < n; j++ {
		x := float64(vals[j][i])
		switch op.Kind {
		case dtype.OpSum, dtype.OpAvg:
			acc += x
		case dtype.OpPreMulSum:
			acc += x * op.Scalar
		case dtype.OpProd:
			acc *= x
		case dtype.OpMin:
			acc = math.Min(acc, x)
		case dtype.OpMax:
			acc = math.Max(acc, x)
		}
	}
	if op.Kind == dtype.OpAvg {
		if dt.IsFloat() {
			return float64(roundTo(dt, acc/float64(n)))
		}
		return float64(int64(acc) / int64(n))
	}
	return float64(roundTo(dt, acc))
}

// roundTo rounds to dt's precision the values this test produces (small
// integers and thirds of them).
func roundTo(dt dtype.DataType, v float64) float64 {
	if dt.IsFloat() {
		b := make([]byte, 8)
		commtest.Put(dt, b, 0, v)
		return commtest.Get(dt, b, 0)
	}
	return v
}

// The sum kernel in place (a += b), the operation torch's in-place add
// does, for float32 and bfloat16 over 256 MiB: bytes moved are 3 per
// byte of a (two reads, one write). Beside them, "copy" times a
// device-to-device copy (cuMemcpyDtoDAsync) of the same buffers on the same
// stream, 2 bytes moved per byte of a: the bandwidth of the memory, which a
// kernel that streams through it (this one, or torch's) cannot beat by
// much. Meaningful on a GPU only (GCCL_TEST_REAL_GPU=1;
// tests/gpu_acceptance.sh step 4 runs it beside torch's add_ and prints
// each kernel's share of the copy); on the fake driver it times the CPU
// emulation of 1 MiB.
func BenchmarkSumInPlace(b *testing.B) {
	size := 256 << 20
	if !cudatest.RealGPU() {
		size = 1 << 20
	}
	ctx, e := openEngine(b)
	a, x := alloc(b, ctx, size), alloc(b, ctx, size)
	// Zeros: no NaN or subnormal slows one kernel and not another.
	for _, p := range []cuda.DevicePtr{a, x} {
		if err := ctx.CopyToDevice(p, make([]byte, size)); err != nil {
			b.Fatal(err)
		}
	}
	run := func(b *testing.B, bytes int, queue func() error) {
		if err := queue(); err != nil { // loads the module, warms the copy
			b.Fatal(err)
		}
		if err := e.Wait(); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(int64(bytes))
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := queue(); err != nil {
				b.Fatal(err)
			}
		}
		if err := e.Wait(); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("copy", func(b *testing.B) {
		run(b, 2*size, func() error { return e.Copy(uintptr(a), uintptr(x), size) })
	})
	for _, dt := range []dtype.DataType{dtype.Float32, dtype.BFloat16} {
		red := &device.Reduce{DataType: dt, Op: dtype.Sum, Ranks: 2, Count: size / dt.Size(),
			In: []uintptr{uintptr(a), uintptr(x)}, Out: []uintptr{uintptr(a)}}
		b.Run(dt.String(), func(b *testing.B) {
			run(b, 3*size, func() error { return e.Reduce(red) })
		})
	}
}
