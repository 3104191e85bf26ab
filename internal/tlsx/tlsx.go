// Package tlsx holds what gccl's encrypted connections share: the GCCL_TLS
// switch, per-job identities (a key and a self-signed certificate), and TLS
// 1.3 configurations that trust a peer by the hash of its public key (a pin)
// rather than by a certificate authority.
//
// Trust comes from what the job already authenticates:
//   - the rendezvous's key derives from the job secret (SecretIdentity), so
//     every rank can check the server without any file;
//   - a rank's data-connection key is made at start (NewIdentity) and its pin
//     travels through the rendezvous, already authenticated and encrypted;
//   - sites with a PKI give files instead (GCCL_TLS_CERT, GCCL_TLS_KEY,
//     GCCL_TLS_CA): the certificate then also has to chain to the CA.
//
// Host names are never checked: ranks reach each other by address, and the
// pin (or the CA) is what names a peer.
package tlsx

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"os"
	"time"
)

// Environment variables.
const (
	EnvTLS  = "GCCL_TLS"      // "1": encrypt every connection
	EnvCert = "GCCL_TLS_CERT" // PEM certificate (chain) of this process
	EnvKey  = "GCCL_TLS_KEY"  // PEM private key of that certificate
	EnvCA   = "GCCL_TLS_CA"   // PEM CA certificates peers' certificates must chain to
)

// Enabled reads GCCL_TLS through getenv (nil: os.Getenv): "" or "0" is off,
// "1" is on, anything else is an error.
func Enabled(getenv func(string) string) (bool, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	switch v := getenv(EnvTLS); v {
	case "", "0":
		return false, nil
	case "1":
		return true, nil
	default:
		return false, fmt.Errorf("%s=%q: want 0 or 1", EnvTLS, v)
	}
}

// Files are a site's certificate, key and CA (PEM paths). Empty Cert and Key
// mean a key made per process; empty CA means trust by pin alone.
type Files struct{ Cert, Key, CA string }

// FilesFromEnv reads GCCL_TLS_CERT, GCCL_TLS_KEY and GCCL_TLS_CA.
func FilesFromEnv(getenv func(string) string) Files {
	if getenv == nil {
		getenv = os.Getenv
	}
	return Files{Cert: getenv(EnvCert), Key: getenv(EnvKey), CA: getenv(EnvCA)}
}

// Pin is the SHA-256 of a certificate's SubjectPublicKeyInfo: it names a key,
// whatever certificate carries it.
type Pin [sha256.Size]byte

// PinOf returns the pin of c's public key.
func PinOf(c *x509.Certificate) Pin { return sha256.Sum256(c.RawSubjectPublicKeyInfo) }

func (p Pin) String() string { return hex.EncodeToString(p[:]) }

// ParsePin parses Pin.String's form.
func ParsePin(s string) (Pin, error) {
	var p Pin
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(p) {
		return p, fmt.Errorf("tls: malformed key pin %q", s)
	}
	copy(p[:], b)
	return p, nil
}

// Identity is a key and certificate to present, its pin, and the CA pool
// peers must chain to (nil: pins alone).
type Identity struct {
	Cert  tls.Certificate
	Pin   Pin
	Roots *x509.CertPool
}

// NewIdentity loads files, or makes a fresh ECDSA P-256 key and a
// self-signed certificate for it when files name no certificate.
func NewIdentity(files Files) (*Identity, error) {
	var id *Identity
	switch {
	case files.Cert != "" || files.Key != "":
		if files.Cert == "" || files.Key == "" {
			return nil, fmt.Errorf("tls: %s and %s go together (got %q and %q)", EnvCert, EnvKey, files.Cert, files.Key)
		}
		cert, err := tls.LoadX509KeyPair(files.Cert, files.Key)
		if err != nil {
			return nil, fmt.Errorf("tls: loading %s: %w", files.Cert, err)
		}
		id = &Identity{Cert: cert, Pin: PinOf(cert.Leaf)}
	default:
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("tls: making a key: %w", err)
		}
		if id, err = selfSigned(key, &key.PublicKey, "gccl"); err != nil {
			return nil, err
		}
	}
	if files.CA != "" {
		pem, err := os.ReadFile(files.CA)
		if err != nil {
			return nil, fmt.Errorf("tls: reading %s: %w", files.CA, err)
		}
		id.Roots = x509.NewCertPool()
		if !id.Roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls: %s holds no PEM certificate", files.CA)
		}
	}
	return id, nil
}

