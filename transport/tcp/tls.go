package tcp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/gccl/gccl/internal/tlsx"
)

// TLS (Config.TLS, GCCL_TLS=1). Every stream runs a TLS 1.3 handshake
// before gccl's own (which then runs inside it, so the token check, the
// ranks and the settings are checked as without TLS). Each listener has its
// own key (or the site's files); its pin, the hash of its public key, goes
// in the rank's descriptor, which the rendezvous all-gathers over its own
// authenticated channel. The dialer accepts only the pin the acceptor
// published, and the acceptor only the pins of the ranks that dial it, and
// then only the claimed rank's own.
//
// The data path stays the raw-descriptor one: after the handshake the
// socket leaves the net package as without TLS, and the tls.Conn runs over
// a rawConn that reads and writes that descriptor without blocking. A read
// that finds nothing returns a temporary net.Error, which crypto/tls passes
// on without breaking the session (as for a deadline). A write encrypts the
// whole piece into the rawConn's buffer, then writes the buffer with one
// system call; ciphertext the socket has no room for stays buffered, and the
// piece's last byte is reported written only once it is all in the kernel,
// so the ring keeps the stream busy (and armed for writing) until then.
//
// Unlike the path without TLS, this one allocates: crypto/tls makes a small
// reader object each time it reads from the socket, about once per 16 KiB
// record received (go test -memprofile on TestSteadyStateAllocatesNothing
// with TLS on: all of it in tls.(*Conn).readFromUntil).

// pinSep separates the address and the pin in a descriptor's TCP address.
const pinSep = " tls="

// tlsState is a listener's TLS identity and its peers' pins.
type tlsState struct {
	id   *tlsx.Identity
	pins []tlsx.Pin // by rank, set by Connect
	has  []bool
}

func newTLSState(cfg *Config) (*tlsState, error) {
	if !cfg.TLS {
		return nil, nil
	}
	id, err := tlsx.NewIdentity(tlsx.Files{Cert: cfg.TLSCert, Key: cfg.TLSKey, CA: cfg.TLSCA})
	if err != nil {
		return nil, fmt.Errorf("tcp: %w", err)
	}
	return &tlsState{id: id}, nil
}

// setPins parses the peers' pins (hex, by rank).
func (t *tlsState) setPins(self int, peers []int, pins []string) error {
	if len(pins) == 0 {
		return fmt.Errorf("tcp: rank %d uses TLS and needs every peer's key pin", self)
	}
	t.pins, t.has = make([]tlsx.Pin, len(pins)), make([]bool, len(pins))
	for _, p := range peers {
		pin, err := tlsx.ParsePin(pins[p])
		if err != nil {
			return fmt.Errorf("tcp: rank %d's key pin: %w", p, err)
		}
		t.pins[p], t.has[p] = pin, true
	}
	return nil
}

// SplitAddr splits a descriptor's TCP address into the address to dial and
// the rank's key pin ("" when the rank does not use TLS).
func SplitAddr(s string) (addr, pin string) {
	addr, pin, _ = strings.Cut(s, pinSep)
	return addr, pin
}

// JoinAddr is SplitAddr's inverse.
func JoinAddr(addr, pin string) string {
	if pin == "" {
		return addr
	}
	return addr + pinSep + pin
}

// secureStream is one stream's TLS session over its raw descriptor.
type secureStream struct {
	raw  *rawConn
	tc   *tls.Conn
	held int // see writeTLS
}

// clientStream runs the dialer's TLS handshake with rank p on c.
func (t *tlsState) clientStream(ctx context.Context, c *net.TCPConn, p int) (*secureStream, error) {
	raw := &rawConn{TCPConn: c, fd: -1}
	tc := tls.Client(raw, tlsx.ClientConfig(t.id, tlsx.Expect(fmt.Sprintf("rank %d at %v", p, c.RemoteAddr()), t.pins[p])))
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, tlsRefusal(err, p)
	}
	return &secureStream{raw: raw, tc: tc}, nil
}

// serverStream runs the acceptor's TLS handshake on c: only the pins of the
// lower ranks among peers pass; the caller checks the claimed rank's.
func (t *tlsState) serverStream(ctx context.Context, c *net.TCPConn, self int) (*secureStream, tlsx.Pin, error) {
	raw := &rawConn{TCPConn: c, fd: -1}
	verify := func(got tlsx.Pin) error {
		for p := range self {
			if t.has[p] && t.pins[p] == got {
				return nil
			}
		}
		return &tlsx.PinError{Peer: fmt.Sprintf("the dialer at %v", c.RemoteAddr()), Got: got, Want: "the key of any rank that dials this one"}
	}
	tc := tls.Server(raw, tlsx.ServerConfig(t.id, verify))
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, tlsx.Pin{}, fmt.Errorf("TLS: %w", err)
	}
	pin, _ := tlsx.PeerPin(tc.ConnectionState())
	return &secureStream{raw: raw, tc: tc}, pin, nil
}

