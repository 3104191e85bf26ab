package launch

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
)

// secretBytes is the secret's strength: 128 random bits.
const secretBytes = 16

// NewSecret returns a fresh job secret: 128 bits from crypto/rand as 32
// lowercase hex characters.
func NewSecret() (string, error) {
	var b [secretBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("launch: generating the job secret: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// NormalizeSecret checks that secret is 32 hex characters (128 bits) and
// returns it in lowercase, so that nodes given "AB.." and "ab.." agree on
// the job ID. Shorter secrets are refused: they could be guessed.
func NormalizeSecret(secret string) (string, error) {
	s := strings.ToLower(strings.TrimSpace(secret))
	if len(s) != 2*secretBytes {
		return "", fmt.Errorf("the job secret must be %d hex characters (128 bits), got %d characters; "+
			"generate one with: openssl rand -hex 16", 2*secretBytes, len(s))
	}
	if _, err := hex.DecodeString(s); err != nil {
		return "", fmt.Errorf("the job secret must be %d hex characters (128 bits): %v", 2*secretBytes, err)
	}
	return s, nil
}

// JobIDFromSecret derives the job ID from the secret: the first 6 bytes of
// SHA-256 of the secret's text, as 12 hex characters. Every node computes
// the same ID without talking to the others, and the ID reveals nothing
// useful about the secret.
func JobIDFromSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:6])
}

// ReadSecretFile reads a job secret from a file (surrounding white space is
// ignored) and normalizes it.
func ReadSecretFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading the secret file: %w", err)
	}
	s, err := NormalizeSecret(string(b))
	if err != nil {
		return "", fmt.Errorf("secret file %s: %w", path, err)
	}
	return s, nil
}
