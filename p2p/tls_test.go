package p2p

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gccl/gccl/internal/testutil"
	"github.com/gccl/gccl/internal/tlsx"
)

var tlsTCP = Config{DisableSHM: true, DisablePVM: true, TLS: true}

// tlsWriteRead writes size bytes from a to b over tcp and reads them back.
func tlsWriteRead(t *testing.T, a *Agent, b *Agent, size int) {
	t.Helper()
	tr := targetRegion(t, b, size, true)
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	src := make([]byte, size)
	fill(src, 3)
	lr, err := a.RegisterMem(src)
	if err != nil {
		t.Fatal(err)
	}
	local := one(DRAM, lr.Desc(0, uint64(size)))
	remote := one(DRAM, tr.Desc(0, uint64(size)))
	for _, op := range []Op{Write, Read} {
		if op == Read {
			clear(src)
		}
		req, err := a.CreateRequest(op, local, b.Name(), remote, nil)
		if err != nil {
			t.Fatal(err)
		}
		if req.Backend() != BackendTCP {
			t.Fatalf("backend %v, want tcp", req.Backend())
		}
		if _, err := req.Post(); err != nil {
			t.Fatal(err)
		}
		if err := req.Wait(ctxT(t)); err != nil {
			t.Fatalf("%v: %v", op, err)
		}
		req.Release()
		if !bytes.Equal(tr.Bytes(), src) && op == Write || op == Read && !bytes.Equal(src, tr.Bytes()) {
			t.Fatalf("%v: data differs", op)
		}
	}
}

// TestTLSTransfer: two agents with TLS move data both ways over tcp.
func TestTLSTransfer(t *testing.T) {
	cfg := tlsTCP
	cfg.RequireToken = true
	a, b := newAgent(t, "a", cfg), newAgent(t, "b", cfg)
	tlsWriteRead(t, a, b, 5<<20+17)
}

// TestTLSWrongKeyRefused: an agent that presents a key other than its
// metadata's token derives is refused by the target, naming it.
func TestTLSWrongKeyRefused(t *testing.T) {
	var logs testutil.SyncBuffer
	cfg := tlsTCP
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	b := newAgent(t, "b", cfg)
	a := newAgent(t, "a", tlsTCP)
	a.tls.id, _ = tlsx.NewIdentity(tlsx.Files{}) // a key its token does not derive
	_, err := a.LoadRemote(ctxT(t), b.LocalMetadata())
	if err == nil {
		tr := targetRegion(t, b, 4096, true)
		req := request4K(t, a, Write, "b", tr.Desc(0, 4096))
		if _, err = req.Post(); err == nil {
			err = req.Wait(ctxT(t))
		}
	}
	if err == nil {
		t.Fatal("an agent with a wrong key transferred")
	}
	waitFor(t, func() bool { return strings.Contains(logs.String(), "presented key") })
	if !strings.Contains(logs.String(), `agent \"a\"`) {
		t.Errorf("refusal does not name the agent:\n%s", logs.String())
	}
}

// TestTLSImpostorTargetRefused: a dialer that loaded b's metadata refuses a
// server at b's address that does not hold b's key.
func TestTLSImpostorTargetRefused(t *testing.T) {
	b := newAgent(t, "b", tlsTCP)
	a := newAgent(t, "a", tlsTCP)
	impostor, _ := tlsx.NewIdentity(tlsx.Files{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		tc := tls.Server(c, tlsx.ServerConfig(impostor, nil))
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		tc.Handshake()
	}()
	var token [tokenLen]byte
	copy(token[:], b.token[:])
	_, err = a.dial(ctxT(t), ln.Addr().String(), token)
	var pe *tlsx.PinError
	if !errors.As(err, &pe) {
		t.Fatalf("dialing an impostor: %v, want a pin refusal", err)
	}
}

// TestTLSMixedAgentsFailClearly: a TLS agent and a plain one cannot talk,
// and each side says why.
func TestTLSMixedAgentsFailClearly(t *testing.T) {
	for _, dialerTLS := range []bool{true, false} {
		dcfg, acfg := tlsTCP, tlsTCP
		dcfg.TLS, acfg.TLS = dialerTLS, !dialerTLS
		b := newAgent(t, "b", acfg)
		a := newAgent(t, "a", dcfg)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := a.Connect(ctx, b.addr)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "GCCL_TLS") {
			t.Errorf("dialer TLS %v: %v, want an error naming GCCL_TLS", dialerTLS, err)
		}
		a.Close()
		b.Close()
	}
}
