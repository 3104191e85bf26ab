package tree

import "github.com/gccl/gccl/algo"

// nblocks is the number of blocks of every tree plan: block t goes through
// tree t.
const nblocks = 2

func plan(coll algo.Collective, n, rank, root int, phases ...[]algo.Step) *algo.Plan {
	return &algo.Plan{
		Coll:    coll,
		Algo:    algo.Tree,
		NRanks:  n,
		Rank:    rank,
		Root:    root,
		NBlocks: nblocks,
		Phases:  phases,
	}
}

// localCopies is the whole plan for n = 1: copy both blocks, finishing the
// (one-rank) reduction where the collective reduces.
func localCopies(coll algo.Collective) []algo.Step {
	steps := make([]algo.Step, nblocks)
	for t := range steps {
		steps[t] = algo.CopyStep(algo.InBlock(t), algo.OutBlock(t))
		if coll.Reducing() {
			steps[t] = steps[t].AsFinal()
		}
	}
	return steps
}

// upSteps returns rank's reduction of block t towards the root along tree t.
// acc is where an interior node with two children keeps the partial sum of its
// first child: Out where every rank has one, Tmp otherwise.
func upSteps(steps []algo.Step, node Node, t int, acc algo.Ref) []algo.Step {
	in := algo.InBlock(t)
	switch kids := node.Children; {
	case node.Parent < 0: // the root has exactly one child
		steps = append(steps, algo.RecvReduceCopyStep(kids[0], in, algo.OutBlock(t)).AsFinal())
	case len(kids) == 0:
		steps = append(steps, algo.SendStep(node.Parent, in))
	case len(kids) == 1:
		steps = append(steps, algo.RecvReduceSendStep(kids[0], node.Parent, in))
	default:
		steps = append(steps,
			algo.RecvReduceCopyStep(kids[0], in, acc),
			algo.RecvReduceSendStep(kids[1], node.Parent, acc))
	}
	return steps
}

// downSteps returns rank's broadcast of block t from the root along tree t;
// the root sends src (Out for all-reduce, where the up phase left the result
// there, In for broadcast).
func downSteps(steps []algo.Step, node Node, t int, src algo.Ref) []algo.Step {
	out := algo.OutBlock(t)
	kids := node.Children
	switch {
	case node.Parent < 0: // the root has exactly one child
		if src == out {
			steps = append(steps, algo.SendStep(kids[0], out))
		} else {
			steps = append(steps, algo.CopySendStep(kids[0], src, out))
		}
	case len(kids) == 0:
		steps = append(steps, algo.RecvStep(node.Parent, out))
	default:
		steps = append(steps, algo.RecvCopySendStep(node.Parent, kids[0], out))
		if len(kids) == 2 {
			steps = append(steps, algo.SendStep(kids[1], out))
		}
	}
	return steps
}

// AllReduce returns rank's double binary tree all-reduce plan on n ranks
// (NBlocks = 2, root 0): phase 0 reduces block t up tree t to rank 0, phase 1
// broadcasts it back down. As two phases, the executor overlaps the
// reduction of one chunk with the broadcast of earlier ones on other ranks.
func AllReduce(n, rank int) *algo.Plan {
	if n == 1 {
		return plan(algo.AllReduce, 1, 0, 0, localCopies(algo.AllReduce))
	}
	trees := Trees(n, 0)
	var up, down []algo.Step
	for t := range nblocks {
		up = upSteps(up, trees[t][rank], t, algo.OutBlock(t))
	}
	for t := range nblocks {
		down = downSteps(down, trees[t][rank], t, algo.OutBlock(t))
	}
	return plan(algo.AllReduce, n, rank, 0, up, down)
}

// Reduce returns rank's double binary tree reduce plan on n ranks
// (NBlocks = 2): the up phase of AllReduce, towards root. Only the root has an
// Out buffer, so interior nodes accumulate in Tmp.
func Reduce(n, rank, root int) *algo.Plan {
	if n == 1 {
		return plan(algo.Reduce, 1, 0, root, localCopies(algo.Reduce))
	}
	trees := Trees(n, root)
	var up []algo.Step
	for t := range nblocks {
		up = upSteps(up, trees[t][rank], t, algo.TmpBlock(t))
	}
	return plan(algo.Reduce, n, rank, root, up)
}

// Broadcast returns rank's double binary tree broadcast plan on n ranks
// (NBlocks = 2): the down phase of AllReduce, from root, which also copies
// its In into its own Out.
func Broadcast(n, rank, root int) *algo.Plan {
	if n == 1 {
		return plan(algo.Broadcast, 1, 0, root, localCopies(algo.Broadcast))
	}
	trees := Trees(n, root)
	var down []algo.Step
	for t := range nblocks {
		down = downSteps(down, trees[t][rank], t, algo.InBlock(t))
	}
	return plan(algo.Broadcast, n, rank, root, down)
}
