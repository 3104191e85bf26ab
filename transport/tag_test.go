package transport

import "testing"

func TestTagFields(t *testing.T) {
	for _, c := range []struct {
		kind  uint8
		seq   uint64
		check uint16
	}{{0, 0, 0}, {33, 1, 0xffff}, {255, 1<<40 - 1, 0x8001}, {7, 1 << 40, 3}} {
		tag := MakeTag(c.kind, c.seq).WithCheck(c.check)
		if tag.Kind() != c.kind || tag.Seq() != c.seq&(1<<40-1) || tag.Check() != c.check {
			t.Errorf("MakeTag(%d, %d).WithCheck(%#x) = kind %d seq %d check %#x", c.kind, c.seq, c.check, tag.Kind(), tag.Seq(), tag.Check())
		}
		if again := tag.WithCheck(c.check ^ 0xffff); again.Check() != c.check^0xffff || again.Kind() != c.kind || again.Seq() != tag.Seq() {
			t.Errorf("replacing the check of %#x gave %#x", uint64(tag), uint64(again))
		}
	}
}

// TestArgCheckSeparatesCounts: the mismatches most likely to happen (counts
// a few chunks apart, a factor of two, another type or op with the same
// count) always get different checks.
func TestArgCheckSeparatesCounts(t *testing.T) {
	seen := map[uint16]uint64{}
	for n := uint64(0); n < 65521; n++ {
		c := ArgCheck(n, 0x1234)
		if m, ok := seen[c]; ok {
			t.Fatalf("ArgCheck(%d) == ArgCheck(%d) == %#x", n, m, c)
		}
		seen[c] = n
	}
	for n := uint64(1); n < 1<<40; n <<= 1 {
		for _, m := range []uint64{2 * n, n + 1, n + 4096, 3 * n} {
			if ArgCheck(n, 9) == ArgCheck(m, 9) {
				t.Fatalf("counts %d and %d get the same check", n, m)
			}
		}
		for a := uint16(0); a < 1024; a++ {
			if ArgCheck(n, a) == ArgCheck(n, a^0x40) {
				t.Fatalf("args %#x and %#x with count %d get the same check", a, a^0x40, n)
			}
		}
	}
}
