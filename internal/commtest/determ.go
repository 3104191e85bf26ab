package commtest

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/gccl/gccl/comm"
)

// The check of the deterministic contract (comm.Config.Deterministic): the
// same inputs, reduced as parts of messages of many lengths and at many
// offsets, must come out with the bits of the rank-order fold the check
// computes itself.

// Mem makes a collective's buffers: host slices, or device memory.
type Mem interface {
	// Load returns a buffer holding a copy of b (elements of dt).
	Load(dt comm.DataType, b []byte) (MemBuf, error)
}

// MemBuf is one buffer of a Mem.
type MemBuf interface {
	// Buffer is the whole buffer; Slice is n elements of it from element
	// off, sharing its memory (an in-place reduce-scatter's output).
	Buffer() comm.Buffer
	Slice(off, n int) comm.Buffer
	// Read copies the buffer's contents into dst.
	Read(dst []byte) error
}

// HostMem is Mem on host memory.
type HostMem struct{}

type hostBuf struct {
	dt comm.DataType
	b  []byte
}

func (HostMem) Load(dt comm.DataType, b []byte) (MemBuf, error) {
	return hostBuf{dt, append([]byte(nil), b...)}, nil
}
func (h hostBuf) Buffer() comm.Buffer { return comm.HostBytesOf(h.dt, h.b) }
func (h hostBuf) Slice(off, n int) comm.Buffer {
	sz := h.dt.Size()
	return comm.HostBytesOf(h.dt, h.b[off*sz:(off+n)*sz])
}
func (h hostBuf) Read(dst []byte) error { copy(dst, h.b); return nil }

// DetermOptions selects what CheckDeterministic runs.
type DetermOptions struct {
	Sizes []int           // element counts per rank (per block for ReduceScatter); nil: DetermSizes(c, 1<<12)
	Types []comm.DataType // nil: float32, float64, bfloat16, float16
	Ops   []comm.Op       // nil: Sum, Avg, PreMulSum(0.3); Prod, Min and Max may be asked for
	Mem   Mem             // nil: HostMem
}

// DetermSizes returns element counts from 1 to about limit (and at least
// one past the limit) that cross c's chunk boundaries for every element
// size, the chunk times the rank count (the owners' blocks) and the
// deterministic Reduce's window, each -1, 0 and +1.
func DetermSizes(c *comm.Comm, slotBytes, limit int) []int {
	seen := map[int]bool{}
	var sizes []int
	add := func(k int) {
		if k >= 1 && !seen[k] {
			seen[k] = true
			sizes = append(sizes, k)
		}
	}
	for k := 1; k <= 17; k++ {
		add(k)
	}
	for _, k := range []int{31, 32, 33, 63, 64, 65, 127, 129, 255, 257, 1000, 1023, 1025} {
		add(k)
	}
	n := c.Size()
	for _, esz := range []int{2, 4, 8} {
		ch := slotBytes / esz
		for _, base := range []int{ch, 2 * ch, n * ch, n*ch + ch, 8 * n * ch} {
			if base <= limit {
				add(base - 1)
				add(base)
				add(base + 1)
			}
		}
	}
	add(limit + 3)
	return sizes
}

// determPool is how many distinct inputs each rank has; a message of any
// length takes its elements from the pool at an offset of its own.
const determPool = 8191

// determInput is rank's pool element i: values whose sums round
// differently in different orders (magnitudes 2^-6..2^6, both signs).
func determInput(rank, i int) float64 {
	h := uint64(rank+1)*0x9e3779b97f4a7c15 ^ uint64(i)*0xbf58476d1ce4e5b9
	h ^= h >> 31
	h *= 0x94d049bb133111eb
	h ^= h >> 29
	u := float64(h>>11) / (1 << 53)
	e := int(h%13) - 6
	return math.Ldexp(2*u-1, e)
}

// arith is one type's arithmetic as internal/reduce's kernels do it.
type arith struct {
	round func(float64) float64 // to the type
	scale func(x, s float64) float64
	add   func(a, b float64) float64
	mul   func(a, b float64) float64
}

func arithOf(dt comm.DataType) arith {
	f32 := func(f func(float32) float32) func(float64) float64 {
		return func(x float64) float64 { return float64(f(float32(x))) }
	}
	var r func(float32) float32
	switch dt {
	case comm.Float64:
		return arith{
			round: func(x float64) float64 { return x },
			scale: func(x, s float64) float64 { return x * s },
			add:   func(a, b float64) float64 { return a + b },
			mul:   func(a, b float64) float64 { return a * b },
		}
	case comm.Float32:
		r = func(x float32) float32 { return x }
	case comm.BFloat16:
		r = func(x float32) float32 { return comm.ToBFloat16(x).Float() }
	case comm.Float16:
		r = func(x float32) float32 { return comm.ToFloat16(x).Float() }
	default:
		panic("commtest: no float arithmetic for " + dt.String())
	}
	return arith{
		round: f32(r),
		scale: func(x, s float64) float64 { return float64(r(float32(x) * float32(s))) },
		add:   func(a, b float64) float64 { return float64(r(float32(a) + float32(b))) },
		mul:   func(a, b float64) float64 { return float64(r(float32(a) * float32(b))) },
	}
}

