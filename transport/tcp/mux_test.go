package tcp

import (
	"sync"
	"testing"

	"github.com/gccl/gccl/transport"
)

// hidePrepare hides the endpoint's PrepareWait from the Mux, as a bell-only
// sleeper that never calls it would.
type hidePrepare struct{ transport.Endpoint }

// TestSleepThroughMux drives the endpoints through transport.Mux, once with
// PrepareWait hidden (the rank sleeps on the bell alone, so readers must
// stay armed on their own) and once as comm uses it (the Mux prepares the
// endpoint before sleeping). Every sleeping rank must be woken by arriving
// data, striped and small, with backpressure.
func TestSleepThroughMux(t *testing.T) {
	t.Run("bell-only", func(t *testing.T) { sleepThroughMux(t, true) })
	t.Run("prepared", func(t *testing.T) { sleepThroughMux(t, false) })
}

func sleepThroughMux(t *testing.T, hidden bool) {
	const slotSize = stripeMin * 2
	cfg := testConfig(slotSize, 2, 2)
	eps := connectWorld(t, 2, cfg)
	muxes := make([]*transport.Mux, 2)
	for r, e := range eps {
		routes := make([]transport.Endpoint, 2)
		routes[1-r] = e
		if hidden {
			routes[1-r] = hidePrepare{e}
		}
		m, err := transport.NewMux(r, 2, slotSize, e.bell, routes)
		if err != nil {
			t.Fatal(err)
		}
		muxes[r] = m
	}
	var sizes []int
	for i := 0; i < 60; i++ {
		sizes = append(sizes, []int{0, 5, slotSize, 4096, stripeMin, 1}[i%6])
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for r, m := range muxes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Rank 1 answers in bursts, so rank 0 meets backpressure.
			gate := func(sent, got int) (bool, bool) { return r == 0 || sent <= got, r == 1 || got < sent }
			if err := pump(m, r, 1-r, sizes, gate); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, e := range eps {
		if hidden && e.waitHooked.Load() {
			t.Error("PrepareWait was called through the Mux; the test no longer covers readers that stay armed")
		}
	}
}
