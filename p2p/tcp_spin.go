package p2p

import (
	"os"
	"runtime"
	"sync/atomic"

	"github.com/gccl/gccl/internal/spin"
)

// Bounded, adaptive spinning for the tcp backend's two waits on a round
// trip: the initiator's Wait on a small post, and a progress loop waiting
// for the next frame. Each round is the collectives' (internal/spin: a
// pause, then yields), but the whole spin is cut off by a time budget that
// follows whether spinning paid: a wait that ended within its budget keeps
// (and doubles) it, one that ran out halves it, and at zero only every
// spinProbeEvery-th wait spins, briefly, to find out whether it pays again.
// So on an idle machine a reply due within a round trip is caught without
// a wake-up, and on an oversubscribed one (more runnable threads than
// cores, where a spinner only delays the peer it waits for) the waits go
// back to sleeping at once: an agent never burns a core for long.
const (
	spinMaxNs      = 64_000 // about a blocking loopback round trip on a VM
	spinMinNs      = 2_000
	spinProbeEvery = 64
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

// spinner is one wait in progress.
type spinner struct {
	g     *spinGauge
	b     int64
	start int64
	bo    spin.Backoff
}

func (s *spinner) begin(g *spinGauge) bool {
	s.g, s.b, s.start = g, g.budget(), monoNow()
	s.bo.Reset()
	return s.b > 0
}

// again waits a little and reports false once the budget is spent (the
// caller then sleeps, and the gauge learns that spinning did not pay).
func (s *spinner) again() bool {
	if monoNow()-s.start > s.b {
		s.g.report(s.b, false)
		return false
	}
	if !s.bo.Spin() { // the rounds ran out first: yield from now on
		runtime.Gosched()
	}
	return true
}

// won tells the gauge that the wait ended while spinning.
func (s *spinner) won() { s.g.report(s.b, true) }

// spinOff turns spinning off (GCCL_P2P_TCP_SPIN=0), to compare.
var spinOff = os.Getenv("GCCL_P2P_TCP_SPIN") == "0"
