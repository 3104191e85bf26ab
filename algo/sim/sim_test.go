package sim_test

import (
	"strings"
	"testing"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/algo/ring"
	"github.com/gccl/gccl/algo/sim"
)

// Shorthands for hand-made plans.
var (
	in  = algo.InBlock
	out = algo.OutBlock
	tmp = algo.TmpBlock
)

func plan(coll algo.Collective, n, rank, nblocks int, phases ...[]algo.Step) *algo.Plan {
	return &algo.Plan{Coll: coll, Algo: algo.Ring, NRanks: n, Rank: rank, NBlocks: nblocks, Phases: phases}
}

func steps(s ...algo.Step) []algo.Step { return s }

func unscaled(p *algo.Plan) *algo.Plan {
	p.Unscaled = true
	return p
}

// pairAllReduce is a correct all-reduce of one block on two ranks: rank 1
// sends its contribution, rank 0 completes the reduction and sends it back.
func pairAllReduce() []*algo.Plan {
	return []*algo.Plan{
		plan(algo.AllReduce, 2, 0, 1, steps(
			algo.RecvReduceCopySendStep(1, 1, in(0), out(0)).AsFinal())),
		plan(algo.AllReduce, 2, 1, 1, steps(
			algo.SendStep(0, in(0)),
			algo.RecvStep(0, out(0)))),
	}
}

func ringAllReduce(n int) []*algo.Plan {
	return sim.Plans(n, func(r int) *algo.Plan { return ring.AllReduce(n, r) })
}

var allOptions = []sim.Options{
	{QueueCap: 1, Chunks: 1},
	{QueueCap: 4, Chunks: 3},
	{QueueCap: 2, Chunks: 3, Order: sim.Random, Seed: 7},
}

func TestCorrectPlansPass(t *testing.T) {
	for _, opts := range allOptions {
		if err := sim.Run(pairAllReduce(), opts); err != nil {
			t.Errorf("%+v: %v", opts, err)
		}
		if opts.QueueCap >= ring.MinSlots {
			if err := sim.Run(ringAllReduce(5), opts); err != nil {
				t.Errorf("%+v: %v", opts, err)
			}
		}
	}
}

