package bootstrap

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestGrowOverTLS: a newcomer joins a TLS rendezvous's Grow with TLS; one
// without TLS, or with another job's secret, is refused.
func TestGrowOverTLS(t *testing.T) {
	srv, secret := startServer(t, 1, WithTLS(TLSFiles{}))
	c := joinAll(t, srv, secret, 1, func(cfg *Config) { cfg.TLS = true })
	done := make(chan error, 1)
	var grown *Client
	go func() {
		var err error
		grown, err = c[0].Grow(context.Background(), 2, "n")
		done <- err
	}()
	waitOpenGrow(t, srv)
	plain := newcomerConfig(srv.Addr(), secret, AnyRank, 2)
	if _, _, err := JoinGrow(context.Background(), plain); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "GCCL_TLS") {
		t.Fatalf("newcomer without TLS at a TLS rendezvous: %v, want ErrInvalidArgument naming GCCL_TLS", err)
	}
	other := newcomerConfig(srv.Addr(), NewSecret(), AnyRank, 2)
	other.TLS = true
	if _, _, err := JoinGrow(context.Background(), other); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("newcomer with another job's secret over TLS: %v, want ErrUnauthenticated", err)
	}
	good := newcomerConfig(srv.Addr(), secret, AnyRank, 2)
	good.TLS = true
	nc, _, err := JoinGrow(context.Background(), good)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	clients := []*Client{grown, nc}
	noErrors(t, onEveryRank(clients, func(_ int, cl *Client) error { return cl.Barrier(context.Background()) }))
	closeAll(t, clients)
}
