package tree_test

import (
	"flag"
	"fmt"
	"strings"
	"testing"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/algo/internal/gentest"
	"github.com/gccl/gccl/algo/tree"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// generators lists every plan generator of the package; unrooted ones ignore
// root.
var generators = []gentest.Generator{
	{Name: "allreduce", Gen: func(n, rank, _ int) *algo.Plan { return tree.AllReduce(n, rank) }},
	{Name: "reduce", Rooted: true, Gen: tree.Reduce},
	{Name: "broadcast", Rooted: true, Gen: tree.Broadcast},
}

func TestGolden(t *testing.T) {
	gentest.Golden(t, generators, *update)
	t.Run("trees", func(t *testing.T) {
		var b strings.Builder
		for n := 1; n <= 17; n++ {
			for _, root := range gentest.Roots(n, true, true) {
				for i, nodes := range tree.Trees(n, root) {
					fmt.Fprintf(&b, "n=%d root=%d tree %d\n", n, root, i)
					writeTree(&b, nodes, root, 1)
				}
				b.WriteString("\n")
			}
		}
		gentest.CheckGolden(t, "trees", b.String(), *update)
	})
}

// writeTree prints the subtree at rank, one rank a line, indented by depth.
func writeTree(b *strings.Builder, nodes []tree.Node, rank, depth int) {
	fmt.Fprintf(b, "%s%d\n", strings.Repeat("  ", depth), rank)
	for _, c := range nodes[rank].Children {
		writeTree(b, nodes, c, depth+1)
	}
}

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
					if p.Algo != algo.Tree || p.NRanks != n || p.Rank != rank || p.NBlocks != 2 {
						t.Errorf("%s n=%d root=%d rank=%d: header %s", g.Name, n, root, rank, strings.SplitN(p.String(), "\n", 2)[0])
					}
				}
			}
		}
	}
}

// TestTreeShape checks the properties the double binary tree is built for, on
// many sizes and roots.
func TestTreeShape(t *testing.T) {
	for n := 1; n <= 130; n++ {
		for _, root := range []int{0, 1, n / 2, n - 1} {
			if root >= n {
				continue
			}
			trees := tree.Trees(n, root)
			for i, nodes := range trees {
				checkTree(t, n, root, i, nodes)
			}
			// Complementary trees: no rank is interior in both, and
			// at most one (when n-1 is odd, so that each tree has more
			// leaves than interior nodes) is a leaf in both.
			leafInBoth := 0
			for r := range n {
				if r == root {
					continue
				}
				l0, l1 := len(trees[0][r].Children) == 0, len(trees[1][r].Children) == 0
				if !l0 && !l1 {
					t.Errorf("n=%d root=%d: rank %d is interior in both trees", n, root, r)
				}
				if l0 && l1 {
					leafInBoth++
				}
			}
			if leafInBoth > (n-1)%2 {
				t.Errorf("n=%d root=%d: %d ranks are leaves in both trees", n, root, leafInBoth)
			}
			if n > 2 && trees[0][root].Children[0] == trees[1][root].Children[0] {
				t.Errorf("n=%d root=%d: the root sends both blocks to rank %d", n, root, trees[0][root].Children[0])
			}
		}
	}
}

// checkTree checks that nodes is a binary tree over all n ranks hanging from
// root, which has one child, with minimal depth floor(log2(n-1))+1 below the
// root, and (tree 0) in-order over the relabelled ranks.
func checkTree(t *testing.T, n, root, i int, nodes []tree.Node) {
	t.Helper()
	if len(nodes) != n {
		t.Fatalf("n=%d root=%d tree %d: %d nodes", n, root, i, len(nodes))
	}
	if nodes[root].Parent != -1 || (n > 1 && len(nodes[root].Children) != 1) {
		t.Errorf("n=%d root=%d tree %d: root is %+v", n, root, i, nodes[root])
	}
	maxDepth := 0
	for m := n - 1; m > 0; m >>= 1 {
		maxDepth++
	}
	for r, node := range nodes {
		if len(node.Children) > 2 {
			t.Errorf("n=%d root=%d tree %d: rank %d has %d children", n, root, i, r, len(node.Children))
		}
		for _, c := range node.Children {
			if c < 0 || c >= n || nodes[c].Parent != r {
				t.Errorf("n=%d root=%d tree %d: rank %d has child %d whose parent is not %d", n, root, i, r, c, r)
			}
		}
		// Walk up to the root.
		depth := 0
		for p := r; p != root; p = nodes[p].Parent {
			if depth++; depth > maxDepth || p < 0 {
				t.Fatalf("n=%d root=%d tree %d: rank %d is %d+ levels below the root or not connected to it", n, root, i, r, depth)
			}
		}
	}
	if i == 0 {
		label := func(r int) int { return (r - root + n) % n }
		var inOrder []int
		var walk func(r int)
		walk = func(r int) {
			kids := nodes[r].Children
			// In-order: children smaller than r, then r, then larger.
			for _, c := range kids {
				if label(c) < label(r) {
					walk(c)
				}
			}
			inOrder = append(inOrder, label(r))
			for _, c := range kids {
				if label(c) > label(r) {
					walk(c)
				}
			}
		}
		walk(root)
		for j, v := range inOrder {
			if v != j {
				t.Errorf("n=%d root=%d tree 0 is not in order: %v", n, root, inOrder)
				break
			}
		}
	}
}
