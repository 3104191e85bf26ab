package main

import (
	"fmt"
	"math"
	"testing"

	"github.com/gccl/gccl/comm"
)

var rankCounts = []int{1, 2, 3, 4, 5, 8, 9, 16, 33}

// roundTo rounds x to dt's nearest value.
func roundTo(dt comm.DataType, x float64) float64 {
	s := checkSpec{dt: dt}
	return s.decodeFloat(encodeFloat(dt, x))
}

func encodeFloat(dt comm.DataType, x float64) uint64 {
	switch dt {
	case comm.Float64:
		return math.Float64bits(x)
	case comm.Float32:
		return uint64(math.Float32bits(float32(x)))
	case comm.Float16:
		return uint64(comm.ToFloat16(float32(x)))
	case comm.BFloat16:
		return uint64(comm.ToBFloat16(float32(x)))
	case comm.Float8E4M3:
		return uint64(comm.ToFloat8E4M3(float32(x)))
	}
	return uint64(comm.ToFloat8E5M2(float32(x)))
}

// kernelOp combines two values the way gccl's kernels are specified to:
// float64 in float64, every other type in float32, rounded once to dt.
func kernelOp(dt comm.DataType, op comm.OpKind, a, b float64) float64 {
	if dt == comm.Float64 {
		switch op {
		case comm.OpProd:
			return a * b
		case comm.OpMin:
			return min(a, b)
		case comm.OpMax:
			return max(a, b)
		}
		return a + b
	}
	x, y := float32(a), float32(b)
	var r float32
	switch op {
	case comm.OpProd:
		r = x * y
	case comm.OpMin:
		r = min(x, y)
	case comm.OpMax:
		r = max(x, y)
	default:
		r = x + y
	}
	return roundTo(dt, float64(r))
}

// fold reduces terms in the given order of indices.
func fold(dt comm.DataType, op comm.OpKind, terms []float64, order []int) float64 {
	acc := terms[order[0]]
	for _, i := range order[1:] {
		acc = kernelOp(dt, op, acc, terms[i])
	}
	return acc
}

// tree reduces terms pairwise, as a tree algorithm would.
func tree(dt comm.DataType, op comm.OpKind, terms []float64) float64 {
	if len(terms) == 1 {
		return terms[0]
	}
	h := len(terms) / 2
	return kernelOp(dt, op, tree(dt, op, terms[:h]), tree(dt, op, terms[h:]))
}

// simulatedOutputs returns all-reduce outputs of count elements computed in
// dt's own precision in three orders (forward, backward, tree), as
// different algorithms would.
func simulatedOutputs(s *checkSpec, count int) [3][]byte {
	size := s.dt.Size()
	var outs [3][]byte
	for k := range outs {
		outs[k] = make([]byte, count*size)
	}
	fwd, bwd := make([]int, s.n), make([]int, s.n)
	for r := range s.n {
		fwd[r], bwd[r] = r, s.n-1-r
	}
	for j := range count {
		terms := make([]float64, s.n)
		for r := range terms {
			x := float64(s.input(r, j))
			switch s.op {
			case comm.OpAvg: // scaled by 1/n first, in the compute type
				if s.dt == comm.Float64 {
					x *= 1 / float64(s.n)
				} else {
					x = roundTo(s.dt, float64(float32(x)*float32(1/float64(s.n))))
				}
			case comm.OpPreMulSum:
				x = roundTo(s.dt, x*preMulScalar(r))
			}
			terms[r] = x
		}
		for k, v := range []float64{fold(s.dt, s.op, terms, fwd), fold(s.dt, s.op, terms, bwd), tree(s.dt, s.op, terms)} {
			storeBits(outs[k][j*size:], size, encodeFloat(s.dt, v))
		}
	}
	return outs
}

// The input patterns and tolerances must accept a correct reduction in the
// type's own precision whatever order it adds in, and reject a wrong one.
func TestCheckerAcceptsCorrectFloatReductions(t *testing.T) {
	allReduce, _ := lookupTest("all_reduce")
	const count = 300
	for _, d := range dataTypes {
		if !d.dt.IsFloat() {
			continue
		}
		for _, op := range redOps {
			for _, n := range rankCounts {
				s := newCheckSpec(d.dt, op.kind, n)
				name := fmt.Sprintf("%s/%s/n=%d", d.name, op.name, n)
				for k, out := range simulatedOutputs(&s, count) {
					if w := s.countWrong(allReduce, 0, -1, count, out); w != 0 {
						t.Errorf("%s: order %d: %d correct elements counted wrong", name, k, w)
					}
					size := d.dt.Size()
					poison(out[17*size : 18*size])
					if w := s.countWrong(allReduce, 0, -1, count, out); w != 1 {
						t.Errorf("%s: one poisoned element counted as %d wrong", name, w)
					}
				}
				if s.tol == 0 {
					// Exact results: a one-bit error must show.
					out := simulatedOutputs(&s, count)[0]
					out[40*d.dt.Size()] ^= 1
					if w := s.countWrong(allReduce, 0, -1, count, out); w != 1 {
						t.Errorf("%s: flipped low bit counted as %d wrong", name, w)
					}
				}
			}
		}
	}
}