// tlsRefusal marks TLS failures that retrying cannot fix as refusals.
func tlsRefusal(err error, p int) error {
	var pe *tlsx.PinError
	var oe *net.OpError
	switch {
	case errors.As(err, &pe):
		return fmt.Errorf("%w: TLS: %w", errRefused, err)
	case errors.As(err, &oe) && oe.Op == "remote error": // an alert
		return fmt.Errorf("%w by rank %d: TLS: it did not accept this rank's key (%w); see its log", errRefused, p, err)
	}
	return fmt.Errorf("TLS: %w", err)
}

// readTLS reads stream j's plaintext.
func (p *peer) readTLS(j int, b []byte) (int, error) {
	n, err := p.sec[j].tc.Read(b)
	if n > 0 {
		return n, nil
	}
	if err == errTLSWouldBlock {
		return 0, errWouldBlock
	}
	return 0, err
}

// writeTLS encrypts hdr and payload into stream j's buffer and writes what
// the socket takes. While ciphertext is left over, it reports all but the
// last byte written and keeps that byte (held): the ring calls again with
// it, and it is reported once the buffer is out.
func (p *peer) writeTLS(j int, hdr, payload []byte) (int, error) {
	s := p.sec[j]
	if s.held > 0 {
		if err := s.raw.flush(); err != nil {
			return 0, err
		}
		n := s.held
		s.held = 0
		return n, nil
	}
	total := len(hdr) + len(payload)
	s.raw.setCollect(true)
	var err error
	if len(hdr) > 0 {
		_, err = s.tc.Write(hdr)
	}
	if err == nil && len(payload) > 0 {
		_, err = s.tc.Write(payload)
	}
	s.raw.setCollect(false)
	if err != nil {
		return 0, err
	}
	switch err := s.raw.flush(); err {
	case nil:
		return total, nil
	case errWouldBlock:
		s.held = 1
		return total - 1, nil
	default:
		return 0, err
	}
}

// errTLSWouldBlock is the rawConn's "nothing to read now": temporary, so
// crypto/tls keeps the session.
var errTLSWouldBlock error = wouldBlockError{}

type wouldBlockError struct{}

func (wouldBlockError) Error() string   { return "tcp: operation would block" }
func (wouldBlockError) Timeout() bool   { return true }
func (wouldBlockError) Temporary() bool { return true }

// rawConn is what a tls.Conn runs over: the net.Conn during the handshake,
// the detached non-blocking descriptor afterwards (fd >= 0).
type rawConn struct {
	*net.TCPConn
	fd int

	// Ciphertext not yet in the socket; under mu (crypto/tls may write an
	// alert from a read).
	mu      sync.Mutex
	out     []byte
	off     int
	collect bool // Write only buffers (writeTLS flushes once)
}

func (c *rawConn) Read(b []byte) (int, error) {
	if c.fd < 0 {
		return c.TCPConn.Read(b)
	}
	n, err := readFD(c.fd, b)
	if err == errWouldBlock {
		return 0, errTLSWouldBlock
	}
	return n, err
}

func (c *rawConn) Write(b []byte) (int, error) {
	if c.fd < 0 {
		return c.TCPConn.Write(b)
	}
	c.mu.Lock()
	c.out = append(c.out, b...)
	collect := c.collect
	c.mu.Unlock()
	if !collect {
		if err := c.flush(); err != nil && err != errWouldBlock {
			return 0, err
		}
	}
	return len(b), nil
}

func (c *rawConn) setCollect(on bool) {
	c.mu.Lock()
	c.collect = on
	c.mu.Unlock()
}

// flush writes buffered ciphertext: nil once all of it is in the kernel,
// errWouldBlock while some is left.
func (c *rawConn) flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.off < len(c.out) {
		n, err := writeFD(c.fd, nil, c.out[c.off:])
		if err != nil {
			return err
		}
		c.off += n
	}
	c.out, c.off = c.out[:0], 0
	return nil
}

// pending reports whether ciphertext waits for the socket.
func (c *rawConn) pending() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.off < len(c.out)
}
