package comm

import (
	"context"
	"os"
	"strconv"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/transport"
)

// The deterministic path (Config.Deterministic, GCCL_DETERMINISTIC=1).
//
// Contract: for a fixed rank count n, AllReduce, Reduce and ReduceScatter
// return, for every element, the left fold of the ranks' contributions in
// rank order, (((x0 op x1) op x2) op ...) op x(n-1), each step rounded to
// the element type as the kernels of internal/reduce round it (float16,
// bfloat16 and the fp8 types compute in float32 and round back after every
// step). With PreMulSum (scalar s) and a floating-point Avg (s = 1/n) each
// contribution is first scaled and rounded to the type, xi' = xi*s (s
// rounded to float32 for the types that compute in float32), and the
// scaled contributions are folded in rank order; an integer Avg divides
// the folded sum by n once, truncating. The bits depend on nothing else:
// not on the message's length or the element's place in it, the slot size
// and chunking, GCCL_ALGO or the tuner, the transport, in place or not,
// host or device buffers (device buffers are staged through host memory
// and reduced there), nor on the rank that owns the element. Reduce
// returns at the root the bits AllReduce returns. A NaN result is a NaN;
// which NaN, when two operands are NaNs with different payloads, is not
// part of the contract (Go's floating-point arithmetic does not fix it).
//
// Schedule: a direct reduce-scatter, then (AllReduce) a direct all-gather
// (algo.DeterministicAllReduce, algo.DeterministicReduceScatter): bandwidth
// as a ring's, (n-1)/n of the vector each way per phase, in one hop. A
// Reduce runs the all-reduce's plan in windows of determWindowChunks chunks
// per rank, the non-roots' results going to scratch they discard (a
// non-root has no output buffer to keep a block in between the phases).
// Every rank of a communicator must have the setting alike: the messages'
// checks differ, so a rank that does not fails with ErrMismatch.

// determWindowChunks bounds a deterministic Reduce's scratch at a non-root
// to determWindowChunks chunks per rank.
const determWindowChunks = 8

// determCheck marks the messages of the deterministic path in their tags'
// argument checks.
const determCheck = 0xd37e

// deterministic resolves Config.Deterministic and GCCL_DETERMINISTIC.
func deterministic(cfg *Config) (bool, error) {
	if cfg.Deterministic {
		return true, nil
	}
	s := os.Getenv("GCCL_DETERMINISTIC")
	if s == "" {
		return false, nil
	}
	on, err := strconv.ParseBool(s)
	if err != nil {
		return false, invalid("GCCL_DETERMINISTIC=%q is not 0 or 1", s)
	}
	return on, nil
}

// Deterministic reports whether the Comm's reductions follow the
// deterministic contract (Config.Deterministic).
func (c *Comm) Deterministic() bool { return c.cfg.Deterministic }

// runDeterministic runs a reducing call on the deterministic path, device
// buffers through host staging.
func (c *Comm) runDeterministic(ctx context.Context, cl *call) error {
	dev := cl.hasDevice()
	if dev {
		if err := cl.stageIn(); err != nil {
			return c.opErr(cl, err)
		}
	}
	if err := c.runDeterministicHost(ctx, cl); err != nil {
		return err
	}
	if dev {
		return c.opErr(cl, cl.stageOut())
	}
	return nil
}

func (c *Comm) runDeterministicHost(ctx context.Context, cl *call) error {
	a := &c.args
	*a = collArgs{esz: cl.dtype().Size()}
	a.in, a.out = cl.in.b, cl.out.b
	switch cl.coll {
	case algo.AllReduce:
		a.count, a.split, a.inAll, a.outAll = len(a.out)/a.esz, true, true, true
	case algo.Reduce:
		a.count, a.split, a.inAll, a.outAll = len(a.in)/a.esz, true, true, true
	case algo.ReduceScatter:
		a.count, a.inAll = len(a.out)/a.esz, true
	}
	c.setOp(a, cl)
	// Tmp holds one chunk of the owner's block, which is block rank.
	if need := c.size * c.ep.SlotSize(); len(c.tmp) < need {
		c.tmp = make([]byte, need)
	}
	coll := cl.coll
	if coll == algo.Reduce {
		coll = algo.AllReduce
	}
	a.plan = c.determPlan(coll)
	x := &c.exec
	check := transport.ArgCheck(uint64(a.count), cl.argBits()) ^ determCheck
	x.begin(ctx, cl.name(), cl.seq, transport.MakeTag(uint8(cl.coll), cl.seq).WithCheck(check))
	if cl.coll != algo.Reduce {
		return x.runPlan(a)
	}
	total, in, out := a.count, a.in, a.out
	win := c.size * c.chunkElems(a.esz) * determWindowChunks
	if c.rank != cl.root {
		if need := min(total, win) * a.esz; cap(c.scratch) < need {
			c.scratch = make([]byte, need)
		}
	}
	for off := 0; off < total; off += win {
		end := min(off+win, total)
		lo, hi := off*a.esz, end*a.esz
		a.count, a.in = end-off, in[lo:hi]
		if c.rank == cl.root {
			a.out = out[lo:hi]
		} else {
			a.out = c.scratch[:hi-lo]
		}
		if err := x.runPlan(a); err != nil {
			return err
		}
	}
	return nil
}

// determPlan returns this rank's cached deterministic plan for coll
// (AllReduce or ReduceScatter). Its cache key has no algorithm, which the
// tuner's keys always have.
func (c *Comm) determPlan(coll algo.Collective) *algo.Plan {
	k := planKey{coll: coll}
	if p := c.plans[k]; p != nil {
		return p
	}
	var p *algo.Plan
	if coll == algo.ReduceScatter {
		p = algo.DeterministicReduceScatter(c.size, c.rank)
	} else {
		p = algo.DeterministicAllReduce(c.size, c.rank)
	}
	c.plans[k] = p
	return p
}
