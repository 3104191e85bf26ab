package reduce

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"testing"
)

var allDTypes = []DType{Int8, Uint8, Int32, Uint32, Int64, Uint64, Float16, BFloat16, Float32, Float64, Float8E4M3, Float8E5M2}
var allOps = []Op{Sum, Prod, Min, Max}

// testSets is every kernel set the CPU runs, generic first, plus the SIMD
// sets forced to use non-temporal stores at every size.
func testSets() []*kernelSet { return append(slices.Clip(implementations), streamingSets()...) }

func implNames() []string {
	var names []string
	for _, s := range implementations {
		names = append(names, s.name)
	}
	return names
}

// testLengths are element counts: every length up to 300 (all vector tails
// and unroll remainders of every kernel), then a few large ones.
func testLengths() []int {
	var ns []int
	for n := 0; n <= 300; n++ {
		ns = append(ns, n)
	}
	ns = append(ns, 1023, 4096+17, 1<<16+5)
	if testing.Short() {
		ns = ns[:len(ns)-1]
	}
	return ns
}

// offsetBuf returns an n-byte slice starting off bytes into a fresh buffer,
// so kernels meet every misalignment.
func offsetBuf(n, off int) []byte {
	return make([]byte, n+off+8)[off : off+n : off+n]
}

// checkElems compares got with the reference element by element.
func checkElems(t *testing.T, what string, dt DType, op Op, got, a, b []byte) {
	t.Helper()
	size := dt.Size()
	bad := 0
	for i := 0; i < len(got); i += size {
		x, y, g := loadElem(dt, a[i:]), loadElem(dt, b[i:]), loadElem(dt, got[i:])
		want := reference(dt, op, x, y)
		var ok bool
		switch {
		case want.skip:
			ok = true
		case want.anyNaN:
			ok = isNaNBits(dt, g)
		default:
			ok = g == want.bits
		}
		if !ok {
			t.Errorf("%s: %v %v element %d of %d: %#x %v %#x = %#x, want %#x", what, dt, op, i/size, len(got)/size, x, op, y, g, want.bits)
			if bad++; bad > 5 {
				t.FailNow()
			}
		}
	}
}

// sameBits compares two kernel outputs, treating any two NaNs of a float
// type as equal (NaN payloads of Sum and Prod are not specified).
func sameBits(dt DType, x, y []byte) (int, bool) {
	size := dt.Size()
	for i := 0; i < len(x); i += size {
		a, b := loadElem(dt, x[i:]), loadElem(dt, y[i:])
		if a != b && !(isNaNBits(dt, a) && isNaNBits(dt, b)) {
			return i / size, false
		}
	}
	return 0, true
}

// TestKernels runs every (dtype, op) kernel of every kernel set this CPU
// supports against the scalar reference, out of place at odd offsets and in
// place (dst == a, dst == b), and checks that all sets agree bit for bit.
func TestKernels(t *testing.T) {
	var names []string
	for _, s := range testSets() {
		names = append(names, s.name)
	}
	t.Logf("kernel sets: %v, active %s", names, Impl())
	for _, dt := range allDTypes {
		for _, op := range allOps {
			t.Run(dt.String()+"/"+op.String(), func(t *testing.T) {
				t.Parallel()
				testKernel(t, dt, op)
			})
		}
	}
}

func testKernel(t *testing.T, dt DType, op Op) {
	rng := rand.New(rand.NewPCG(uint64(dt), uint64(op)))
	size := dt.Size()
	for _, n := range testLengths() {
		nb := n * size
		a, b := offsetBuf(nb, rng.IntN(8)), offsetBuf(nb, rng.IntN(8))
		for i := 0; i < nb; i += size {
			x, y := randPair(dt, rng)
			storeElem(dt, a[i:], x)
			storeElem(dt, b[i:], y)
		}
		aCopy, bCopy := slices.Clone(a), slices.Clone(b)
		var first []byte // output of the generic set
		for _, set := range testSets() {
			k := set.funcs[dt][op]
			what := fmt.Sprintf("%s n=%d", set.name, n)
			dst := offsetBuf(nb, rng.IntN(8))
			k(dst, a, b)
			if !bytes.Equal(a, aCopy) || !bytes.Equal(b, bCopy) {
				t.Fatalf("%s: inputs modified", what)
			}
			checkElems(t, what, dt, op, dst, a, b)
			if first == nil {
				first = dst
			} else if i, ok := sameBits(dt, dst, first); !ok {
				t.Fatalf("%s: element %d differs from generic: %#x vs %#x", what, i,
					loadElem(dt, dst[i*size:]), loadElem(dt, first[i*size:]))
			}

			inA := slices.Clone(a)
			k(inA, inA, b)
			if i, ok := sameBits(dt, inA, dst); !ok {
				t.Fatalf("%s: dst==a differs at element %d", what, i)
			}
			inB := slices.Clone(b)
			k(inB, a, inB)
			if i, ok := sameBits(dt, inB, dst); !ok {
				t.Fatalf("%s: dst==b differs at element %d", what, i)
			}
		}
	}
}