// determRef is the rank-order fold of every pool element for dt and op.
func determRef(dt comm.DataType, op comm.Op, n int) []float64 {
	ar := arithOf(dt)
	s, scaled, fold := 0.0, false, ar.add
	switch op.Kind {
	case comm.OpAvg:
		s, scaled = 1/float64(n), true
	case comm.OpPreMulSum:
		s, scaled = op.Scalar, true
	case comm.OpSum:
	case comm.OpProd:
		fold = ar.mul
	case comm.OpMin:
		fold = math.Min // the inputs hold no NaN and no zero
	case comm.OpMax:
		fold = math.Max
	default:
		panic("commtest: the deterministic check has no reference for " + op.String())
	}
	ref := make([]float64, determPool)
	for i := range ref {
		var acc float64
		for r := range n {
			x := ar.round(determInput(r, i))
			if scaled {
				x = ar.scale(x, s)
			}
			if r == 0 {
				acc = x
			} else {
				acc = fold(acc, x)
			}
		}
		ref[i] = acc
	}
	return ref
}

// CheckDeterministic runs, on c (one rank; every rank must call it with
// the same options), AllReduce, ReduceScatter and Reduce (roots 0 and
// n-1), in place and not, of every size, type and op of opts, and checks
// every element's bits against the rank-order fold of its inputs.
func CheckDeterministic(ctx context.Context, c *comm.Comm, opts DetermOptions) error {
	if opts.Sizes == nil {
		opts.Sizes = DetermSizes(c, 1<<16, 1<<12)
	}
	if opts.Types == nil {
		opts.Types = []comm.DataType{comm.Float32, comm.Float64, comm.BFloat16, comm.Float16}
	}
	if opts.Ops == nil {
		opts.Ops = []comm.Op{comm.Sum, comm.Avg, comm.PreMulSum(0.3)}
	}
	if opts.Mem == nil {
		opts.Mem = HostMem{}
	}
	n, rank := c.Size(), c.Rank()
	for _, dt := range opts.Types {
		for _, op := range opts.Ops {
			ref := determRef(dt, op, n)
			for _, m := range opts.Sizes {
				shift := (m * 131) % determPool
				for _, k := range []determCall{{"AllReduce", -1}, {"ReduceScatter", -1}, {"Reduce", 0}, {"Reduce", n - 1}} {
					for _, inPlace := range []bool{false, true} {
						if err := determOne(ctx, c, opts.Mem, dt, op, ref, k, m, shift, inPlace, n, rank); err != nil {
							return fmt.Errorf("%s %v %v of %d elements (in place %v): %w", k, dt, op, m, inPlace, err)
						}
					}
				}
			}
		}
	}
	return nil
}

type determCall struct {
	coll string
	root int
}

func (k determCall) String() string {
	if k.root >= 0 {
		return fmt.Sprintf("%s(root %d)", k.coll, k.root)
	}
	return k.coll
}

func determOne(ctx context.Context, c *comm.Comm, mem Mem, dt comm.DataType, op comm.Op, ref []float64, k determCall, m, shift int, inPlace bool, n, rank int) error {
	esz := dt.Size()
	inLen, outLen, outOff := m, m, 0 // elements; outOff: the result's first pool position
	if k.coll == "ReduceScatter" {
		inLen, outOff = n*m, rank*m
	}
	in := make([]byte, inLen*esz)
	for i := range inLen {
		Put(dt, in, i, determInput(rank, (i+shift)%determPool))
	}
	send, err := mem.Load(dt, in)
	if err != nil {
		return err
	}
	recv := send
	if !inPlace {
		if recv, err = mem.Load(dt, make([]byte, outLen*esz)); err != nil {
			return err
		}
	}
	rb := recv.Buffer()
	if inPlace && k.coll == "ReduceScatter" {
		rb = send.Slice(rank*m, m)
	}
	switch k.coll {
	case "AllReduce":
		err = c.AllReduce(ctx, send.Buffer(), rb, op)
	case "ReduceScatter":
		err = c.ReduceScatter(ctx, send.Buffer(), rb, op)
	case "Reduce":
		err = c.Reduce(ctx, send.Buffer(), rb, op, k.root)
	}
	if err != nil {
		return err
	}
	if k.coll == "Reduce" && rank != k.root {
		return nil
	}
	got := make([]byte, outLen*esz)
	if inPlace && k.coll == "ReduceScatter" {
		all := make([]byte, inLen*esz)
		if err := send.Read(all); err != nil {
			return err
		}
		copy(got, all[rank*m*esz:])
	} else if err := recv.Read(got); err != nil {
		return err
	}
	want := make([]byte, esz)
	for i := range outLen {
		Put(dt, want, 0, ref[(outOff+i+shift)%determPool])
		if g, w := bitsOf(dt, got, i), bitsOf(dt, want, 0); g != w {
			return fmt.Errorf("rank %d element %d: bits %#x (%g), want %#x (%g), the rank-order fold",
				rank, i, g, Get(dt, got, i), w, Get(dt, want, 0))
		}
	}
	return nil
}

// bitsOf is element i of b's bit pattern (Raw is for integers only).
func bitsOf(dt comm.DataType, b []byte, i int) uint64 {
	switch sz := dt.Size(); sz {
	case 1:
		return uint64(b[i])
	case 2:
		return uint64(binary.NativeEndian.Uint16(b[2*i:]))
	case 4:
		return uint64(binary.NativeEndian.Uint32(b[4*i:]))
	default:
		return binary.NativeEndian.Uint64(b[8*i:])
	}
}
