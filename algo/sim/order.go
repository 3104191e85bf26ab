package sim

import (
	"fmt"
	"strconv"

	"github.com/gccl/gccl/algo"
)

// RunRankOrder is Run for deterministic reductions (algo.Deterministic*):
// beyond what Run checks, every result a reducing collective defines must
// have been computed as the left fold of the ranks' contributions in rank
// order, (((0 op 1) op 2) op ...), with each operand in its place, so that
// an element's bits do not depend on which rank owned it.
func RunRankOrder(plans []*algo.Plan, opts Options) error {
	if opts.QueueCap == 0 {
		opts.QueueCap = 1
	}
	if opts.Chunks == 0 {
		opts.Chunks = 1
	}
	if err := Run(plans, opts); err != nil {
		return err
	}
	if !plans[0].Coll.Reducing() {
		return fmt.Errorf("sim: %v does not reduce", plans[0].Coll)
	}
	// Run checked the plans and their results; replay them to read the
	// results' orders.
	s := newSim(plans, opts)
	if err := s.run(); err != nil {
		return err
	}
	want := "0"
	for r := 1; r < s.n; r++ {
		want = "(" + want + " " + strconv.Itoa(r) + ")"
	}
	for _, rs := range s.ranks {
		for b := range s.nblocks {
			for c := range s.opts.Chunks {
				if s.expected(rs.rank, b, c) == nil {
					continue
				}
				if got := rs.out[b][c].order; got != want {
					return fmt.Errorf("sim: rank %d computes out[%d] chunk %d as %s, not in rank order %s", rs.rank, b, c, got, want)
				}
			}
		}
	}
	return nil
}
