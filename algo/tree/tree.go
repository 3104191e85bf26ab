// Package tree generates double binary tree schedules, as in NCCL: two binary
// trees over the same ranks, each carrying half of the data (block t goes
// through tree t), built so that most ranks that are leaves in one tree are
// interior nodes in the other. Every rank then sends and receives about the
// same amount in total, and a reduction or broadcast takes O(log n) steps
// instead of the ring's O(n).
//
// The trees are built over relabelled ranks v = (rank - root + n) % n, so the
// collective's root is v = 0. It is the top of both trees and has exactly one
// child in each; the labels 1..n-1 form a binary tree below it.
package tree

// Node is one rank's place in a tree, in actual rank numbers.
type Node struct {
	Parent   int   // -1 at the top
	Children []int // zero, one or two ranks, in tree order
}

// Trees returns the two trees for n ranks with the given root, indexed by tree
// and then by rank.
func Trees(n, root int) [2][]Node {
	var trees [2][]Node
	for t := range trees {
		labels := labelTree(n, t)
		nodes := make([]Node, n)
		toRank := func(v int) int {
			if v < 0 {
				return -1
			}
			return (v + root) % n
		}
		for v, ln := range labels {
			r := toRank(v)
			nodes[r].Parent = toRank(ln.Parent)
			for _, c := range ln.Children {
				nodes[r].Children = append(nodes[r].Children, toRank(c))
			}
		}
		trees[t] = nodes
	}
	return trees
}

// labelTree returns tree t over labels 0..n-1 (label 0 on top).
//
// Tree 0 is an in-order binary tree over labels 1..m (m = n-1): the root of a
// contiguous range of labels is the label in it with the most trailing zero
// bits (unique in any range). This is NCCL's btree: its depth is
// floor(log2 m)+1, the least possible, and its leaves are exactly the odd
// labels while every even label is interior.
//
// Tree 1 is tree 0 with its labels permuted so that its leaves become
// interior nodes and vice versa. Mirroring (position x holds label m+1-x)
// flips parity when m is even; when m is odd mirroring would keep odd labels
// on odd positions, so tree 1 shifts labels by one instead (position x holds
// label x+1, and position m holds label 1), which leaves only label 1 a leaf
// in both trees.
func labelTree(n, t int) []Node {
	nodes := make([]Node, n)
	for v := range nodes {
		nodes[v].Parent = -1
	}
	m := n - 1
	if m < 1 {
		return nodes
	}
	// label maps a position of tree 0 to the label that tree t puts there.
	label := func(x int) int {
		switch {
		case t == 0:
			return x
		case m%2 == 0:
			return m + 1 - x
		default:
			return x%m + 1
		}
	}
	var build func(lo, hi, parent int)
	build = func(lo, hi, parent int) {
		if lo > hi {
			return
		}
		mid := mostTrailingZeros(lo, hi)
		v := label(mid)
		nodes[v].Parent = parent
		nodes[parent].Children = append(nodes[parent].Children, v)
		build(lo, mid-1, v)
		build(mid+1, hi, v)
	}
	build(1, m, 0)
	return nodes
}

// mostTrailingZeros returns the number in [lo, hi] (1 <= lo <= hi) with the
// most trailing zero bits: hi with its low bits cleared down to the highest bit
// in which lo and hi differ.
func mostTrailingZeros(lo, hi int) int {
	for bit := 1; ; bit <<= 1 {
		// Clearing the low bits of hi up to bit stays in range as long as
		// the result is still >= lo; the last such value is the answer.
		if c := hi &^ (2*bit - 1); c < lo {
			return hi &^ (bit - 1)
		}
	}
}
