// External test package: algo/sim imports algo.
package algo_test

import (
	"flag"
	"strings"
	"testing"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/algo/internal/gentest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// generators lists the generators of package algo; unrooted ones ignore root.
var generators = []gentest.Generator{
	{Name: "alltoall", Gen: func(n, rank, _ int) *algo.Plan { return algo.PairwiseAllToAll(n, rank) }},
	{Name: "gather", Rooted: true, Gen: algo.DirectGather},
	{Name: "scatter", Rooted: true, Gen: algo.DirectScatter},
	{Name: "allgather", Gen: func(n, rank, _ int) *algo.Plan { return algo.DirectAllGather(n, rank) }},
}

func TestGolden(t *testing.T) { gentest.Golden(t, generators, *update) }

func TestSimulate(t *testing.T) { gentest.Simulate(t, generators) }

func TestValidate(t *testing.T) {
	for _, g := range generators {
		for _, n := range gentest.SimSizes {
			for _, root := range gentest.Roots(n, g.Rooted, false) {
				for rank := range n {
					p := g.Gen(n, rank, root)
					if err := p.Validate(); err != nil {
						t.Errorf("%s n=%d root=%d rank=%d: %v", g.Name, n, root, rank, err)
					}
					if p.NRanks != n || p.Rank != rank || p.Root != root || p.NBlocks != n {
						t.Errorf("%s n=%d root=%d rank=%d: header %s", g.Name, n, root, rank, strings.SplitN(p.String(), "\n", 2)[0])
					}
				}
			}
		}
	}
}

// TestStepConstructors checks that every constructor sets exactly the fields
// its primitive uses, with -1 for unused peers.
func TestStepConstructors(t *testing.T) {
	in, out := algo.InBlock(0), algo.OutBlock(1)
	for _, tt := range []struct {
		got  algo.Step
		want algo.Step
	}{
		{algo.SendStep(2, in), algo.Step{Prim: algo.Send, SendPeer: 2, RecvPeer: -1, Src: in}},
		{algo.RecvStep(3, out), algo.Step{Prim: algo.Recv, SendPeer: -1, RecvPeer: 3, Dst: out}},
		{algo.CopySendStep(2, in, out), algo.Step{Prim: algo.CopySend, SendPeer: 2, RecvPeer: -1, Src: in, Dst: out}},
		{algo.RecvCopySendStep(3, 2, out), algo.Step{Prim: algo.RecvCopySend, SendPeer: 2, RecvPeer: 3, Dst: out}},
		{algo.RecvReduceSendStep(3, 2, in), algo.Step{Prim: algo.RecvReduceSend, SendPeer: 2, RecvPeer: 3, Src: in}},
		{algo.RecvReduceCopyStep(3, in, out), algo.Step{Prim: algo.RecvReduceCopy, SendPeer: -1, RecvPeer: 3, Src: in, Dst: out}},
		{algo.RecvReduceCopySendStep(3, 2, in, out), algo.Step{Prim: algo.RecvReduceCopySend, SendPeer: 2, RecvPeer: 3, Src: in, Dst: out}},
		{algo.CopyStep(in, out), algo.Step{Prim: algo.Copy, SendPeer: -1, RecvPeer: -1, Src: in, Dst: out}},
		{algo.SendRecvStep(2, in, 3, out), algo.Step{Prim: algo.SendRecv, SendPeer: 2, RecvPeer: 3, Src: in, Dst: out}},
		{algo.CopyStep(in, out).AsFinal(), algo.Step{Prim: algo.Copy, SendPeer: -1, RecvPeer: -1, Src: in, Dst: out, Final: true}},
		{algo.LocalReduceStep(in, out), algo.Step{Prim: algo.LocalReduce, SendPeer: -1, RecvPeer: -1, Src: in, Dst: out}},
		{algo.RecvReduceCopyStep(3, in, out).AsSrcFirst(), algo.Step{Prim: algo.RecvReduceCopy, SendPeer: -1, RecvPeer: 3, Src: in, Dst: out, SrcFirst: true}},
	} {
		if tt.got != tt.want {
			t.Errorf("got %+v, want %+v", tt.got, tt.want)
		}
	}
}