// The patterns keep results exact wherever the type can count the sum.
func TestCheckerIsExactWherePossible(t *testing.T) {
	for _, tc := range []struct {
		dt comm.DataType
		op comm.OpKind
		n  int
	}{
		{comm.Float32, comm.OpSum, 64}, {comm.Float16, comm.OpSum, 16}, {comm.BFloat16, comm.OpSum, 8},
		{comm.Float8E4M3, comm.OpSum, 8}, {comm.Float8E5M2, comm.OpSum, 8}, {comm.Float8E5M2, comm.OpPreMulSum, 4},
		{comm.Float8E4M3, comm.OpProd, 64}, {comm.BFloat16, comm.OpMax, 64}, {comm.Int8, comm.OpAvg, 64},
	} {
		if s := newCheckSpec(tc.dt, tc.op, tc.n); s.tol != 0 {
			t.Errorf("%v %v on %d ranks: tolerance %g, want exact", tc.dt, tc.op, tc.n, s.tol)
		}
	}
}

// simulateInt reduces with Go's own wrapping arithmetic in type T.
func simulateInt[T int8 | uint8 | int32 | uint32 | int64 | uint64](s *checkSpec, j int) uint64 {
	acc := T(s.input(0, j)) * T(int64(preMulScalarOr1(s, 0)))
	for r := 1; r < s.n; r++ {
		v := T(s.input(r, j))
		switch s.op {
		case comm.OpProd:
			acc *= v
		case comm.OpMin:
			acc = min(acc, v)
		case comm.OpMax:
			acc = max(acc, v)
		case comm.OpPreMulSum:
			acc += T(int64(preMulScalar(r))) * v
		default:
			acc += v
		}
	}
	if s.op == comm.OpAvg {
		acc /= T(s.n) // truncates toward zero for signed T
	}
	return uint64(acc) & s.mask()
}

func preMulScalarOr1(s *checkSpec, rank int) float64 {
	if s.op == comm.OpPreMulSum {
		return preMulScalar(rank)
	}
	return 1
}

func TestCheckerIntegerReductionsWrap(t *testing.T) {
	allReduce, _ := lookupTest("all_reduce")
	const count = 200
	sims := map[comm.DataType]func(*checkSpec, int) uint64{
		comm.Int8: simulateInt[int8], comm.Uint8: simulateInt[uint8], comm.Int32: simulateInt[int32],
		comm.Uint32: simulateInt[uint32], comm.Int64: simulateInt[int64], comm.Uint64: simulateInt[uint64],
	}
	for dt, sim := range sims {
		for _, op := range redOps {
			for _, n := range rankCounts {
				s := newCheckSpec(dt, op.kind, n)
				size := dt.Size()
				out := make([]byte, count*size)
				for j := range count {
					storeBits(out[j*size:], size, sim(&s, j))
				}
				if w := s.countWrong(allReduce, 0, -1, count, out); w != 0 {
					t.Errorf("%v/%s/n=%d: %d correct elements counted wrong", dt, op.name, n, w)
				}
				out[5*size] ^= 1
				if w := s.countWrong(allReduce, 0, -1, count, out); w != 1 {
					t.Errorf("%v/%s/n=%d: one flipped bit counted as %d wrong", dt, op.name, n, w)
				}
			}
		}
	}
}

// Outputs the collective never wrote keep the poison, which no type reads
// as a correct value.
func TestCheckerCountsUnwrittenOutputs(t *testing.T) {
	for _, coll := range collectives {
		for _, d := range dataTypes {
			ops := []redOp{noOp}
			if coll.reducing {
				ops = redOps
			}
			for _, op := range ops {
				const n, block = 3, 10
				s := newCheckSpec(d.dt, op.kind, n)
				l := coll.layoutFor(block*n, n)
				out := make([]byte, l.recvCount*d.dt.Size())
				poison(out)
				if w := s.countWrong(coll, 1, 1, l.paramCount, out); w != int64(l.recvCount) {
					t.Errorf("%s/%s/%s: %d of %d poisoned elements counted wrong", coll.name, d.name, op.name, w, l.recvCount)
				}
			}
		}
	}
}

// A data-movement output built from the inputs passes; a block from the
// wrong rank does not.
func TestCheckerDataMovement(t *testing.T) {
	allGather, _ := lookupTest("all_gather")
	const n, block = 3, 8
	s := newCheckSpec(comm.Float32, opNone, n)
	size := 4
	out := make([]byte, n*block*size)
	for src := range n {
		s.fillInput(src, out[src*block*size:(src+1)*block*size])
	}
	if w := s.countWrong(allGather, 0, -1, block, out); w != 0 {
		t.Fatalf("correct all-gather output: %d wrong", w)
	}
	copy(out[2*block*size:], out[:block*size]) // rank 0's block where rank 2's belongs
	if w := s.countWrong(allGather, 0, -1, block, out); w == 0 {
		t.Error("misplaced block not detected")
	}
}

// Reduce and gather outputs are defined only at the root.
func TestCheckerSkipsNonRootOutputs(t *testing.T) {
	reduce, _ := lookupTest("reduce")
	s := newCheckSpec(comm.Float32, comm.OpSum, 2)
	out := make([]byte, 40)
	poison(out)
	if w := s.countWrong(reduce, 1, 0, 10, out); w != 0 {
		t.Errorf("non-root reduce output counted %d wrong", w)
	}
	if w := s.countWrong(reduce, 0, 0, 10, out); w != 10 {
		t.Errorf("root reduce output counted %d of 10 wrong", w)
	}
}
