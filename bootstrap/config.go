package bootstrap

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/gccl/gccl/internal/logx"
)

// Version is the gccl library version every rank announces at Join; the
// rendezvous admits only ranks that run the same one. Release builds set it
// with -ldflags "-X github.com/gccl/gccl/bootstrap.Version=...".
var Version = "0.1.0-dev"

// ProtocolVersion is the version of the rendezvous wire protocol
// (bootstrappb/bootstrap.proto); it changes with any incompatible change.
const ProtocolVersion = 3

// DefaultPort is the rendezvous port used when the launcher names a host but
// no port (single-host MPI and PMI jobs), the same default as torchrun's.
const DefaultPort = 29500

// Defaults applied by Join to zero Config fields.
const (
	DefaultTimeout          = 60 * time.Second
	DefaultHeartbeatTimeout = 3 * time.Second
)

// Config describes this rank's place in the job and how to reach the
// rendezvous. FromEnv fills it from the launcher's environment.
type Config struct {
	Rank, Size int
	// LocalRank and LocalSize place this rank among the ranks of its host,
	// for transports and launchers. LocalSize 0 means unknown.
	LocalRank, LocalSize int

	// Addr is the rendezvous host:port that every rank dials.
	Addr string
	// ListenAddr is where a serving rank listens. Empty means Addr itself
	// when Addr's host is a loopback address, and ":port" (every interface)
	// otherwise: the host name in Addr may resolve to an address other
	// ranks cannot reach, as torchrun's TCPStore also assumes.
	ListenAddr string
	// Secret is the job secret, 32 hex characters (128 bits); see NewSecret.
	Secret string
	// Serve makes this process serve the rendezvous in-process. FromEnv
	// sets it on rank 0 unless GCCL_BOOTSTRAP_SERVE=0 (an external
	// gccl-bootstrap serves).
	Serve bool
	// ServedByRank0 says, on every rank, that rank 0's process serves the
	// rendezvous (FromEnv sets it wherever it sets rank 0's Serve), so that
	// losing the rendezvous names rank 0 as the rank that is gone.
	ServedByRank0 bool
	// JobID names the job's shared resources (e.g. /dev/shm/gccl-<JobID>-*).
	// Empty means DeriveJobID(Secret).
	JobID string

	// Timeout bounds Join and every blocking call (Get, Wait, AllGather,
	// Barrier, Split), on top of the caller's context; a serving rank's
	// Close also waits at most this long for the other ranks to leave.
	// Zero means DefaultTimeout.
	Timeout time.Duration
	// HeartbeatTimeout is how long a silent rank (or a silent rendezvous)
	// is tolerated before it is declared lost. It is enforced by the
	// rendezvous: a serving rank passes it to its server, and other ranks
	// learn the server's value at Join. Zero means DefaultHeartbeatTimeout.
	HeartbeatTimeout time.Duration

	// TLS encrypts the rendezvous (and, read by the transports and p2p from
	// GCCL_TLS, the data connections) with TLS 1.3. Without TLSFiles the
	// rendezvous's key derives from Secret, so nothing needs distributing.
	// Every rank and the rendezvous must agree; a rank that differs fails
	// its Join with ErrInvalidArgument. FromEnv sets it from GCCL_TLS=1.
	TLS bool
	// TLSFiles are the site's PEM files (GCCL_TLS_CERT, GCCL_TLS_KEY,
	// GCCL_TLS_CA), for sites with a PKI; see TLSFiles.
	TLSFiles TLSFiles

	// Logger receives INFO and WARN records about joins, losses and aborts.
	// Nil means gccl's logger configured by GCCL_DEBUG (subsystem BOOTSTRAP).
	Logger *slog.Logger

	// Version and Protocol override the versions this rank announces at
	// Join (empty or zero: Version and ProtocolVersion). They exist to test
	// version-mismatch handling.
	Version  string
	Protocol int
}

// NewSecret returns a fresh job secret: 128 random bits as 32 hex characters.
func NewSecret() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand aborts the program instead)
	return hex.EncodeToString(b[:])
}

// DeriveJobID returns the default job ID for a (lowercase) secret: the first
// 12 hex characters of its SHA-256, so that every rank derives the same name
// without revealing the secret. gccl-run derives the same.
func DeriveJobID(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])[:12]
}

// checkSecret reports whether s is a well-formed job secret.
func checkSecret(s string) error {
	if len(s) != 32 {
		return fmt.Errorf("%w: the job secret must be 32 hex characters (128 bits), got %d characters; generate one with `openssl rand -hex 16` and give every rank the same GCCL_SECRET", ErrInvalidArgument, len(s))
	}
	if _, err := hex.DecodeString(s); err != nil {
		return fmt.Errorf("%w: the job secret must be 32 hex characters, got a non-hex character; generate one with `openssl rand -hex 16`", ErrInvalidArgument)
	}
	return nil
}

// withDefaults validates cfg and fills its zero fields.
func (cfg Config) withDefaults() (Config, error) {
	bad := func(format string, args ...any) (Config, error) {
		return cfg, fmt.Errorf("gccl bootstrap: rank %d: %w: %s", cfg.Rank, ErrInvalidArgument, fmt.Sprintf(format, args...))
	}
	if cfg.Size < 1 {
		return bad("Size is %d; a job has at least one rank", cfg.Size)
	}
	if cfg.Rank < 0 || cfg.Rank >= cfg.Size {
		return bad("Rank %d is outside 0..%d (Size %d)", cfg.Rank, cfg.Size-1, cfg.Size)
	}
	if cfg.LocalSize < 0 || (cfg.LocalSize > 0 && (cfg.LocalRank < 0 || cfg.LocalRank >= cfg.LocalSize)) {
		return bad("LocalRank %d is outside 0..%d (LocalSize %d)", cfg.LocalRank, cfg.LocalSize-1, cfg.LocalSize)
	}
	if _, _, err := net.SplitHostPort(cfg.Addr); err != nil {
		return bad("rendezvous address %q is not host:port (%v); set GCCL_BOOTSTRAP_ADDR", cfg.Addr, err)
	}
	// Lowercase, so that "AB.." on one host and "ab.." on another agree
	// (gccl-run normalizes the same way).
	cfg.Secret = strings.ToLower(cfg.Secret)
	if err := checkSecret(cfg.Secret); err != nil {
		return cfg, fmt.Errorf("gccl bootstrap: rank %d: %w", cfg.Rank, err)
	}
	if cfg.JobID == "" {
		cfg.JobID = DeriveJobID(cfg.Secret)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.HeartbeatTimeout <= 0 {
		cfg.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = logx.Default().With("subsys", "BOOTSTRAP")
	}
	if cfg.Version == "" {
		cfg.Version = Version
	}
	if cfg.Protocol == 0 {
		cfg.Protocol = ProtocolVersion
	}
	return cfg, nil
}

// listenAddr is where a serving rank listens (see Config.ListenAddr).
func (cfg Config) listenAddr() string {
	if cfg.ListenAddr != "" {
		return cfg.ListenAddr
	}
	host, port, _ := net.SplitHostPort(cfg.Addr)
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return cfg.Addr
	}
	return net.JoinHostPort("", port)
}

// server names who serves the rendezvous, for the errors that say it is
// gone: ", served by rank 0," when that rank's process does.
func (c Config) server() string {
	if c.ServedByRank0 {
		return ", served by rank 0,"
	}
	return ""
}
