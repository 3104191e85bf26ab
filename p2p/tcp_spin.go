package p2p

import (
	"os"
	"sync/atomic"

	"github.com/gccl/gccl/internal/spin"
)

// Bounded, adaptive spinning for the tcp backend's two waits on a round
// trip: the initiator's Wait on a small post (which reads the answer
// itself: tcp_progress.go), and a progress loop waiting for the next
// frame. A spin polls the socket between CPU pause hints and never yields
// to the Go scheduler: runtime.Gosched wakes an idle P's thread on every
// call (a futex wake-up, and another thread wanting a core), which on a
// 2-vCPU VM cost more than the spin saved. The whole spin is cut off by a
// time budget that follows whether spinning paid: a wait that ended within
// its budget keeps (and doubles) it, one that ran out halves it, and a
// wait that slept but ended soon after restores it (restore). Without that last rule the two sides of a round trip locked
// each other out of spinning: one side sleeping makes the other's spins
// lose, which makes it sleep too, and short probes (every
// spinProbeEvery-th wait at zero spins spinMinNs) never caught a reply a
// round trip away. So on an idle machine a reply due within a round trip
// is caught without a wake-up, and on an oversubscribed one (more runnable
// threads than cores, where a spinner only delays the peer it waits for,
// and replies come late) the waits go back to sleeping: an agent never
// burns a core for long.
const (
	// spinMaxNs is a few loopback round trips of a VM whose threads sleep
	// (31 µs here): a spin long enough to outlast the other side's
	// wake-up, when it slept, still ends sooner than sleeping would have.
	// 64 µs left one 4 KiB round trip in four or five sleeping, 256 µs
	// one in ten or fewer (docs/P2P.md, "TCP backend vs NIXL").
	spinMaxNs      = 256_000
	spinMinNs      = 2_000
	spinProbeEvery = 64
	// spinRestoreNs: a wait that slept and ended within it restores the
	// full budget. As long as the budget: while the other side of a round
	// trip sleeps, this side's answers come late, and the two would
	// otherwise never start spinning together; on a loaded host answers
	// come later still, and the budgets stay down.
	spinRestoreNs = spinMaxNs
)

// spinGauge is one wait's budget, shared by the goroutines that wait the
// same way (atomics only: it is read on every wait). The zero value has
// the full budget.
type spinGauge struct {
	cut   atomic.Int64 // spinMaxNs minus the budget
	waits atomic.Uint32
}

// budget is how long the next wait may spin (0: sleep at once).
func (g *spinGauge) budget() int64 {
	if spinOff {
		return 0
	}
	if b := spinMaxNs - g.cut.Load(); b > 0 {
		return b
	}
	if g.waits.Add(1)%spinProbeEvery == 0 {
		return spinMinNs
	}
	return 0
}

// report says whether a wait given budget b ended within it (won).
func (g *spinGauge) report(b int64, won bool) {
	switch {
	case b == 0:
		return
	case won:
		b = min(spinMaxNs, max(spinMinNs, 2*b))
	case b/2 < spinMinNs:
		b = 0
	default:
		b /= 2
	}
	g.cut.Store(spinMaxNs - b)
}

// restore gives back the full budget after a wait that slept for less
// than spinRestoreNs.
func (g *spinGauge) restore() {
	if g.cut.Load() != 0 {
		g.cut.Store(0)
	}
}

// spinner is one wait in progress.
type spinner struct {
	g     *spinGauge
	b     int64
	start int64
}

func (s *spinner) begin(g *spinGauge) bool {
	s.g, s.b, s.start = g, g.budget(), monoNow()
	return s.b > 0
}

// again waits a little and reports false once the budget is spent (the
// caller then sleeps, and the gauge learns that spinning did not pay).
func (s *spinner) again() bool {
	if monoNow()-s.start > s.b {
		s.g.report(s.b, false)
		return false
	}
	spin.Pause(spinPauses)
	return true
}

// spinPauses is the CPU pause hints between two polls of a spin (each poll
// is a system call, so a few suffice to leave the sibling hyperthread and
// the memory bus alone).
const spinPauses = 8

// won tells the gauge that the wait ended while spinning.
func (s *spinner) won() { s.g.report(s.b, true) }

// spinOff turns spinning off (GCCL_P2P_TCP_SPIN=0), to compare.
var spinOff = os.Getenv("GCCL_P2P_TCP_SPIN") == "0"
