package comm_test

import (
	"bytes"
	"fmt"
	"math"
	"testing"

	"github.com/gccl/gccl/comm"
)

// The correctness matrix: every collective x data type x op x size x rank
// count x in-place/out-of-place, checked against a reference computed in
// float64 (floating point) or exact wrapped integer arithmetic.
//
// Float tolerance, and why it is enough: inputs are decoded from the type, so
// they are exact. Sum-like ops (Sum, Avg, PreMulSum) add n terms in some
// order; each addition and each pre-multiplication rounds once with relative
// error at most u (the unit roundoff), and every partial sum is bounded by
// S = sum |x_r * s|, so the result is within (n+1)*u*S of the exact sum (the
// classic bound for recursive summation in any order, plus one rounding per
// term for the scaling); add n subnormal steps for underflow. Prod inputs are
// +-1 except one rank per element in {+-2, 0.5, 3}, so products are exact;
// Min and Max never round. Integers must match exactly, wrapping included.

var matrixSizes = []int{0, 1, 7, 4097, -1} // -1: about 1 MiB, an odd element count

var matrixRanks = []int{1, 2, 3, 4, 5, 8, 16}

// matrixPreMul exercises PreMulSum with a scalar that is not a power of two
// (and is -1 for integer types, which truncate it).
var matrixPreMul = comm.PreMulSum(-1.5)

func matrixOps() []comm.Op {
	return []comm.Op{comm.Sum, comm.Prod, comm.Min, comm.Max, comm.Avg, matrixPreMul}
}

func elemsFor(size int, dt comm.DataType) int {
	if size >= 0 {
		return size
	}
	return (1<<20)/dt.Size() | 1
}

// scalarOf is the multiplier each input gets before summing.
func scalarOf(op comm.Op, dt comm.DataType, n int) float64 {
	switch op.Kind {
	case comm.OpAvg:
		if dt.IsFloat() {
			return 1 / float64(n)
		}
	case comm.OpPreMulSum:
		if dt.IsFloat() {
			return op.Scalar
		}
		return math.Trunc(op.Scalar)
	}
	return 1
}

// fill writes rank p's input into b: element j of the rank's logical input.
func fill(dt comm.DataType, op comm.Op, n, p int, b []byte) {
	for j := 0; j < len(b)/dt.Size(); j++ {
		h := hash(p, j, int(dt))
		if !dt.IsFloat() {
			putI(dt, b, j, int64(h))
			continue
		}
		var v float64
		switch op.Kind {
		case comm.OpProd:
			if p == j%n {
				v = []float64{2, 0.5, -2, 3}[h%4]
			} else {
				v = []float64{1, -1}[h%2]
			}
		case comm.OpMin, comm.OpMax:
			v = float64(int(h%801)-400) * 0.25
		default:
			v = float64(int(h%17) - 8)
		}
		putF(dt, b, j, v)
	}
}

// expected is the reduction of every element across the ranks' inputs,
// computed once per case and shared by all ranks.
type expected struct {
	dt   comm.DataType
	i    []int64   // integer types
	f    []float64 // float types
	tol  []float64
	errs int
	// exact is the results encoded in dt where no element has a tolerance
	// (integers; float Prod, Min, Max): matching bytes pass at once.
	exact []byte
}

