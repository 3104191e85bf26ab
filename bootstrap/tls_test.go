package bootstrap

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// recordingProxy forwards loopback connections to target and records every
// byte the clients send, as a network observer would see them.
type recordingProxy struct {
	ln   net.Listener
	mu   sync.Mutex
	seen bytes.Buffer
	wg   sync.WaitGroup
}

func newRecordingProxy(t *testing.T, target string) *recordingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &recordingProxy{ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.wg.Add(2)
			go func() {
				defer p.wg.Done()
				io.Copy(s, io.TeeReader(c, p))
				s.Close()
			}()
			go func() {
				defer p.wg.Done()
				io.Copy(c, s)
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *recordingProxy) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen.Write(b)
}

func (p *recordingProxy) saw(s string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bytes.Contains(p.seen.Bytes(), []byte(s))
}

// TestTLSRendezvous: a job whose rendezvous uses TLS works, and neither the
// secret nor the ranks' data cross the wire in clear; without TLS both do
// (which is what the test's observer can see).
func TestTLSRendezvous(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		var opts []ServerOption
		if useTLS {
			opts = append(opts, WithTLS(TLSFiles{}))
		}
		srv, secret := startServer(t, 2, opts...)
		proxy := newRecordingProxy(t, srv.Addr())
		const payload = "rank data that must not be seen"
		clients := joinAll(t, srv, secret, 2, func(c *Config) { c.Addr = proxy.ln.Addr().String(); c.TLS = useTLS })
		noErrors(t, onEveryRank(clients, func(rank int, c *Client) error {
			got, err := c.AllGather(context.Background(), []byte(payload))
			if err == nil && string(got[1-rank]) != payload {
				err = errors.New("all-gather returned other data")
			}
			return err
		}))
		// The transports see the rendezvous's setting.
		none := func(string) string { return "" }
		if got := clients[0].Env(none)("GCCL_TLS"); (got == "1") != useTLS {
			t.Errorf("TLS %v: Env says GCCL_TLS=%q", useTLS, got)
		}
		closeAll(t, clients)
		// (Plain gRPC sends the secret Huffman-coded, so only the payload
		// shows that the observer sees plaintext.)
		if (useTLS && proxy.saw(secret)) || proxy.saw(payload) == useTLS {
			t.Errorf("TLS %v: observer saw the secret %v, the payload %v", useTLS, proxy.saw(secret), proxy.saw(payload))
		}
	}
}

// TestTLSMismatchFailsJoinAtOnce: a rank whose GCCL_TLS differs from the
// rendezvous's fails its Join with a status naming the setting, long
// before the timeout.
func TestTLSMismatchFailsJoinAtOnce(t *testing.T) {
	for _, serverTLS := range []bool{true, false} {
		var opts []ServerOption
		if serverTLS {
			opts = append(opts, WithTLS(TLSFiles{}))
		}
		srv, secret := startServer(t, 1, opts...)
		cfg := testConfig(srv.Addr(), secret, 0, 1)
		cfg.TLS = !serverTLS
		start := time.Now()
		c, err := Join(context.Background(), cfg)
		if err == nil {
			c.Close()
			t.Fatalf("server TLS %v: a rank with TLS %v joined", serverTLS, !serverTLS)
		}
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "GCCL_TLS") {
			t.Errorf("server TLS %v: %v, want ErrInvalidArgument naming GCCL_TLS", serverTLS, err)
		}
		if d := time.Since(start); d > cfg.Timeout/2 {
			t.Errorf("server TLS %v: the mismatch took %v to report", serverTLS, d)
		}
	}
}

// TestTLSWrongSecretRefusedByKey: with TLS a rank with another secret
// refuses the server's key itself (it would be another job's, or a machine
// in the middle), at once.
func TestTLSWrongSecretRefusedByKey(t *testing.T) {
	srv, _ := startServer(t, 1, WithTLS(TLSFiles{}))
	cfg := testConfig(srv.Addr(), NewSecret(), 0, 1)
	cfg.TLS = true
	start := time.Now()
	c, err := Join(context.Background(), cfg)
	if err == nil {
		c.Close()
		t.Fatal("a rank with another secret joined")
	}
	if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), "key") {
		t.Errorf("%v, want ErrUnauthenticated about the server's key", err)
	}
	if d := time.Since(start); d > cfg.Timeout/2 {
		t.Errorf("took %v", d)
	}
}