// TestBrokenPlansFail checks that the simulator catches each kind of broken
// schedule, with a message that names the problem.
func TestBrokenPlansFail(t *testing.T) {
	tests := []struct {
		name  string
		plans func() []*algo.Plan
		want  string // in the error
		slots int    // connection capacity, if not 4
	}{
		{"missing last step", func() []*algo.Plan {
			ps := ringAllReduce(4)
			ps[2].Phases[0] = ps[2].Phases[0][:len(ps[2].Phases[0])-1]
			return ps
		}, "never received", 0},
		{"missing middle step", func() []*algo.Plan {
			ps := ringAllReduce(4)
			ps[1].Phases[0] = append(ps[1].Phases[0][:2:2], ps[1].Phases[0][3:]...)
			return ps
		}, "", 0},
		{"swapped peer", func() []*algo.Plan {
			ps := ringAllReduce(4)
			ps[1].Phases[0][0].SendPeer = 3
			return ps
		}, "", 0},
		{"swapped blocks", func() []*algo.Plan {
			ps := ringAllReduce(4)
			ps[1].Phases[0][1].Src = in(2) // instead of in[3]
			return ps
		}, "another length", 0},
		{"contribution counted twice", func() []*algo.Plan {
			return []*algo.Plan{
				plan(algo.AllReduce, 3, 0, 1, steps(
					algo.RecvReduceCopyStep(1, in(0), tmp(0)),
					algo.RecvReduceCopyStep(1, tmp(0), out(0)))),
				plan(algo.AllReduce, 3, 1, 1, steps(
					algo.CopySendStep(0, in(0), out(0)),
					algo.SendStep(0, out(0)))),
				plan(algo.AllReduce, 3, 2, 1, steps(algo.CopyStep(in(0), out(0)))),
			}
		}, "counted twice", 0},
		{"in read twice", func() []*algo.Plan {
			ps := pairAllReduce()
			ps[1].Phases[0] = steps(
				algo.CopyStep(in(0), tmp(0)),
				algo.SendStep(0, in(0)),
				algo.RecvStep(0, out(0)))
			return ps
		}, "second time", 0},
		{"final missing", func() []*algo.Plan {
			ps := ringAllReduce(4)
			ps[3].Phases[0][3].Final = false
			return ps
		}, "not final", 0},
		{"final on a partial reduction", func() []*algo.Plan {
			ps := ringAllReduce(4)
			ps[3].Phases[0][2].Final = true
			return ps
		}, "does not complete", 0},
		{"final on a copy of the result", func() []*algo.Plan {
			ps := ringAllReduce(4)
			ps[0].Phases[0][4].Final = true
			return ps
		}, "does not complete", 0},
		{"final outside a reduction", func() []*algo.Plan {
			return []*algo.Plan{
				plan(algo.AllGather, 1, 0, 1, steps(algo.CopyStep(in(0), out(0)).AsFinal())),
			}
		}, "does not reduce", 0},
		{"deadlock: both receive first", func() []*algo.Plan {
			return []*algo.Plan{
				plan(algo.AllGather, 2, 0, 2, steps(
					algo.RecvStep(1, out(1)),
					algo.CopySendStep(1, in(0), out(0)))),
				plan(algo.AllGather, 2, 1, 2, steps(
					algo.RecvStep(0, out(0)),
					algo.CopySendStep(0, in(1), out(1)))),
			}
		}, "deadlock", 1},
		{"deadlock: ring of one-slot connections", func() []*algo.Plan { return ringAllReduce(3) }, "deadlock", 1},
		{"read of out never written", func() []*algo.Plan {
			ps := pairAllReduce()
			ps[1].Phases[0][0].Src = out(0)
			return ps
		}, "nothing has written", 0},
		{"tmp read in a later phase", func() []*algo.Plan {
			ps := pairAllReduce()
			ps[1].Phases = [][]algo.Step{
				steps(algo.CopyStep(in(0), tmp(0))),
				steps(algo.SendStep(0, tmp(0)), algo.RecvStep(0, out(0))),
			}
			return ps
		}, "tmp lives only", 0},
		{"in block the rank does not hold", func() []*algo.Plan {
			return []*algo.Plan{
				plan(algo.AllGather, 2, 0, 2, steps(
					algo.CopySendStep(1, in(1), out(0)),
					algo.RecvStep(1, out(1)))),
				plan(algo.AllGather, 2, 1, 2, steps(
					algo.CopySendStep(0, in(1), out(1)),
					algo.RecvStep(0, out(0)))),
			}
		}, "holds only block rank", 0},
		{"out at a non-root rank of reduce", func() []*algo.Plan {
			return []*algo.Plan{
				plan(algo.Reduce, 2, 0, 1, steps(algo.RecvReduceCopyStep(1, in(0), out(0)).AsFinal())),
				plan(algo.Reduce, 2, 1, 1, steps(algo.CopySendStep(0, in(0), out(0)))),
			}
		}, "only the root", 0},
		{"write to in", func() []*algo.Plan {
			ps := pairAllReduce()
			ps[1].Phases[0][1].Dst = in(0)
			return ps
		}, "read-only", 0},
		{"wrong result", func() []*algo.Plan {
			return []*algo.Plan{
				plan(algo.AllGather, 2, 0, 2, steps(
					algo.CopySendStep(1, in(0), out(0)),
					algo.RecvStep(1, out(0)))),
				plan(algo.AllGather, 2, 1, 2, steps(
					algo.CopySendStep(0, in(1), out(1)),
					algo.RecvStep(0, out(0)))),
			}
		}, "want", 0},
		{"result never finished", func() []*algo.Plan {
			// Rank 1 keeps its own contribution instead of the sum.
			ps := pairAllReduce()
			ps[1].Phases[0] = steps(
				algo.CopySendStep(0, in(0), out(0)),
				algo.RecvStep(0, tmp(0)))
			return ps
		}, "want", 0},
		{"field the primitive does not use", func() []*algo.Plan {
			ps := pairAllReduce()
			ps[1].Phases[0][0].Dst = out(0)
			return ps
		}, "not used", 0},
		{"plans of different collectives", func() []*algo.Plan {
			ps := pairAllReduce()
			ps[1].Coll = algo.ReduceScatter
			return ps
		}, "differs", 0},
		{"ranks reduce with the operands in different places", func() []*algo.Plan {
			// Each rank computes msg op own: x1 op x0 on rank 0, x0 op x1
			// on rank 1, which min and max with a NaN tell apart.
			var ps []*algo.Plan
			for r := range 2 {
				ps = append(ps, unscaled(plan(algo.AllReduce, 2, r, 1, steps(
					algo.SendStep(1-r, in(0)),
					algo.RecvReduceCopyStep(1-r, in(0), out(0)).AsFinal()))))
			}
			return ps
		}, "(0 1), rank 0 as (1 0)", 0},
		{"ranks reduce in different orders", func() []*algo.Plan {
			// Rank r folds the others' inputs into its own in the order
			// they come around the ring: (x2 op (x1 op x0)) on rank 0,
			// (x0 op (x2 op x1)) on rank 1.
			var ps []*algo.Plan
			for r := range 3 {
				a, b := (r+1)%3, (r+2)%3
				ps = append(ps, unscaled(plan(algo.AllReduce, 3, r, 1, steps(
					algo.SendStep(a, in(0)),
					algo.SendStep(b, in(0)),
					algo.RecvReduceCopyStep(a, in(0), out(0)),
					algo.RecvReduceCopyStep(b, out(0), out(0)).AsFinal()))))
			}
			return ps
		}, "the ranks' results may differ", 0},
		{"localReduce of in, unscaled, in a plan not marked so", func() []*algo.Plan {
			ps := pairAllReduce()
			ps[0].Phases[0] = steps(
				algo.RecvStep(1, out(0)),
				algo.LocalReduceStep(in(0), out(0)).AsFinal(),
				algo.SendStep(1, out(0)))
			return ps
		}, "without pre-scaling", 0},
		{"srcFirst on a step that reduces no message", func() []*algo.Plan {
			ps := pairAllReduce()
			ps[1].Phases[0][0].SrcFirst = true
			return ps
		}, "srcFirst on a step", 0},
		{"plan for the wrong rank", func() []*algo.Plan {
			ps := pairAllReduce()
			ps[0], ps[1] = ps[1], ps[0]
			return ps
		}, "want rank", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := sim.Options{QueueCap: 4, Chunks: 3}
			if tt.slots != 0 {
				opts.QueueCap = tt.slots
			}
			if tt.want == "never received" {
				// With more chunks the message left over from chunk 0
				// is received, wrongly, by chunk 1.
				opts.Chunks = 1
			}
			err := sim.Run(tt.plans(), opts)
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not mention %q", err, tt.want)
			}
			t.Log(err)
		})
	}
}