func expect(dt comm.DataType, op comm.Op, ins [][]byte) *expected {
	n := len(ins)
	L := len(ins[0]) / dt.Size()
	e := &expected{dt: dt}
	if !dt.IsFloat() {
		e.i = make([]int64, L)
		s := int64(scalarOf(op, dt, n))
		for j := range e.i {
			want := getI(dt, ins[0], j)
			if op.Kind == comm.OpPreMulSum {
				want = wrap(dt, want*s)
			}
			for p := 1; p < n; p++ {
				x := getI(dt, ins[p], j)
				switch op.Kind {
				case comm.OpSum, comm.OpAvg:
					want = wrap(dt, want+x)
				case comm.OpPreMulSum:
					want = wrap(dt, want+wrap(dt, x*s))
				case comm.OpProd:
					want = wrap(dt, want*x)
				case comm.OpMin:
					if lessT(dt, x, want) {
						want = x
					}
				case comm.OpMax:
					if lessT(dt, want, x) {
						want = x
					}
				}
			}
			if op.Kind == comm.OpAvg {
				want = divT(dt, want, n)
			}
			e.i[j] = want
		}
		e.exact = make([]byte, L*dt.Size())
		for j, v := range e.i {
			putI(dt, e.exact, j, v)
		}
		return e
	}
	e.f, e.tol = make([]float64, L), make([]float64, L)
	s := scalarOf(op, dt, n)
	sumLike := op.Kind != comm.OpMin && op.Kind != comm.OpMax && op.Kind != comm.OpProd
	u, tiny := unitRoundoff(dt), tinyStep(dt)
	for j := range e.f {
		want := getF(dt, ins[0], j)
		if sumLike {
			want *= s
		}
		mag := math.Abs(want)
		for p := 1; p < n; p++ {
			x := getF(dt, ins[p], j)
			switch op.Kind {
			case comm.OpProd:
				want *= x
			case comm.OpMin:
				want = math.Min(want, x)
			case comm.OpMax:
				want = math.Max(want, x)
			default:
				want += x * s
				mag += math.Abs(x * s)
			}
		}
		e.f[j] = want
		if sumLike {
			e.tol[j] = float64(n+1)*u*mag + float64(n)*tiny
		}
	}
	if !sumLike {
		e.exact = make([]byte, L*dt.Size())
		for j, v := range e.f {
			if putF(dt, e.exact, j, v); getF(dt, e.exact, j) != v {
				e.exact = nil // not representable: compare values
				break
			}
		}
	}
	return e
}

// checkRange compares the cnt elements of got with expected elements off
// onwards: by their bytes where the results are exact, else one by one.
func (e *expected) checkRange(got []byte, cnt, off int) error {
	esz := e.dt.Size()
	if e.exact != nil && bytes.Equal(got[:cnt*esz], e.exact[off*esz:(off+cnt)*esz]) {
		return nil
	}
	for j := 0; j < cnt; j++ {
		if err := e.check(got, j, off+j); err != nil {
			return err
		}
	}
	return nil
}

// check compares element j of got with expected element off.
func (e *expected) check(got []byte, j, off int) error {
	if e.i != nil {
		if g := getI(e.dt, got, j); g != e.i[off] {
			return fmt.Errorf("element %d = %d, want %d", j, g, e.i[off])
		}
		return nil
	}
	if g := getF(e.dt, got, j); math.Abs(g-e.f[off]) > e.tol[off] || math.IsNaN(g) {
		return fmt.Errorf("element %d = %v, want %v (tolerance %v)", j, g, e.f[off], e.tol[off])
	}
	return nil
}

// collCase describes one collective of the matrix.
type collCase struct {
	name     string
	reducing bool
	// run runs the collective on rank c; ins are every rank's inputs (shared,
	// read-only) and it returns an error describing the first wrong value.
	run func(c *comm.Comm, cnt int, ins [][]byte, ref *expected, dt comm.DataType, op comm.Op, inPlace bool) error
}

func blk(b []byte, i, cnt, esz int) []byte { return b[i*cnt*esz : (i+1)*cnt*esz] }

func hostOf(dt comm.DataType, b []byte) comm.Buffer {
	if b == nil {
		return nil
	}
	return comm.HostBytesOf(dt, b)
}

// copyOf returns a copy of b that is never nil.
func copyOf(b []byte) []byte { return append(make([]byte, 0, len(b)), b...) }