// TestKernelsExhaustiveHalf feeds every float16 and bfloat16 bit pattern
// through each SIMD kernel against a fixed set of partners and compares with
// the generic kernel, so the hardware conversions (F16C) and the integer
// rounding of bfloat16 agree with the Go code on every input.
func TestKernelsExhaustiveHalf(t *testing.T) {
	for _, dt := range []DType{Float16, BFloat16} {
		a := make([]byte, 2<<16)
		for i := range 1 << 16 {
			storeElem(dt, a[2*i:], uint64(i))
		}
		for _, partner := range specials(dt) {
			b := make([]byte, len(a))
			for i := 0; i < len(b); i += 2 {
				storeElem(dt, b[i:], encodeFloat(dt, partner))
			}
			for _, op := range allOps {
				want := make([]byte, len(a))
				implementations[0].funcs[dt][op](want, a, b)
				checkElems(t, fmt.Sprintf("generic partner %v", partner), dt, op, want, a, b)
				for _, set := range testSets()[1:] {
					got := make([]byte, len(a))
					set.funcs[dt][op](got, a, b)
					if i, ok := sameBits(dt, got, want); !ok {
						t.Fatalf("%s %v %v: %#x op %v = %#x, generic %#x", set.name, dt, op, i, partner,
							loadElem(dt, got[2*i:]), loadElem(dt, want[2*i:]))
					}
				}
			}
		}
	}
}

// bytePairs returns a and b holding every pair of byte values: a[i] is
// i>>8 and b[i] is i&0xff, for i below 1<<16.
func bytePairs() (a, b []byte) {
	a, b = make([]byte, 1<<16), make([]byte, 1<<16)
	for i := range a {
		a[i], b[i] = byte(i>>8), byte(i)
	}
	return a, b
}

// TestProd8Exhaustive multiplies every pair of bytes with each set's 8-bit
// Prod (which has no byte multiply instruction to use): the product wraps,
// so int8 and uint8 give the same bits.
func TestProd8Exhaustive(t *testing.T) {
	a, b := bytePairs()
	got := make([]byte, len(a))
	for _, set := range testSets() {
		for _, dt := range []DType{Int8, Uint8} {
			set.funcs[dt][Prod](got, a, b)
			for i := range got {
				if want := a[i] * b[i]; got[i] != want {
					t.Fatalf("%s %v: %#x * %#x = %#x, want %#x", set.name, dt, a[i], b[i], got[i], want)
				}
			}
		}
	}
}

func TestLookup(t *testing.T) {
	for _, dt := range allDTypes {
		for _, op := range allOps {
			if Lookup(dt, op) == nil {
				t.Errorf("Lookup(%v, %v) = nil", dt, op)
			}
		}
	}
	if Lookup(0, Sum) != nil || Lookup(Float32, 0) != nil || Lookup(13, Sum) != nil || Lookup(Float32, 5) != nil {
		t.Error("Lookup accepts invalid dtype or op")
	}
}

func TestSetImpl(t *testing.T) {
	if !slices.Contains(implNames(), Impl()) {
		t.Fatalf("Impl() = %q, not among %v", Impl(), implNames())
	}
	for _, name := range implNames() {
		restore, ok := setImpl(name)
		if !ok {
			t.Fatalf("setImpl(%q) failed", name)
		}
		if Impl() != name {
			t.Errorf("after setImpl(%q), Impl() = %q", name, Impl())
		}
		dst := make([]byte, 8)
		Lookup(Float32, Sum)(dst, []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0x40}, []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0x40})
		if !bytes.Equal(dst, []byte{0, 0, 0, 0x40, 0, 0, 0x80, 0x40}) { // 1+1 = 2, 2+2 = 4
			t.Errorf("%s: float32 sum = %x", name, dst)
		}
		restore()
	}
	if _, ok := setImpl("sse9"); ok {
		t.Error("setImpl accepted an unknown name")
	}
}

