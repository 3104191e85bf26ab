package tcp

import (
	"sync"
	"testing"

	"github.com/gccl/gccl/transport"
)

// TestSleepThroughMux drives the endpoints through transport.Mux, whose
// Wait sleeps on the bell without calling the endpoint's Wait or
// PrepareWait. Readers must then stay armed on their own: every sleeping
// rank is woken by arriving data, striped and small, with backpressure.
func TestSleepThroughMux(t *testing.T) {
	const slotSize = stripeMin * 2
	cfg := testConfig(slotSize, 2, 2)
	eps := connectWorld(t, 2, cfg)
	muxes := make([]*transport.Mux, 2)
	for r, e := range eps {
		routes := make([]transport.Endpoint, 2)
		routes[1-r] = e
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
		if e.waitHooked.Load() {
			t.Error("PrepareWait was called through the Mux; the test no longer covers readers that stay armed")
		}
	}
}
