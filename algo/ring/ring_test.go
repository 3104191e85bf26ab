package ring_test

import (
	"flag"
	"fmt"
	"strings"
	"testing"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/algo/internal/gentest"
	"github.com/gccl/gccl/algo/ring"
	"github.com/gccl/gccl/algo/sim"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// generators lists every plan generator of the package.
var generators = []gentest.Generator{
	{Name: "allreduce", MinSlots: ring.MinSlots, Gen: func(n, rank, _ int) *algo.Plan { return ring.AllReduce(n, rank) }},
	{Name: "reducescatter", MinSlots: ring.MinSlots, Gen: func(n, rank, _ int) *algo.Plan { return ring.ReduceScatter(n, rank) }},
	{Name: "allgather", MinSlots: ring.MinSlots, Gen: func(n, rank, _ int) *algo.Plan { return ring.AllGather(n, rank) }},
	{Name: "broadcast", Rooted: true, MinSlots: 1, Gen: ring.Broadcast},
	{Name: "reduce", Rooted: true, MinSlots: 1, Gen: ring.Reduce},
}

func TestGolden(t *testing.T) { gentest.Golden(t, generators, *update) }

func TestSimulate(t *testing.T) { gentest.Simulate(t, generators) }

// TestOneSlotDeadlocks shows why ring schedules need MinSlots: with one slot
// per connection every rank's first message fills its connection, and each
// fused receive-and-send step then waits for its successor to do the same.
func TestOneSlotDeadlocks(t *testing.T) {
	for _, g := range generators[:3] {
		for _, n := range []int{3, 4, 17} {
			plans := sim.Plans(n, func(rank int) *algo.Plan { return g.Gen(n, rank, 0) })
			err := sim.Run(plans, sim.Options{QueueCap: 1, Chunks: 1})
			if err == nil || !strings.Contains(err.Error(), "deadlock") {
				t.Errorf("%s n=%d with one slot: got %v, want a deadlock", g.Name, n, err)
			}
		}
	}
}

func TestValidate(t *testing.T) {
	for _, g := range generators {
		for _, n := range gentest.SimSizes {
			for _, root := range gentest.Roots(n, g.Rooted, false) {
				for rank := range n {
					p := g.Gen(n, rank, root)
					if err := p.Validate(); err != nil {
						t.Errorf("%s n=%d root=%d rank=%d: %v", g.Name, n, root, rank, err)
					}
					if p.Algo != algo.Ring || p.NRanks != n || p.Rank != rank {
						t.Errorf("%s n=%d root=%d rank=%d: header %s", g.Name, n, root, rank, strings.SplitN(p.String(), "\n", 2)[0])
					}
				}
			}
		}
	}
}

// TestAllReduceTransfers checks the ring's cost: every rank sends and receives
// 2(n-1) messages.
func TestAllReduceTransfers(t *testing.T) {
	for n := 2; n <= 17; n++ {
		for rank := range n {
			sends, recvs := 0, 0
			for _, st := range ring.AllReduce(n, rank).Phases[0] {
				if st.Prim.Sends() {
					sends++
				}
				if st.Prim.Recvs() {
					recvs++
				}
			}
			if sends != 2*(n-1) || recvs != 2*(n-1) {
				t.Errorf("n=%d rank=%d: %d sends, %d receives, want %d", n, rank, sends, recvs, 2*(n-1))
			}
		}
	}
}

func Example() {
	for rank := range 3 {
		fmt.Print(ring.AllReduce(3, rank))
	}
	// Output:
	// AllReduce Ring n=3 rank=0 root=0 blocks=3
	//   phase 0
	//     send to=1 src=in[2]
	//     recvReduceSend from=2 to=1 src=in[1]
	//     recvReduceCopySend from=2 to=1 src=in[0] dst=out[0] final
	//     recvCopySend from=2 to=1 dst=out[2]
	//     recv from=2 dst=out[1]
	// AllReduce Ring n=3 rank=1 root=0 blocks=3
	//   phase 0
	//     send to=2 src=in[0]
	//     recvReduceSend from=0 to=2 src=in[2]
	//     recvReduceCopySend from=0 to=2 src=in[1] dst=out[1] final
	//     recvCopySend from=0 to=2 dst=out[0]
	//     recv from=0 dst=out[2]
	// AllReduce Ring n=3 rank=2 root=0 blocks=3
	//   phase 0
	//     send to=0 src=in[1]
	//     recvReduceSend from=1 to=0 src=in[0]
	//     recvReduceCopySend from=1 to=0 src=in[2] dst=out[2] final
	//     recvCopySend from=1 to=0 dst=out[1]
	//     recv from=1 dst=out[0]
}
