package tcp

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"strconv"

	"github.com/gccl/gccl/internal/tlsx"
	"github.com/gccl/gccl/transport"
)

// Name is the transport's name in logs and descriptors.
const Name = "TCP"

// Priority puts TCP after every other transport: it reaches any host, and
// is the slowest.
const Priority = 30

func init() { transport.Register(tcpTransport{}, Priority) }

type tcpTransport struct{}

func (tcpTransport) Name() string { return Name }

// Listen opens the rank's listening socket, unless a faster transport of
// this rank claims every peer (shared memory, on a one-host job). The
// token that authenticates connections derives from the job's id.
func (tcpTransport) Listen(ctx context.Context, s *transport.Setup) (transport.Listener, error) {
	if len(s.Unclaimed) == 0 {
		return nil, nil
	}
	token := sha256.Sum256([]byte("gccl-tcp:" + s.JobID))
	getenv := s.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	useTLS, err := tlsx.Enabled(getenv)
	if err != nil {
		return nil, fmt.Errorf("tcp: %w", err)
	}
	eager, err := transport.EagerConnect(getenv)
	if err != nil {
		return nil, fmt.Errorf("tcp: %w", err)
	}
	streams := 0 // DefaultStreams
	if v := getenv(EnvSockets); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxStreams {
			return nil, fmt.Errorf("tcp: %s=%q: want a number of sockets per peer from 1 to %d", EnvSockets, v, MaxStreams)
		}
		streams = n
	}
	files := tlsx.FilesFromEnv(getenv)
	ln, err := Listen(s.Rank, s.Size, Config{SlotSize: s.SlotSize, SlotCount: s.SlotCount, Streams: streams, Token: token[:],
		TLS: useTLS, TLSCert: files.Cert, TLSKey: files.Key, TLSCA: files.CA})
	if err != nil {
		return nil, fmt.Errorf("tcp listen: %w", err)
	}
	return &listener{ln: ln, eager: eager}, nil
}

// Reach: TCP connects any two ranks that both listen.
func (tcpTransport) Reach(me, peer *transport.Descriptor) transport.Reach {
	return transport.ReachBoth(Name, me, peer)
}

// EnvRuntimeConnect is transport.EnvRuntimeConnect: 0 connects every pair
// at Init.
const EnvRuntimeConnect = transport.EnvRuntimeConnect

// EnvSockets sets the sockets per peer (Config.Streams; default
// DefaultStreams); every rank of a job must set the same.
const EnvSockets = "GCCL_SOCKET_NSOCKS"

type listener struct {
	ln    *Listener
	eager bool // GCCL_RUNTIME_CONNECT=0
}

// Addr is the descriptor's TCP address: host:port, and with TLS the key's
// pin (see JoinAddr), which the rendezvous carries to the peers.
func (l *listener) Addr() []byte { return []byte(JoinAddr(l.ln.Addr(), l.ln.Pin())) }

// Connect returns the endpoint at once, each pair connecting at its first
// use (ConnectLazy), or under GCCL_RUNTIME_CONNECT=0 once every pair is up.
func (l *listener) Connect(ctx context.Context, bell transport.Bell, peers []*transport.Descriptor) (transport.Endpoint, error) {
	addrs := make([]string, l.ln.size)
	pins := make([]string, l.ln.size)
	ranks := make([]int, len(peers))
	mine := l.ln.tls != nil
	for i, d := range peers {
		ranks[i] = d.Rank
		addrs[d.Rank], pins[d.Rank] = SplitAddr(string(d.Addr(Name)))
		if theirs := pins[d.Rank] != ""; theirs != mine {
			return nil, fmt.Errorf("tcp: rank %d %s and rank %d %s: every rank of a job must set the same %s",
				l.ln.rank, tlsWords(mine), d.Rank, tlsWords(theirs), tlsx.EnvTLS)
		}
	}
	l.ln.cfg.Bell = bell
	if l.eager {
		return l.ln.ConnectPinned(ctx, ranks, addrs, pins)
	}
	return l.ln.ConnectLazy(ranks, addrs, pins)
}

func tlsWords(on bool) string {
	if on {
		return "uses TLS (" + tlsx.EnvTLS + "=1)"
	}
	return "does not use TLS"
}

// Release closes the listening socket if Connect was never called; once it
// was, the endpoint keeps accepting its peers' first connections, and
// closes the socket when it closes.
func (l *listener) Release() error { return l.ln.Close() }
