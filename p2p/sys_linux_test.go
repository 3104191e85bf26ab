package p2p

import (
	"os"
	"testing"
)

// A process counts as gone once a zombie or exiting (PF_EXITING in the
// flags field), not while it runs or sleeps.
func TestStatGone(t *testing.T) {
	for _, c := range []struct {
		stat string
		gone bool
	}{
		{"42 (soakrank) S 1 42 42 0 -1 4194560 100 0 0 0", false},
		{"42 (soak rank) R 1 42 42 0 -1 4194564 100 0 0 0", true}, // 0x400104: PF_EXITING
		{"42 (soakrank) Z 1 42 42 0 -1 4227084 100 0 0 0", true},
		{"42 (a) b) X 1 42 42 0 -1 0", true},
		{"42 (soakrank) D 1 42", false}, // too short to say
		{"garbage", false},
	} {
		if got := statGone([]byte(c.stat)); got != c.gone {
			t.Errorf("%q: gone %v, want %v", c.stat, got, c.gone)
		}
	}
	if processGone(os.Getpid()) {
		t.Error("this process counts as gone")
	}
}
