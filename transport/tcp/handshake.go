package tcp

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
)

// Handshake. The lower rank dials; every stream of a pair is its own
// connection and is authenticated on its own. Neither side ever sends the
// token: each proves it knows it with an HMAC over both sides' nonces and
// the dialer's hello, so a listener at a wrong address learns nothing and a
// recorded handshake cannot be replayed.
//
//	dialer   -> acceptor  hello:     magic, rank, size, stream, streams, slotSize, nonce
//	acceptor -> dialer    challenge: magic, rank, nonce, HMAC(token, "accept"|hello|challenge fields)
//	dialer   -> acceptor  proof:     HMAC(token, "dial"|hello|challenge fields)
//	acceptor -> dialer    verdict:   one byte, handshakeOK
//
// The acceptor closes the connection instead of answering when anything is
// wrong (a bad field, a wrong token, a duplicate stream), and logs why.

const (
	handshakeMagic = "GCCLTCP1" // bump the digit when the wire format changes
	nonceLen       = 16
	macLen         = sha256.Size
	helloLen       = len(handshakeMagic) + 5*4 + nonceLen
	challengeLen   = len(handshakeMagic) + 4 + nonceLen + macLen
	handshakeOK    = 0x01
)

// hello is what a dialer says about itself.
type hello struct {
	rank, size, stream, streams, slotSize uint32
	nonce                                 [nonceLen]byte
}

func (h *hello) marshal() []byte {
	b := make([]byte, 0, helloLen)
	b = append(b, handshakeMagic...)
	for _, v := range []uint32{h.rank, h.size, h.stream, h.streams, h.slotSize} {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	return append(b, h.nonce[:]...)
}

func parseHello(b []byte) (hello, error) {
	var h hello
	if len(b) != helloLen || string(b[:len(handshakeMagic)]) != handshakeMagic {
		return h, errors.New("not a gccl TCP hello (another program, or another gccl version)")
	}
	f := b[len(handshakeMagic):]
	for _, v := range []*uint32{&h.rank, &h.size, &h.stream, &h.streams, &h.slotSize} {
		*v = binary.LittleEndian.Uint32(f)
		f = f[4:]
	}
	copy(h.nonce[:], f)
	return h, nil
}

// handshakeMAC binds the role, the dialer's hello and the acceptor's rank
// and nonce to the token.
func handshakeMAC(token []byte, role string, helloBytes []byte, acceptRank uint32, acceptNonce []byte) []byte {
	m := hmac.New(sha256.New, token)
	m.Write([]byte("gccl-tcp " + role))
	m.Write(helloBytes)
	m.Write(binary.LittleEndian.AppendUint32(nil, acceptRank))
	m.Write(acceptNonce)
	return m.Sum(nil)
}

func newNonce() (n [nonceLen]byte) {
	_, _ = rand.Read(n[:]) // crypto/rand.Read never fails
	return n
}

// errRefused marks a handshake the other side refused or failed to prove:
// a configuration error (wrong token, mismatched settings), not worth a
// retry.
var errRefused = errors.New("tcp: handshake refused")

// dialHandshake runs the dialer's side on c. want is the acceptor's rank.
func dialHandshake(c net.Conn, token []byte, h hello, want int) error {
	hb := h.marshal()
	if _, err := c.Write(hb); err != nil {
		return err
	}
	ch := make([]byte, challengeLen)
	if _, err := io.ReadFull(c, ch); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w by rank %d: it closed the connection after our hello (mismatched size, streams or slot size; see its log)", errRefused, want)
		}
		return err
	}
	if string(ch[:len(handshakeMagic)]) != handshakeMagic {
		return fmt.Errorf("%w: %v does not speak gccl TCP %s", errRefused, c.RemoteAddr(), handshakeMagic)
	}
	f := ch[len(handshakeMagic):]
	rank := binary.LittleEndian.Uint32(f)
	nonce, mac := f[4:4+nonceLen], f[4+nonceLen:]
	if int(rank) != want {
		return fmt.Errorf("%w: %v is rank %d, expected rank %d", errRefused, c.RemoteAddr(), rank, want)
	}
	if !hmac.Equal(mac, handshakeMAC(token, "accept", hb, rank, nonce)) {
		return fmt.Errorf("%w: rank %d at %v does not know the job token", errRefused, want, c.RemoteAddr())
	}
	if _, err := c.Write(handshakeMAC(token, "dial", hb, rank, nonce)); err != nil {
		return err
	}
	var verdict [1]byte
	if _, err := io.ReadFull(c, verdict[:]); err != nil || verdict[0] != handshakeOK {
		return fmt.Errorf("%w by rank %d: it did not accept our token or stream (see its log)", errRefused, want)
	}
	return nil
}

// testHookBeforeVerdict, set by tests, runs between an accepted dialer's
// claim and the verdict that tells it so.
var testHookBeforeVerdict func()

// acceptHandshake runs the acceptor's side on c. check vets the dialer's
// hello before any secret-dependent work; claim reserves the (rank, stream)
// once the dialer is authenticated, and fails for a duplicate.
func acceptHandshake(c net.Conn, token []byte, rank int, check func(hello) error, claim func(hello) error) (hello, error) {
	hb := make([]byte, helloLen)
	if _, err := io.ReadFull(c, hb); err != nil {
		return hello{}, fmt.Errorf("reading hello: %w", err)
	}
	h, err := parseHello(hb)
	if err != nil {
		return h, err
	}
	if err := check(h); err != nil {
		return h, err
	}
	nonce := newNonce()
	ch := make([]byte, 0, challengeLen)
	ch = append(ch, handshakeMagic...)
	ch = binary.LittleEndian.AppendUint32(ch, uint32(rank))
	ch = append(ch, nonce[:]...)
	ch = append(ch, handshakeMAC(token, "accept", hb, uint32(rank), nonce[:])...)
	if _, err := c.Write(ch); err != nil {
		return h, err
	}
	proof := make([]byte, macLen)
	if _, err := io.ReadFull(c, proof); err != nil {
		return h, fmt.Errorf("reading proof: %w (the dialer may have rejected our token)", err)
	}
	if !hmac.Equal(proof, handshakeMAC(token, "dial", hb, uint32(rank), nonce[:])) {
		return h, fmt.Errorf("wrong job token (claims to be rank %d)", h.rank)
	}
	if err := claim(h); err != nil {
		return h, err
	}
	if testHookBeforeVerdict != nil {
		testHookBeforeVerdict()
	}
	if _, err := c.Write([]byte{handshakeOK}); err != nil {
		return h, err
	}
	return h, nil
}
