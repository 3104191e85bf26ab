package transport

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTagFields(t *testing.T) {
	for _, c := range []struct {
		kind  uint8
		seq   uint64
		check uint16
	}{{0, 0, 0}, {33, 1, 0xffff}, {255, 1<<40 - 1, 0x8001}, {7, 1 << 40, 3}} {
		tag := MakeTag(c.kind, c.seq).WithCheck(c.check)
		require.Equal(t, c.kind, tag.Kind(), "MakeTag(%d, %d).WithCheck(%#x)", c.kind, c.seq, c.check)
		require.Equal(t, c.seq&(1<<40-1), tag.Seq(), "MakeTag(%d, %d).WithCheck(%#x)", c.kind, c.seq, c.check)
		require.Equal(t, c.check, tag.Check(), "MakeTag(%d, %d).WithCheck(%#x)", c.kind, c.seq, c.check)
		again := tag.WithCheck(c.check ^ 0xffff)
		require.Equal(t, c.check^0xffff, again.Check(), "replacing the check of %#x", uint64(tag))
		require.Equal(t, c.kind, again.Kind(), "replacing the check of %#x", uint64(tag))
		require.Equal(t, tag.Seq(), again.Seq(), "replacing the check of %#x", uint64(tag))
	}
}

// TestArgCheckSeparatesCounts: the mismatches most likely to happen (counts
// a few chunks apart, a factor of two, another type or op with the same
// count) always get different checks.
func TestArgCheckSeparatesCounts(t *testing.T) {
	seen := map[uint16]uint64{}
	for n := uint64(0); n < 65521; n++ {
		c := ArgCheck(n, 0x1234)
		m, ok := seen[c]
		require.False(t, ok, "ArgCheck(%d) == ArgCheck(%d) == %#x", n, m, c)
		seen[c] = n
	}
	for n := uint64(1); n < 1<<40; n <<= 1 {
		for _, m := range []uint64{2 * n, n + 1, n + 4096, 3 * n} {
			require.NotEqual(t, ArgCheck(n, 9), ArgCheck(m, 9), "counts %d and %d", n, m)
		}
		for a := uint16(0); a < 1024; a++ {
			if ArgCheck(n, a) == ArgCheck(n, a^0x40) { // require per pair would be slow here
				t.Fatalf("args %#x and %#x with count %d get the same check", a, a^0x40, n)
			}
		}
	}
}