var collCases = []collCase{
	{"AllReduce", true, func(c *comm.Comm, cnt int, ins [][]byte, ref *expected, dt comm.DataType, op comm.Op, inPlace bool) error {
		r := c.Rank()
		in := copyOf(ins[r])
		out := in
		if !inPlace {
			out = make([]byte, len(in))
		}
		if err := c.AllReduce(bg, hostOf(dt, in), hostOf(dt, out), op); err != nil {
			return err
		}
		if err := ref.checkRange(out, cnt, 0); err != nil {
			return err
		}
		if !inPlace && !bytes.Equal(in, ins[r]) {
			return fmt.Errorf("send buffer modified")
		}
		return nil
	}},
	{"ReduceScatter", true, func(c *comm.Comm, cnt int, ins [][]byte, ref *expected, dt comm.DataType, op comm.Op, inPlace bool) error {
		r, esz := c.Rank(), dt.Size()
		in := copyOf(ins[r])
		out := blk(in, r, cnt, esz)
		if !inPlace {
			out = make([]byte, cnt*esz)
		}
		if err := c.ReduceScatter(bg, hostOf(dt, in), hostOf(dt, out), op); err != nil {
			return err
		}
		if err := ref.checkRange(out, cnt, r*cnt); err != nil {
			return err
		}
		if !inPlace && !bytes.Equal(in, ins[r]) {
			return fmt.Errorf("send buffer modified")
		}
		return nil
	}},
	{"Reduce", true, func(c *comm.Comm, cnt int, ins [][]byte, ref *expected, dt comm.DataType, op comm.Op, inPlace bool) error {
		r, root := c.Rank(), c.Size()-1
		in := copyOf(ins[r])
		var out []byte
		switch {
		case inPlace:
			out = in
		case r == root || r%2 == 0:
			// Non-roots may pass a receive buffer; it must stay untouched.
			out = make([]byte, len(in))
			for i := range out {
				out[i] = 0xA5
			}
		}
		if err := c.Reduce(bg, hostOf(dt, in), hostOf(dt, out), op, root); err != nil {
			return err
		}
		if r != root {
			if !inPlace && out != nil && !bytes.Equal(out, bytes.Repeat([]byte{0xA5}, len(out))) {
				return fmt.Errorf("non-root receive buffer written")
			}
			if !bytes.Equal(in, ins[r]) {
				return fmt.Errorf("non-root send buffer modified")
			}
			return nil
		}
		if err := ref.checkRange(out, cnt, 0); err != nil {
			return err
		}
		return nil
	}},
	{"AllGather", false, func(c *comm.Comm, cnt int, ins [][]byte, _ *expected, dt comm.DataType, _ comm.Op, inPlace bool) error {
		r, n, esz := c.Rank(), c.Size(), dt.Size()
		out := make([]byte, n*cnt*esz)
		in := ins[r]
		if inPlace {
			in = blk(out, r, cnt, esz)
			copy(in, ins[r])
		}
		if err := c.AllGather(bg, hostOf(dt, in), hostOf(dt, out)); err != nil {
			return err
		}
		for p := 0; p < n; p++ {
			if !bytes.Equal(blk(out, p, cnt, esz), ins[p]) {
				return fmt.Errorf("block %d differs from rank %d's input", p, p)
			}
		}
		return nil
	}},
	{"Broadcast", false, func(c *comm.Comm, cnt int, ins [][]byte, _ *expected, dt comm.DataType, _ comm.Op, inPlace bool) error {
		r, root := c.Rank(), c.Size()/2
		out := make([]byte, cnt*dt.Size())
		var in []byte
		switch {
		case inPlace:
			in = out
			if r == root {
				copy(out, ins[r])
			}
		case r == root:
			in = copyOf(ins[r])
		}
		if err := c.Broadcast(bg, hostOf(dt, in), hostOf(dt, out), root); err != nil {
			return err
		}
		if !bytes.Equal(out, ins[root]) {
			return fmt.Errorf("received data differs from the root's")
		}
		return nil
	}},
	{"AllToAll", false, func(c *comm.Comm, cnt int, ins [][]byte, _ *expected, dt comm.DataType, _ comm.Op, inPlace bool) error {
		r, n, esz := c.Rank(), c.Size(), dt.Size()
		in := copyOf(ins[r])
		out := in
		if !inPlace {
			out = make([]byte, len(in))
		}
		if err := c.AllToAll(bg, hostOf(dt, in), hostOf(dt, out)); err != nil {
			return err
		}
		for p := 0; p < n; p++ {
			if !bytes.Equal(blk(out, p, cnt, esz), blk(ins[p], r, cnt, esz)) {
				return fmt.Errorf("block %d differs from rank %d's block %d", p, p, r)
			}
		}
		return nil
	}},
	{"Gather", false, func(c *comm.Comm, cnt int, ins [][]byte, _ *expected, dt comm.DataType, _ comm.Op, inPlace bool) error {
		r, n, esz, root := c.Rank(), c.Size(), dt.Size(), 0
		var out []byte
		in := ins[r]
		if r == root {
			out = make([]byte, n*cnt*esz)
			if inPlace {
				in = blk(out, r, cnt, esz)
				copy(in, ins[r])
			}
		}
		if err := c.Gather(bg, hostOf(dt, in), hostOf(dt, out), root); err != nil {
			return err
		}
		if r != root {
			return nil
		}
		for p := 0; p < n; p++ {
			if !bytes.Equal(blk(out, p, cnt, esz), ins[p]) {
				return fmt.Errorf("block %d differs from rank %d's input", p, p)
			}
		}
		return nil
	}},
	{"Scatter", false, func(c *comm.Comm, cnt int, ins [][]byte, _ *expected, dt comm.DataType, _ comm.Op, inPlace bool) error {
		r, n, esz, root := c.Rank(), c.Size(), dt.Size(), n1(c.Size())
		src := ins[root][:n*cnt*esz]
		var in []byte
		out := make([]byte, cnt*esz)
		if r == root {
			in = copyOf(src)
			if inPlace {
				out = blk(in, r, cnt, esz)
			}
		}
		if err := c.Scatter(bg, hostOf(dt, in), hostOf(dt, out), root); err != nil {
			return err
		}
		if !bytes.Equal(out, blk(src, r, cnt, esz)) {
			return fmt.Errorf("block differs from the root's block %d", r)
		}
		return nil
	}},
}

