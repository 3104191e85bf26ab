package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/gccl/gccl/internal/tlsx"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
)

// TLS for the rendezvous (Config.TLS, GCCL_TLS=1).
//
// Without files, the server's key derives from the job secret
// (tlsx.SecretIdentity): every rank computes the server's key pin from the
// secret it already has, so it accepts only a server that knows the secret,
// and nothing needs distributing. The secret then travels, as the per-call
// proof of membership, inside TLS 1.3. With TLSFiles the server presents the
// site's certificate and ranks check it against the CA (mutually: ranks then
// present theirs too).
//
// The server accepts both kinds of connection on its one port, to tell a
// rank configured differently what is wrong rather than leave it retrying:
// it looks at the first byte (a TLS record starts with 0x16, HTTP/2 with
// 'P'), runs TLS when it is TLS (even when the server itself does not use
// TLS: it holds the secret, so it can), and refuses every call whose mode
// differs from its own with a status naming the setting.

// TLSFiles are PEM files for sites with a PKI (GCCL_TLS_CERT, GCCL_TLS_KEY,
// GCCL_TLS_CA). Empty means keys derived from the job secret.
type TLSFiles struct{ Cert, Key, CA string }

func (f TLSFiles) x() tlsx.Files { return tlsx.Files{Cert: f.Cert, Key: f.Key, CA: f.CA} }

// rendezvousLabel separates the rendezvous's derived key from any other.
const rendezvousLabel = "rendezvous"

// reasonTLSMismatch: a rank's GCCL_TLS differs from the rendezvous's.
const reasonTLSMismatch = "TLS_MISMATCH"

func init() { reasonSentinel[reasonTLSMismatch] = ErrInvalidArgument }

// serverIdentity is what a rendezvous presents to TLS clients.
func serverIdentity(secret string, files TLSFiles) (*tlsx.Identity, error) {
	if files.Cert != "" || files.Key != "" {
		return tlsx.NewIdentity(files.x())
	}
	return tlsx.SecretIdentity(secret, rendezvousLabel)
}

// clientCredentials are a rank's transport credentials: plaintext, or TLS
// that accepts only the rendezvous of this job.
// onPinError is called when the server's key is wrong.
func clientCredentials(cfg *Config, onPinError func(error)) (credentials.TransportCredentials, error) {
	if !cfg.TLS {
		return insecure.NewCredentials(), nil
	}
	files := cfg.TLSFiles
	if files.CA != "" {
		id, err := tlsx.NewIdentity(files.x())
		if err != nil {
			return nil, err
		}
		return credentials.NewTLS(tlsx.ClientConfig(id, nil)), nil
	}
	pin, err := tlsx.SecretPin(cfg.Secret, rendezvousLabel)
	if err != nil {
		return nil, err
	}
	verify := func(got tlsx.Pin) error {
		if got != pin {
			return &tlsx.PinError{Peer: "the rendezvous at " + cfg.Addr, Got: got, Want: "the key this job's GCCL_SECRET derives (another job's rendezvous, or a machine in the middle)"}
		}
		return nil
	}
	return &pinWatch{TransportCredentials: credentials.NewTLS(tlsx.ClientConfig(nil, verify)), onPinError: onPinError}, nil
}

// pinWatch wraps a rank's TLS credentials to catch a rendezvous with the
// wrong key: gRPC would retry it until the timeout, but no retry can fix
// it, so the first one ends the call.
type pinWatch struct {
	credentials.TransportCredentials
	onPinError func(error)
}

func (w *pinWatch) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, ai, err := w.TransportCredentials.ClientHandshake(ctx, authority, raw)
	var pe *tlsx.PinError
	if err != nil && errors.As(err, &pe) {
		w.onPinError(err)
	}
	return conn, ai, err
}

func (w *pinWatch) Clone() credentials.TransportCredentials {
	return &pinWatch{TransportCredentials: w.TransportCredentials.Clone(), onPinError: w.onPinError}
}

// sniffCredentials is the server side: TLS or plaintext by the first byte.
type sniffCredentials struct {
	tls    credentials.TransportCredentials
	useTLS bool
}

func newSniffCredentials(secret string, useTLS bool, files TLSFiles) (*sniffCredentials, error) {
	id, err := serverIdentity(secret, files)
	if err != nil {
		return nil, err
	}
	return &sniffCredentials{tls: credentials.NewTLS(tlsx.ServerConfig(id, nil)), useTLS: useTLS}, nil
}