// TestImplEnv runs this test binary again with GCCL_REDUCE_IMPL set and
// checks, in the child, that the forced set is in use.
func TestImplEnv(t *testing.T) {
	if want := os.Getenv("GCCL_REDUCE_IMPL_CHILD_WANT"); want != "" {
		if Impl() != want {
			t.Fatalf("%s=%s: Impl() = %q, want %q", implEnv, os.Getenv(implEnv), Impl(), want)
		}
		return
	}
	best := implNames()[len(implNames())-1]
	for env, want := range map[string]string{"generic": "generic", "bogus": best} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestImplEnv$")
		cmd.Env = append(os.Environ(), implEnv+"="+env, "GCCL_REDUCE_IMPL_CHILD_WANT="+want)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s=%s: %v\n%s", implEnv, env, err, out)
		}
	}
}

func TestReduce(t *testing.T) {
	buf := make([]byte, 64)
	a, b, dst := buf[0:16], buf[16:32], buf[32:48]
	for i := range 4 {
		storeElem(Int32, a[4*i:], uint64(i))
		storeElem(Int32, b[4*i:], 10)
	}
	if err := Reduce(Int32, Sum, dst, a, b); err != nil {
		t.Fatal(err)
	}
	if err := Reduce(Int32, Sum, a, a, b); err != nil { // exact aliasing is allowed
		t.Fatal(err)
	}
	for i := range 4 {
		if got := loadElem(Int32, dst[4*i:]); got != uint64(i+10) {
			t.Errorf("dst[%d] = %d", i, got)
		}
		if got := loadElem(Int32, a[4*i:]); got != uint64(i+10) {
			t.Errorf("in place a[%d] = %d", i, got)
		}
	}
	bad := []struct {
		name      string
		dt        DType
		op        Op
		dst, a, b []byte
	}{
		{"dtype", 0, Sum, dst, a, b},
		{"dtype", 200, Sum, dst, a, b},
		{"op", Int32, 9, dst, a, b},
		{"length", Int32, Sum, dst, a[:12], b},
		{"length", Int32, Sum, dst, a, b[:12]},
		{"not whole elements", Int32, Sum, dst[:6], a[:6], b[:6]},
		{"overlap", Int32, Sum, buf[4:20], a, b},
		{"overlap", Int32, Sum, buf[20:36], a, b},
		{"nil inputs", Int32, Sum, dst, nil, nil},
	}
	for _, c := range bad {
		if err := Reduce(c.dt, c.op, c.dst, c.a, c.b); err == nil {
			t.Errorf("Reduce with bad %s: no error", c.name)
		}
	}
	if err := Reduce(Float64, Max, nil, nil, nil); err != nil {
		t.Errorf("empty Reduce: %v", err)
	}
}

func TestDTypeAndOp(t *testing.T) {
	want := []struct {
		name  string
		size  int
		float bool
	}{
		{"int8", 1, false}, {"uint8", 1, false}, {"int32", 4, false}, {"uint32", 4, false},
		{"int64", 8, false}, {"uint64", 8, false}, {"float16", 2, true}, {"bfloat16", 2, true},
		{"float32", 4, true}, {"float64", 8, true}, {"float8e4m3", 1, true}, {"float8e5m2", 1, true},
	}
	for i, dt := range allDTypes {
		w := want[i]
		if dt.String() != w.name || dt.Size() != w.size || dt.IsFloat() != w.float || !dt.Valid() {
			t.Errorf("%d: got %q size %d float %v valid %v, want %+v", dt, dt, dt.Size(), dt.IsFloat(), dt.Valid(), w)
		}
	}
	for _, dt := range []DType{0, 13, 255} {
		if dt.Valid() || dt.Size() != 0 || dt.IsFloat() || dt.String() == "" {
			t.Errorf("invalid DType %d: valid %v size %d float %v %q", dt, dt.Valid(), dt.Size(), dt.IsFloat(), dt)
		}
	}
	for i, name := range []string{"sum", "prod", "min", "max"} {
		if op := allOps[i]; op.String() != name || !op.Valid() {
			t.Errorf("op %d: %q valid %v", op, op, op.Valid())
		}
	}
	if Op(0).Valid() || Op(5).Valid() || Op(5).String() != "Op(5)" {
		t.Error("invalid Op accepted or misnamed")
	}
}

