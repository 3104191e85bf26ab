package bootstrap

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// init64Ranks is the rank count of the init performance target: 64 ranks as
// goroutines of one process, each with its own Client and connection, must
// Join, all-gather a ~200-byte descriptor and pass a barrier in under a
// second on a 2-core machine.
const init64Ranks = 64

// runInit runs Join + AllGather(200 bytes) + Barrier on n ranks against a
// fresh rendezvous, checks the gathered descriptors, closes everything and
// returns how long init took (Close not included).
func runInit(tb testing.TB, n int) time.Duration {
	tb.Helper()
	secret := NewSecret()
	srv, err := NewServer("127.0.0.1:0", secret, n, WithLogger(quiet()))
	if err != nil {
		tb.Fatal(err)
	}
	go srv.Serve()
	defer srv.Stop()

	descriptor := func(rank int) []byte {
		return bytes.Repeat([]byte(fmt.Sprintf("rank %04d ", rank)), 20) // 200 bytes
	}
	clients := make([]*Client, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for r := range n {
		cfg := testConfig(srv.Addr(), secret, r, n)
		wg.Go(func() {
			ctx := context.Background()
			c, err := Join(ctx, cfg)
			if err != nil {
				errs[r] = err
				return
			}
			clients[r] = c
			all, err := c.AllGather(ctx, descriptor(r))
			if err != nil {
				errs[r] = err
				return
			}
			for peer, d := range all {
				if !bytes.Equal(d, descriptor(peer)) {
					errs[r] = fmt.Errorf("descriptor of rank %d is %q", peer, d)
					return
				}
			}
			errs[r] = c.Barrier(ctx)
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	for r, err := range errs {
		if err != nil {
			tb.Fatalf("rank %d: %v", r, err)
		}
	}
	closeAll(tb, clients)
	return elapsed
}

// TestInit64 runs the init target once and logs its time. Timing does not
// decide the verdict (BenchmarkInit64 measures it); correctness does.
func TestInit64(t *testing.T) {
	elapsed := runInit(t, init64Ranks)
	t.Logf("Join + AllGather(200 B) + Barrier, %d ranks with one connection each: %v (target < 1 s)", init64Ranks, elapsed)
}

// BenchmarkInit64: go test -run '^$' -bench BenchmarkInit64 ./bootstrap/
func BenchmarkInit64(b *testing.B) {
	var total time.Duration
	for b.Loop() {
		total += runInit(b, init64Ranks)
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "init-ms/op")
}