// SecretIdentity derives an Ed25519 key from secret and label (HKDF-SHA256):
// whoever knows the secret makes the same key, so it can check a peer that
// holds it without any exchange. SecretPin gives its pin alone.
func SecretIdentity(secret, label string) (*Identity, error) {
	key, err := secretKey(secret, label)
	if err != nil {
		return nil, err
	}
	return selfSigned(key, key.Public(), "gccl "+label)
}

// SecretPin is the pin of SecretIdentity(secret, label).
func SecretPin(secret, label string) (Pin, error) {
	key, err := secretKey(secret, label)
	if err != nil {
		return Pin{}, err
	}
	spki, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return Pin{}, err
	}
	return sha256.Sum256(spki), nil
}

func secretKey(secret, label string) (ed25519.PrivateKey, error) {
	if secret == "" {
		return nil, errors.New("tls: no secret to derive a key from")
	}
	seed, err := hkdf.Key(sha256.New, []byte(secret), nil, "gccl tls key: "+label, ed25519.SeedSize)
	if err != nil {
		return nil, err
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

func selfSigned(key any, pub any, name string) (*Identity, error) {
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(100 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, key)
	if err != nil {
		return nil, fmt.Errorf("tls: making a certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &Identity{Cert: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, Pin: PinOf(leaf)}, nil
}

// PinError is a peer whose key is not the one expected.
type PinError struct {
	Peer string // who it claimed to be, for the message
	Got  Pin
	Want string // what was expected, in words
}

func (e *PinError) Error() string {
	return fmt.Sprintf("tls: %s presented key %.16s…, not %s (not a member of this job, or a machine in the middle)", e.Peer, e.Got.String(), e.Want)
}

// Verify is a check of a peer's pin; nil accepts any key (the caller then
// authenticates the peer some other way).
type Verify func(Pin) error

// Expect returns a Verify that accepts want alone, naming peer if not.
func Expect(peer string, want Pin) Verify {
	return func(got Pin) error {
		if got != want {
			return &PinError{Peer: peer, Got: got, Want: "its published key " + want.String()[:16] + "…"}
		}
		return nil
	}
}

// ClientConfig is a TLS 1.3 client configuration that presents id (when not
// nil) and accepts a server whose key passes verify and, with id.Roots,
// whose certificate chains to them.
func ClientConfig(id *Identity, verify Verify) *tls.Config {
	c := base(id, verify)
	if id != nil {
		c.Certificates = []tls.Certificate{id.Cert}
	}
	return c
}

// ServerConfig is a TLS 1.3 server configuration presenting id. With
// verifyClient (or id.Roots) clients must present a certificate that passes
// it; with neither, clients present none.
func ServerConfig(id *Identity, verifyClient Verify) *tls.Config {
	c := base(id, verifyClient)
	c.Certificates = []tls.Certificate{id.Cert}
	if verifyClient != nil || id.Roots != nil {
		c.ClientAuth = tls.RequireAnyClientCert
	}
	// No session tickets: nothing resumes, and a ticket would be a
	// message the client reads after the handshake.
	c.SessionTicketsDisabled = true
	return c
}

func base(id *Identity, verify Verify) *tls.Config {
	var roots *x509.CertPool
	if id != nil {
		roots = id.Roots
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Certificates are checked by pin (and the CA) in VerifyConnection.
		InsecureSkipVerify: true,
		// Full-size records from the first byte: these are bulk links.
		DynamicRecordSizingDisabled: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				if verify == nil && roots == nil {
					return nil
				}
				return errors.New("tls: the peer presented no certificate")
			}
			leaf := cs.PeerCertificates[0]
			if roots != nil {
				inter := x509.NewCertPool()
				for _, c := range cs.PeerCertificates[1:] {
					inter.AddCert(c)
				}
				if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
					return fmt.Errorf("tls: the peer's certificate does not chain to %s: %w", EnvCA, err)
				}
			}
			if verify != nil {
				return verify(PinOf(leaf))
			}
			return nil
		},
	}
}

// PeerPin returns the pin of the certificate the peer of a finished
// handshake presented (false if none).
func PeerPin(cs tls.ConnectionState) (Pin, bool) {
	if len(cs.PeerCertificates) == 0 {
		return Pin{}, false
	}
	return PinOf(cs.PeerCertificates[0]), true
}
