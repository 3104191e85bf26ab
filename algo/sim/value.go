package sim

import (
	"fmt"
	"math/bits"
	"strings"
)

// rankSet is an immutable set of ranks; operations return new sets.
type rankSet []uint64

func singleRank(n, r int) rankSet {
	s := make(rankSet, (n+63)/64)
	s[r/64] |= 1 << (r % 64)
	return s
}

func allRanks(n int) rankSet {
	s := make(rankSet, (n+63)/64)
	for r := range n {
		s[r/64] |= 1 << (r % 64)
	}
	return s
}

func (s rankSet) count() int {
	c := 0
	for _, w := range s {
		c += bits.OnesCount64(w)
	}
	return c
}

func (s rankSet) intersects(o rankSet) bool {
	for i := range s {
		if s[i]&o[i] != 0 {
			return true
		}
	}
	return false
}

func (s rankSet) union(o rankSet) rankSet {
	u := make(rankSet, len(s))
	for i := range s {
		u[i] = s[i] | o[i]
	}
	return u
}

func (s rankSet) equal(o rankSet) bool {
	for i := range s {
		if s[i] != o[i] {
			return false
		}
	}
	return true
}

func (s rankSet) String() string {
	var b strings.Builder
	b.WriteByte('{')
	first := true
	for i, w := range s {
		for w != 0 {
			r := i*64 + bits.TrailingZeros64(w)
			w &= w - 1
			if !first {
				b.WriteByte(',')
			}
			first = false
			fmt.Fprint(&b, r)
		}
	}
	b.WriteByte('}')
	return b.String()
}

// value is the symbolic content of one chunk of one block: the In chunks it
// was computed from, all of the same logical block and chunk index, one per
// contributing rank. A value copied without reduction has one contributor.
type value struct {
	block int // the block of the contributors' In buffers
	chunk int
	ranks rankSet
	final bool // a Final step applied the op's post-operation
	// order is how the value was computed: a contributor's rank, or
	// "(a b)" for a op b, a being the incoming operand (see reduce).
	order string
}

func (v *value) String() string {
	if v == nil {
		return "nothing"
	}
	s := fmt.Sprintf("block %d chunk %d of ranks %v", v.block, v.chunk, v.ranks)
	if v.final {
		s += " (final)"
	}
	return s
}

// equal reports whether v and w hold the same data.
func (v *value) equal(w *value) bool {
	return v != nil && w != nil && v.block == w.block && v.chunk == w.chunk && v.final == w.final && v.ranks.equal(w.ranks)
}

// reduce combines two values, a op b, refusing combinations a correct
// schedule never makes. a is the operand the executor passes first: the
// incoming message, or LocalReduce's Src.
func reduce(a, b *value) (*value, error) {
	switch {
	case a.block != b.block || a.chunk != b.chunk:
		return nil, fmt.Errorf("reduces %v with %v: different data", a, b)
	case a.final || b.final:
		return nil, fmt.Errorf("reduces %v with %v: a finished reduction is reduced again", a, b)
	case a.ranks.intersects(b.ranks):
		return nil, fmt.Errorf("reduces %v with %v: a contribution is counted twice", a, b)
	}
	return &value{block: a.block, chunk: a.chunk, ranks: a.ranks.union(b.ranks), order: "(" + a.order + " " + b.order + ")"}, nil
}
