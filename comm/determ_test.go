package comm_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/internal/commtest"
)

// determCheck runs the deterministic contract's check on every rank of cs.
func determCheck(t *testing.T, cs []*comm.Comm, opts commtest.DetermOptions) []error {
	t.Helper()
	return onAll(t, cs, func(c *comm.Comm) error {
		return commtest.CheckDeterministic(context.Background(), c, opts)
	})
}

// TestDeterministicContract: with Config.Deterministic, every element of
// AllReduce, ReduceScatter and Reduce (Sum, Avg, PreMulSum; float32,
// float64, bfloat16, float16; in place and not) has the bits of the
// rank-order fold, in messages of lengths that cross the chunks, the
// owners' blocks and Reduce's windows, at many offsets, whatever
// GCCL_ALGO forces and whatever the slot size.
func TestDeterministicContract(t *testing.T) {
	for _, tc := range []struct {
		n    int
		slot int
		algo string
	}{
		{2, 256, ""}, {3, 256, "tree"}, {4, 512, "ring"}, {3, 0, ""},
	} {
		t.Run(fmt.Sprintf("n=%d/slot=%d/algo=%q", tc.n, tc.slot, tc.algo), func(t *testing.T) {
			cs := world(t, tc.n, &comm.Config{Deterministic: true, SlotSize: tc.slot, Algo: tc.algo})
			opts := commtest.DetermOptions{Sizes: commtest.DetermSizes(cs[0], tc.slot, 1<<12)}
			if tc.slot == 0 {
				// The default 64 KiB slots: around a float32 chunk, the
				// owners' blocks and past a float32 Reduce window.
				opts.Sizes = []int{1, 5, 16383, 16385, 3*16384 + 1, 8*3*16384 + 7}
				opts.Types = []comm.DataType{comm.Float32, comm.BFloat16}
			}
			if testing.Short() {
				opts.Sizes = opts.Sizes[:min(len(opts.Sizes), 20)]
			}
			mustAll(t, determCheck(t, cs, opts))
		})
	}
}

// TestDeterministicProdMinMax: the contract is the rank-order fold of any
// op, so Prod (whose rounding depends on the order, as a sum's does), Min
// and Max follow it too, through the same schedules.
func TestDeterministicProdMinMax(t *testing.T) {
	for _, tc := range []struct {
		n    int
		algo string
	}{{3, "ring"}, {4, ""}} {
		t.Run(fmt.Sprintf("n=%d/algo=%q", tc.n, tc.algo), func(t *testing.T) {
			cs := world(t, tc.n, &comm.Config{Deterministic: true, SlotSize: 256, Algo: tc.algo})
			opts := commtest.DetermOptions{
				Types: []comm.DataType{comm.Float32, comm.Float64, comm.BFloat16, comm.Float16},
				Ops:   []comm.Op{comm.Prod, comm.Min, comm.Max},
				Sizes: []int{1, 63, 64, 65, 3*64 + 1, 1000},
			}
			mustAll(t, determCheck(t, cs, opts))
		})
	}
}

// TestDeterministicCheckHasTeeth: the same check on the default path's ring
// (which folds block b from rank b+1 on) finds elements whose bits differ,
// so the data can tell orders apart and the check proves something. (On
// three ranks the one-exchange all-reduce, which the tuner picks for small
// messages, computes x2+(x1+x0): the rank-order fold, by commutativity.)
func TestDeterministicCheckHasTeeth(t *testing.T) {
	cs := world(t, 3, &comm.Config{SlotSize: 256, Algo: "ring"})
	opts := commtest.DetermOptions{Types: []comm.DataType{comm.Float32}, Ops: []comm.Op{comm.Sum}}
	opts.Sizes = commtest.DetermSizes(cs[0], 256, 1<<12)
	errs := determCheck(t, cs, opts)
	for _, err := range errs {
		if err != nil && strings.Contains(err.Error(), "the rank-order fold") {
			t.Logf("default ring: %v", err)
			return // a value off the rank-order fold, as expected
		}
	}
	t.Fatalf("the default path matched the rank-order fold everywhere (%v): the check's data cannot tell orders apart", errs)
}

func TestDeterministicFromEnvironment(t *testing.T) {
	t.Setenv("GCCL_DETERMINISTIC", "1")
	cs := world(t, 2, nil)
	if !cs[0].Deterministic() {
		t.Fatal("GCCL_DETERMINISTIC=1 left the Comm non-deterministic")
	}
	mustAll(t, determCheck(t, cs, commtest.DetermOptions{
		Types: []comm.DataType{comm.Float32}, Ops: []comm.Op{comm.Sum}, Sizes: []int{1, 7, 100000}}))

	t.Setenv("GCCL_DETERMINISTIC", "0")
	if cs := world(t, 1, nil); cs[0].Deterministic() {
		t.Fatal("GCCL_DETERMINISTIC=0 made the Comm deterministic")
	}
	if cs := world(t, 1, &comm.Config{Deterministic: true}); !cs[0].Deterministic() {
		t.Fatal("Config.Deterministic lost to GCCL_DETERMINISTIC=0")
	}
	t.Setenv("GCCL_DETERMINISTIC", "yes please")
	if _, err := comm.InitLocal(2, nil); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Fatalf("GCCL_DETERMINISTIC=\"yes please\": %v, want ErrInvalidArgument", err)
	}
}

// Communicators made by Split keep the setting.
func TestDeterministicSplitKeepsIt(t *testing.T) {
	cs := world(t, 4, &comm.Config{Deterministic: true})
	subs := make([]*comm.Comm, 4)
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		s, err := c.Split(context.Background(), c.Rank()%2, c.Rank())
		subs[c.Rank()] = s
		return err
	}))
	for _, s := range subs {
		defer s.Close()
		if !s.Deterministic() {
			t.Fatal("Split lost Config.Deterministic")
		}
	}
}

func TestDeterministicAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	const n, count = 3, 50000 // several chunks per block and Reduce windows
	cs := world(t, n, &comm.Config{Deterministic: true, SlotSize: 4096})
	in, out := make([][]float32, n), make([][]float32, n)
	for r := range n {
		in[r], out[r] = make([]float32, n*count), make([]float32, n*count)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		op   func(c *comm.Comm) error
	}{
		{"AllReduce", func(c *comm.Comm) error {
			return comm.AllReduce(ctx, c, in[c.Rank()][:count], out[c.Rank()][:count], comm.Avg)
		}},
		{"ReduceScatter", func(c *comm.Comm) error {
			return comm.ReduceScatter(ctx, c, in[c.Rank()], out[c.Rank()][:count], comm.PreMulSum(0.5))
		}},
		{"Reduce", func(c *comm.Comm) error {
			return comm.Reduce(ctx, c, in[c.Rank()][:count], out[c.Rank()][:count], comm.Sum, 1)
		}},
	} {
		run, stop := lockstep(t, cs, tc.op)
		run() // plans, scratch
		if a := testing.AllocsPerRun(20, run); a != 0 {
			t.Errorf("deterministic %s: %v allocations per call, want 0", tc.name, a)
		}
		stop()
	}
}
