package tlsx

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// handshake runs a client and a server over a pipe and returns both errors.
func handshake(t *testing.T, client, server *tls.Config) (cerr, serr error) {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	done := make(chan error, 1)
	go func() {
		s := tls.Server(b, server)
		err := s.Handshake()
		if err == nil {
			_, err = s.Write([]byte("x")) // lets the client see a late refusal
		}
		b.Close()
		done <- err
	}()
	c := tls.Client(a, client)
	cerr = c.Handshake()
	if cerr == nil {
		var one [1]byte
		_, cerr = c.Read(one[:])
	}
	a.Close()
	return cerr, <-done
}

func mustIdentity(t *testing.T) *Identity {
	t.Helper()
	id, err := NewIdentity(Files{})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestPinnedHandshake(t *testing.T) {
	srv, cli := mustIdentity(t), mustIdentity(t)
	cerr, serr := handshake(t, ClientConfig(cli, Expect("rank 1", srv.Pin)), ServerConfig(srv, Expect("rank 0", cli.Pin)))
	if cerr != nil || serr != nil {
		t.Fatalf("pinned handshake: client %v, server %v", cerr, serr)
	}
}

func TestWrongServerPinRefused(t *testing.T) {
	srv, cli, other := mustIdentity(t), mustIdentity(t), mustIdentity(t)
	cerr, serr := handshake(t, ClientConfig(cli, Expect("rank 1", other.Pin)), ServerConfig(srv, nil))
	var pe *PinError
	if !errors.As(cerr, &pe) || pe.Got != srv.Pin || !strings.Contains(cerr.Error(), "rank 1") {
		t.Fatalf("client error %v, want a PinError naming rank 1 with the server's pin", cerr)
	}
	if serr == nil {
		t.Fatal("server finished a handshake the client refused")
	}
}

func TestWrongClientPinRefused(t *testing.T) {
	srv, cli, other := mustIdentity(t), mustIdentity(t), mustIdentity(t)
	_, serr := handshake(t, ClientConfig(cli, Expect("rank 1", srv.Pin)), ServerConfig(srv, Expect("rank 0", other.Pin)))
	var pe *PinError
	if !errors.As(serr, &pe) || pe.Got != cli.Pin || !strings.Contains(serr.Error(), "rank 0") {
		t.Fatalf("server error %v, want a PinError naming rank 0", serr)
	}
	// A client with no certificate at all is refused too.
	_, serr = handshake(t, ClientConfig(nil, Expect("rank 1", srv.Pin)), ServerConfig(srv, Expect("rank 0", cli.Pin)))
	if serr == nil {
		t.Fatal("server accepted a client without a certificate")
	}
}

func TestSecretIdentity(t *testing.T) {
	const secret = "00112233445566778899aabbccddeeff"
	a, err := SecretIdentity(secret, "rendezvous")
	if err != nil {
		t.Fatal(err)
	}
	pin, err := SecretPin(secret, "rendezvous")
	if err != nil || pin != a.Pin {
		t.Fatalf("SecretPin = %v, %v; identity pin %v", pin, err, a.Pin)
	}
	if other, _ := SecretPin("ffffffffffffffffffffffffffffffff", "rendezvous"); other == pin {
		t.Fatal("two secrets derive one key")
	}
	if other, _ := SecretPin(secret, "p2p"); other == pin {
		t.Fatal("two labels derive one key")
	}
	cerr, serr := handshake(t, ClientConfig(nil, Expect("the rendezvous", pin)), ServerConfig(a, nil))
	if cerr != nil || serr != nil {
		t.Fatalf("secret-pinned handshake: client %v, server %v", cerr, serr)
	}
	if _, err := SecretIdentity("", "x"); err == nil {
		t.Fatal("empty secret accepted")
	}
}

func TestParsePin(t *testing.T) {
	id := mustIdentity(t)
	p, err := ParsePin(id.Pin.String())
	if err != nil || p != id.Pin {
		t.Fatalf("ParsePin(String()) = %v, %v", p, err)
	}
	for _, bad := range []string{"", "zz", id.Pin.String()[:10]} {
		if _, err := ParsePin(bad); err == nil {
			t.Errorf("ParsePin(%q) accepted", bad)
		}
	}
}

func TestEnabled(t *testing.T) {
	for v, want := range map[string]bool{"": false, "0": false, "1": true} {
		got, err := Enabled(func(string) string { return v })
		if err != nil || got != want {
			t.Errorf("GCCL_TLS=%q: %v, %v", v, got, err)
		}
	}
	if _, err := Enabled(func(string) string { return "yes" }); err == nil {
		t.Error("GCCL_TLS=yes accepted")
	}
}

// writePEM writes blocks to a file under dir.
func writePEM(t *testing.T, dir, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestFilesWithCA: certificates from files must chain to the CA, and a
// per-process certificate that does not is refused.
func TestFilesWithCA(t *testing.T) {
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "node"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalPKCS8PrivateKey(key)
	files := Files{
		Cert: writePEM(t, dir, "node.pem", "CERTIFICATE", der),
		Key:  writePEM(t, dir, "node.key", "PRIVATE KEY", keyDER),
		CA:   writePEM(t, dir, "ca.pem", "CERTIFICATE", caDER),
	}
	a, err := NewIdentity(files)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewIdentity(files)
	if err != nil {
		t.Fatal(err)
	}
	if cerr, serr := handshake(t, ClientConfig(a, nil), ServerConfig(b, nil)); cerr != nil || serr != nil {
		t.Fatalf("CA-signed handshake: client %v, server %v", cerr, serr)
	}
	stranger := mustIdentity(t)
	_, serr := handshake(t, ClientConfig(stranger, nil), ServerConfig(b, nil))
	if serr == nil || !strings.Contains(serr.Error(), EnvCA) {
		t.Fatalf("server accepted a certificate outside the CA: %v", serr)
	}
	if _, err := NewIdentity(Files{Cert: files.Cert}); err == nil {
		t.Fatal("a certificate without its key accepted")
	}
}