// TestCapacityMatters shows that connection capacity is modelled: two ranks
// that each send two messages before receiving deadlock with one slot and
// complete with two.
func TestCapacityMatters(t *testing.T) {
	plans := func() []*algo.Plan {
		var ps []*algo.Plan
		for r := range 2 {
			ps = append(ps, plan(algo.AllToAll, 2, r, 2, steps(
				algo.SendStep(1-r, in(1-r)),
				algo.SendStep(1-r, in(1-r)),
				algo.RecvStep(1-r, out(1-r)),
				algo.RecvStep(1-r, out(1-r)),
				algo.CopyStep(in(r), out(r)))))
		}
		return ps
	}
	if err := sim.Run(plans(), sim.Options{QueueCap: 1}); err == nil || !strings.Contains(err.Error(), "deadlock") {
		t.Errorf("one slot: got %v, want a deadlock", err)
	}
	if err := sim.Run(plans(), sim.Options{QueueCap: 2}); err != nil {
		t.Errorf("two slots: %v", err)
	}
}

// TestDeadlockReport checks that a deadlock names every blocked rank and what
// it waits for.
func TestDeadlockReport(t *testing.T) {
	err := sim.Run(ringAllReduce(3), sim.Options{QueueCap: 1})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"rank 0 phase 0 chunk 0 step 1", "rank 2 ", "room on the full connection to rank 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("report %q does not mention %q", err, want)
		}
	}
}
