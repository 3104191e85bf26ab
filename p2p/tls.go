package p2p

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/gccl/gccl/internal/tlsx"
)

// TLS between agents (Config.TLS, GCCL_TLS=1). Each agent's key derives
// from its token (tlsx.SecretIdentity), the random value in its metadata
// that peers prove they loaded: whoever loaded an agent's metadata knows
// its key's pin without any other exchange, and nobody else can present
// that key. So:
//   - a dialer that loaded the target's metadata (LoadRemote, then a
//     transfer) accepts only the target's key: a machine in the middle
//     cannot read or change the connection;
//   - the acceptor requires the dialer's certificate to be the one the
//     dialer's own token derives (its hello carries its metadata), binding
//     the session to the agent named in it; with RequireToken it admits only
//     dialers that prove they loaded its metadata (the token, sent inside
//     TLS);
//   - Connect(addr), which loads no metadata first, is encrypted but cannot
//     check the target's key: use metadata exchange where the network is
//     hostile.

// tlsLabel separates agents' derived keys from other uses of tokens.
const tlsLabel = "p2p agent"

// agentTLS is an agent's TLS identity; nil when TLS is off.
type agentTLS struct {
	id *tlsx.Identity
}

func newAgentTLS(cfg *Config, token [tokenLen]byte) (*agentTLS, error) {
	on := cfg.TLS
	if !on {
		var err error
		if on, err = tlsx.Enabled(nil); err != nil {
			return nil, fmt.Errorf("p2p: %w", err)
		}
	}
	if !on {
		return nil, nil
	}
	id, err := tlsx.SecretIdentity(hex.EncodeToString(token[:]), tlsLabel)
	if err != nil {
		return nil, fmt.Errorf("p2p: %w", err)
	}
	return &agentTLS{id: id}, nil
}

// tokenPin is the key pin of the agent whose token is token.
func tokenPin(token [tokenLen]byte) (tlsx.Pin, error) {
	return tlsx.SecretPin(hex.EncodeToString(token[:]), tlsLabel)
}

// clientConn runs the dialer's handshake on conn. A zero token (Connect)
// accepts any server key.
func (t *agentTLS) clientConn(ctx context.Context, conn net.Conn, addr string, token [tokenLen]byte) (net.Conn, error) {
	var verify tlsx.Verify
	if token != ([tokenLen]byte{}) {
		pin, err := tokenPin(token)
		if err != nil {
			return nil, err
		}
		verify = tlsx.Expect("the agent at "+addr, pin)
	}
	tc := tls.Client(conn, tlsx.ClientConfig(t.id, verify))
	if err := tc.HandshakeContext(ctx); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("TLS handshake: %w (does the agent at %s use GCCL_TLS=1 too?)", err, addr)
		}
		return nil, fmt.Errorf("TLS handshake: %w", err)
	}
	return tc, nil
}

// serverConn runs the acceptor's handshake on conn; the dialer must present
// a certificate, which checkClient later matches with its hello.
func (t *agentTLS) serverConn(conn net.Conn) (*tls.Conn, error) {
	tc := tls.Server(conn, tlsx.ServerConfig(t.id, func(tlsx.Pin) error { return nil }))
	if err := tc.Handshake(); err != nil {
		var rh tls.RecordHeaderError
		if errors.As(err, &rh) {
			return nil, fmt.Errorf("the peer does not speak TLS (set GCCL_TLS=1 on every agent): %w", err)
		}
		return nil, fmt.Errorf("TLS handshake: %w", err)
	}
	return tc, nil
}

// checkClient matches the dialer's certificate with the token of the
// metadata in its hello.
func checkClient(tc *tls.Conn, info *agentInfo) error {
	got, ok := tlsx.PeerPin(tc.ConnectionState())
	want, err := tokenPin(info.Token)
	if err != nil {
		return err
	}
	if !ok || got != want {
		return &tlsx.PinError{Peer: fmt.Sprintf("agent %q", info.Name), Got: got, Want: "the key its metadata's token derives"}
	}
	return nil
}