func TestNoAllocs(t *testing.T) {
	a, b, dst := make([]byte, 1024+7), make([]byte, 1024+7), make([]byte, 1024+7)
	for _, set := range testSets() {
		for _, dt := range allDTypes {
			n := len(dst) / dt.Size() * dt.Size()
			for _, op := range allOps {
				k := set.funcs[dt][op]
				if allocs := testing.AllocsPerRun(10, func() { k(dst[:n], a[:n], b[:n]) }); allocs != 0 {
					t.Errorf("%s %v %v: %v allocs", set.name, dt, op, allocs)
				}
			}
		}
	}
	for _, set := range testSets() {
		for _, dt := range allDTypes {
			n := len(dst) / dt.Size() * dt.Size()
			scale, axpy, div := set.scale[dt], set.axpy[dt], Div(dt)
			if allocs := testing.AllocsPerRun(10, func() {
				scale(dst[:n], a[:n], 1.5)
				axpy(dst[:n], a[:n], b[:n], 0.5)
				div(dst[:n], a[:n], 3)
			}); allocs != 0 {
				t.Errorf("%s %v Scale/Axpy/Div: %v allocs", set.name, dt, allocs)
			}
		}
	}
	if allocs := testing.AllocsPerRun(10, func() { _ = Reduce(Float32, Sum, dst[:1024], a[:1024], b[:1024]) }); allocs != 0 {
		t.Errorf("Reduce: %v allocs", allocs)
	}
}

// FuzzReduce compares the fastest kernel set with the generic one on
// arbitrary bytes: the first two bytes pick the dtype and op, the rest is
// split into a and b.
func FuzzReduce(f *testing.F) {
	f.Add(uint8(Float32), uint8(Sum), []byte("0123456789abcdef0123456789abcdef"))
	f.Add(uint8(BFloat16), uint8(Max), bytes.Repeat([]byte{0x80, 0x7f, 0xc0, 0xff, 0, 0x80}, 40))
	f.Add(uint8(Float16), uint8(Min), bytes.Repeat([]byte{0x00, 0x7c, 0x01, 0xfc, 0, 0x80}, 33))
	f.Add(uint8(Int64), uint8(Prod), bytes.Repeat([]byte{0xff, 0x01}, 300))
	f.Fuzz(func(t *testing.T, dtByte, opByte uint8, data []byte) {
		dt, op := DType(dtByte%uint8(numDTypes))+1, Op(opByte%uint8(numOps))+1
		n := len(data) / 2 / dt.Size() * dt.Size()
		a, b := data[:n], data[n:2*n]
		want := make([]byte, n)
		implementations[0].funcs[dt][op](want, a, b)
		checkElems(t, "generic", dt, op, want, a, b)
		best := implementations[len(implementations)-1]
		got := make([]byte, n)
		best.funcs[dt][op](got, a, b)
		if i, ok := sameBits(dt, got, want); !ok {
			t.Fatalf("%s %v %v element %d: %#x, generic %#x", best.name, dt, op, i,
				loadElem(dt, got[i*dt.Size():]), loadElem(dt, want[i*dt.Size():]))
		}
	})
}

// TestBounce exercises the aligned-copy path that strict-alignment
// architectures take for misaligned buffers, here on any architecture.
func TestBounce(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	kernel := func(d, x, y []float64, _ struct{}) { sumLoop(d, x, y) }
	for _, n := range []int{0, 1, 31, 32, 33, 100} {
		a, b := offsetBuf(8*n, 3), offsetBuf(8*n, 5)
		for i := 0; i < 8*n; i += 8 {
			x, y := randPair(Float64, rng)
			storeElem(Float64, a[i:], x)
			storeElem(Float64, b[i:], y)
		}
		dst := offsetBuf(8*n, 1)
		bounce(kernel, dst, a, b, struct{}{})
		checkElems(t, fmt.Sprintf("bounce n=%d", n), Float64, Sum, dst, a, b)
		bounce(kernel, a, a, b, struct{}{})
		if !bytes.Equal(a, dst) {
			t.Errorf("bounce n=%d: in place differs", n)
		}
	}
}
