package bootstrap

import (
	"context"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
)

// quiet discards log records; set GCCL_TEST_LOG=1 to see them.
func quiet() *slog.Logger {
	if os.Getenv("GCCL_TEST_LOG") != "" {
		return slog.Default()
	}
	return slog.New(slog.DiscardHandler)
}

// startServer serves a rendezvous for size ranks on a free loopback port and
// stops it at the end of the test.
func startServer(t testing.TB, size int, opts ...ServerOption) (*Server, string) {
	t.Helper()
	secret := NewSecret()
	srv, err := NewServer("127.0.0.1:0", secret, size, append([]ServerOption{WithLogger(quiet())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return srv, secret
}

// testConfig is rank's Config for the rendezvous at addr.
func testConfig(addr, secret string, rank, size int) Config {
	return Config{Rank: rank, Size: size, Addr: addr, Secret: secret, Timeout: 10 * time.Second, Logger: quiet()}
}

// joinAll joins size ranks concurrently (each with its own connection) and
// closes them at the end of the test. tweak, if not nil, edits each Config.
func joinAll(t testing.TB, srv *Server, secret string, size int, tweak func(*Config)) []*Client {
	t.Helper()
	clients := make([]*Client, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		cfg := testConfig(srv.Addr(), secret, r, size)
		if tweak != nil {
			tweak(&cfg)
		}
		wg.Go(func() { clients[r], errs[r] = Join(context.Background(), cfg) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: Join: %v", r, err)
		}
	}
	t.Cleanup(func() { closeAll(t, clients) })
	return clients
}

// closeAll closes every client concurrently (a serving rank's Close waits for
// the others).
func closeAll(t testing.TB, clients []*Client) {
	t.Helper()
	var wg sync.WaitGroup
	for _, c := range clients {
		if c != nil {
			wg.Go(func() {
				if err := c.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
		}
	}
	wg.Wait()
}

// onEveryRank runs f concurrently for every client and returns the errors by
// rank.
func onEveryRank(clients []*Client, f func(rank int, c *Client) error) []error {
	errs := make([]error, len(clients))
	var wg sync.WaitGroup
	for r, c := range clients {
		wg.Go(func() { errs[r] = f(r, c) })
	}
	wg.Wait()
	return errs
}

func noErrors(t testing.TB, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// nextNotice waits for a notice on c's Lost channel.
func nextNotice(t testing.TB, c *Client, within time.Duration) Notice {
	t.Helper()
	select {
	case n, ok := <-c.Lost():
		if !ok {
			t.Fatalf("rank %d: Lost channel closed", c.Rank())
		}
		return n
	case <-time.After(within):
		t.Fatalf("rank %d: no notice within %v", c.Rank(), within)
	}
	return Notice{}
}

// expectNoNotice checks that c's Lost channel stays empty for d.
func expectNoNotice(t testing.TB, c *Client, d time.Duration) {
	t.Helper()
	select {
	case n := <-c.Lost():
		t.Fatalf("rank %d: unexpected notice: %v", c.Rank(), n)
	case <-time.After(d):
	}
}

// checkGoroutines returns a function that fails the test if goroutines
// started after the call are still running, after giving them a few seconds
// to end (as grpc-go's leakcheck does).
func checkGoroutines(t testing.TB) func() {
	before := runtime.NumGoroutine()
	return func() {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			n := runtime.NumGoroutine()
			if n <= before {
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Fatalf("%d goroutines before, %d after Close and Stop:\n%s", before, n, buf[:runtime.Stack(buf, true)])
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
