package p2p

import (
	"strings"
	"testing"

	"github.com/gccl/gccl/internal/uring"
)

// TestFileEngineChoice: GCCL_P2P_IOURING_DISABLE=1 forces the goroutine
// pool; otherwise io_uring runs wherever the kernel allows it, and the
// pool says why not where it does not.
func TestFileEngineChoice(t *testing.T) {
	t.Setenv("GCCL_P2P_IOURING_DISABLE", "1")
	a := newAgent(t, "a", Config{ListenAddr: "-"})
	if a.files.ring != nil || !strings.HasPrefix(a.files.engine, "goroutines (io_uring disabled") {
		t.Fatalf("GCCL_P2P_IOURING_DISABLE=1: engine %q", a.files.engine)
	}
	p := newFilePool(4, 4096, true)
	defer p.close()
	if err := uring.Available(); err != nil {
		if p.ring != nil || !strings.Contains(p.engine, err.Error()) {
			t.Fatalf("io_uring unavailable (%v): engine %q", err, p.engine)
		}
	} else if p.ring == nil || p.engine != "io_uring" {
		t.Fatalf("io_uring available: engine %q", p.engine)
	}
}

// TestFileRunsThatFitTheQueue: a run of at most a queue of blocks goes to
// io_uring, a longer stream to the workers.
func TestFileRunsThatFitTheQueue(t *testing.T) {
	p := &filePool{depth: 16, block: 64 << 10}
	for _, c := range []struct {
		lens []int
		want bool
	}{
		{[]int{16 * 64 << 10}, true},               // one request of 16 blocks
		{[]int{64 << 10, 64 << 10}, true},          // fewer
		{[]int{8 * 64 << 10, 8*64<<10 + 1}, false}, // one byte more
		{[]int{256 << 20}, false},                  // a stream
		{[]int{}, true},
	} {
		mems := make([][]byte, len(c.lens))
		for i, n := range c.lens {
			mems[i] = make([]byte, n)
		}
		if got := p.fitsQueue(mems); got != c.want {
			t.Errorf("%v bytes: fits %v, want %v", c.lens, got, c.want)
		}
	}
}