func n1(n int) int { return n - 1 }

// inputLen is how many elements each rank's input holds for a collective.
func inputLen(name string, n, cnt int) int {
	switch name {
	case "ReduceScatter", "AllToAll", "Scatter":
		return n * cnt
	}
	return cnt
}

// opClass groups ops whose float inputs are generated alike (see fill).
func opClass(op comm.Op) comm.OpKind {
	switch op.Kind {
	case comm.OpProd, comm.OpMin:
		return op.Kind
	case comm.OpMax:
		return comm.OpMin
	}
	return comm.OpSum
}

// matrixRun is one (collective, algorithm) of the matrix.
type matrixRun struct {
	cc    collCase
	algo  string
	world []*comm.Comm
}

func TestMatrix(t *testing.T) {
	sizes := matrixSizes
	if testing.Short() || raceEnabled {
		// The ~1 MiB size is a long run under the race detector; the small
		// odd sizes already cover every boundary case there.
		sizes = sizes[:len(sizes)-1]
	}
	for _, n := range matrixRanks {
		ring := world(t, n, &comm.Config{Algo: "ring"})
		tree := world(t, n, &comm.Config{Algo: "tree"})
		var runs []matrixRun
		// The tuner's own choice too: small all-reduces exchange the inputs
		// once (unless the op pre-scales) and small all-gathers send each
		// block straight to every rank, which no forced algorithm covers.
		auto := world(t, n, nil)
		for _, cc := range collCases {
			runs = append(runs, matrixRun{cc, "ring", ring})
			if cc.name == "AllReduce" || cc.name == "AllGather" {
				runs = append(runs, matrixRun{cc, "auto", auto})
			}
			switch cc.name {
			case "AllReduce", "Reduce", "Broadcast":
				runs = append(runs, matrixRun{cc, "tree", tree})
			}
		}
		for _, dt := range comm.DataTypes {
			for _, size := range sizes {
				// Inputs and expected results depend on the input length, the
				// type and the op's class, not on the collective or algorithm,
				// so they are made once and shared.
				type inputKey struct {
					elems int
					class comm.OpKind
				}
				inputs := map[inputKey][][]byte{}
				type refKey struct {
					elems int
					op    comm.Op
				}
				refs := map[refKey]*expected{}
				for _, op := range append([]comm.Op{{}}, matrixOps()...) {
					for _, mr := range runs {
						if mr.cc.reducing != (op != comm.Op{}) {
							continue
						}
						cnt := elemsFor(size, dt)
						if size < 0 && inputLen(mr.cc.name, n, 1) > 1 {
							cnt = cnt/n | 1 // keep the per-rank input near 1 MiB
						}
						ik := inputKey{inputLen(mr.cc.name, n, cnt), opClass(op)}
						ins := inputs[ik]
						if ins == nil {
							ins = make([][]byte, n)
							for p := range ins {
								ins[p] = make([]byte, ik.elems*dt.Size())
								fill(dt, op, n, p, ins[p])
							}
							inputs[ik] = ins
						}
						var ref *expected
						if mr.cc.reducing {
							rk := refKey{ik.elems, op}
							if ref = refs[rk]; ref == nil {
								ref = expect(dt, op, ins)
								refs[rk] = ref
							}
						}
						for _, inPlace := range []bool{false, true} {
							errs := onAll(t, mr.world, func(c *comm.Comm) error {
								return mr.cc.run(c, cnt, ins, ref, dt, op, inPlace)
							})
							for r, err := range errs {
								if err != nil {
									t.Fatalf("%s/%s n=%d %v %v count=%d inPlace=%v: rank %d: %v",
										mr.cc.name, mr.algo, n, dt, op, cnt, inPlace, r, err)
								}
							}
						}
					}
				}
			}
		}
	}
}
