package commtest

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"

	"github.com/gccl/gccl/comm"
)

// agreeValues are float inputs on which the order and the places of a
// reduction's operands show: NaNs with different payloads and signs (min
// and max return one operand when the other is NaN, and a NaN sum carries
// one operand's payload), infinities of both signs, signed zeros, and
// magnitudes that cancel in some orders and not in others.
var agreeValues = []float64{
	math.NaN(), math.Float64frombits(0xfff8_0000_0000_1234), math.Float64frombits(0x7ff8_0000_dead_0000),
	math.Inf(1), math.Inf(-1), 0, math.Copysign(0, -1),
	1e30, -1e30, 1, -1, 3e-8, 0.1, 7,
}

// FillAgree fills b, elements of float32 or float64, with rank's input of
// a check that every rank ends an all-reduce with the same bits: values
// drawn by rank and index from agreeValues. A float32 NaN keeps the top of
// its float64 payload.
func FillAgree(dt comm.DataType, b []byte, rank int) {
	for i := range len(b) / dt.Size() {
		v := agreeValues[(rank*5+i*3+i*i/7)%len(agreeValues)]
		switch dt {
		case comm.Float32:
			bits := math.Float32bits(float32(v))
			if math.IsNaN(v) {
				u := math.Float64bits(v)
				bits = uint32(u>>32)&0x8000_0000 | 0x7fc0_0000 | uint32(u>>29)&0x003f_ffff
			}
			binary.NativeEndian.PutUint32(b[4*i:], bits)
		case comm.Float64:
			binary.NativeEndian.PutUint64(b[8*i:], math.Float64bits(v))
		default:
			panic("commtest: FillAgree of " + dt.String())
		}
	}
}

// SameOnEveryRank checks that b holds the same bytes on every rank of c: each
// rank hashes its b and the ranks compare the hashes (an all-gather on c,
// which every rank must call).
func SameOnEveryRank(ctx context.Context, c *comm.Comm, b []byte) error {
	h := fnv.New64a()
	h.Write(b)
	mine, all := []uint64{h.Sum64()}, make([]uint64, c.Size())
	if err := comm.AllGather(ctx, c, mine, all); err != nil {
		return fmt.Errorf("comparing results: %w", err)
	}
	for p, hp := range all {
		if hp != mine[0] {
			return fmt.Errorf("rank %d's result differs from rank %d's", p, c.Rank())
		}
	}
	return nil
}
