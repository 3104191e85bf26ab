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