// modeInfo records which kind a connection was.
type modeInfo struct {
	credentials.CommonAuthInfo
	tls bool
}

func (modeInfo) AuthType() string { return "gccl" }

// tlsRecordHandshake is a TLS record's first byte (a handshake record).
const tlsRecordHandshake = 0x16

func (c *sniffCredentials) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	var first [1]byte
	if _, err := io.ReadFull(raw, first[:]); err != nil {
		return nil, nil, err
	}
	conn := &peekedConn{Conn: raw, first: first[:]}
	if first[0] != tlsRecordHandshake {
		return conn, modeInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
	}
	sc, _, err := c.tls.ServerHandshake(conn)
	if err != nil {
		return nil, nil, err
	}
	return sc, modeInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}, tls: true}, nil
}

func (c *sniffCredentials) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, fmt.Errorf("gccl bootstrap: server credentials used by a client")
}

func (c *sniffCredentials) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "gccl"}
}

func (c *sniffCredentials) Clone() credentials.TransportCredentials {
	cc := *c
	return &cc
}

func (c *sniffCredentials) OverrideServerName(string) error { return nil }

// peekedConn gives back the byte the sniffing read.
type peekedConn struct {
	net.Conn
	first []byte
}

func (c *peekedConn) Read(b []byte) (int, error) {
	if len(c.first) > 0 && len(b) > 0 {
		n := copy(b, c.first)
		c.first = c.first[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}

// checkTLSMode refuses a call whose connection's kind differs from the
// server's, saying which side uses TLS.
func (s *Server) checkTLSMode(ctx context.Context, method string) error {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	mi, ok := p.AuthInfo.(modeInfo)
	if !ok || mi.tls == s.useTLS {
		return nil
	}
	if s.useTLS {
		s.log.Warn(fmt.Sprintf("rejected %s from %s: it does not use TLS and this rendezvous does", method, p.Addr))
		return statusError(codes.FailedPrecondition, reasonTLSMismatch,
			"the rendezvous at %s uses TLS (GCCL_TLS=1) and this rank does not: set GCCL_TLS=1 on every rank", s.Addr())
	}
	s.log.Warn(fmt.Sprintf("rejected %s from %s: it uses TLS and this rendezvous does not", method, p.Addr))
	return statusError(codes.FailedPrecondition, reasonTLSMismatch,
		"this rank uses TLS (GCCL_TLS=1) and the rendezvous at %s does not: set the same GCCL_TLS on every rank and on gccl-bootstrap", s.Addr())
}

// WithTLS makes the server use TLS (see Config.TLS); files may be empty.
func WithTLS(files TLSFiles) ServerOption {
	return func(s *Server) {
		s.useTLS = true
		s.tlsFiles = files
	}
}

// serverCredentialsOption builds the server's gRPC credentials option.
func (s *Server) serverCredentialsOption() (grpc.ServerOption, error) {
	c, err := newSniffCredentials(string(s.secret), s.useTLS, s.tlsFiles)
	if err != nil {
		return nil, fmt.Errorf("gccl bootstrap: server: %w", err)
	}
	return grpc.Creds(c), nil
}

// Env returns getenv with the job's TLS settings on top, for the
// transports: when this rank joined with Config.TLS, GCCL_TLS reads "1" and
// GCCL_TLS_CERT, _KEY and _CA read Config.TLSFiles (where set), so data
// connections are encrypted whenever the rendezvous is, however TLS was
// asked for.
func (c *Client) Env(getenv func(string) string) func(string) string {
	cfg := &c.sess.cfg
	if !cfg.TLS {
		return getenv
	}
	return func(name string) string {
		switch name {
		case tlsx.EnvTLS:
			return "1"
		case tlsx.EnvCert:
			if cfg.TLSFiles.Cert != "" {
				return cfg.TLSFiles.Cert
			}
		case tlsx.EnvKey:
			if cfg.TLSFiles.Key != "" {
				return cfg.TLSFiles.Key
			}
		case tlsx.EnvCA:
			if cfg.TLSFiles.CA != "" {
				return cfg.TLSFiles.CA
			}
		}
		return getenv(name)
	}
}
