package tcp

import (
	"context"
	"crypto/sha256"
	"fmt"

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
	ln, err := Listen(s.Rank, s.Size, Config{SlotSize: s.SlotSize, SlotCount: s.SlotCount, Token: token[:]})
	if err != nil {
		return nil, fmt.Errorf("tcp listen: %w", err)
	}
	return &listener{ln: ln}, nil
}

// Reach: TCP connects any two ranks that both listen.
func (tcpTransport) Reach(me, peer *transport.Descriptor) transport.Reach {
	return transport.ReachBoth(Name, me, peer)
}

type listener struct{ ln *Listener }

func (l *listener) Addr() []byte { return []byte(l.ln.Addr()) }

func (l *listener) Connect(ctx context.Context, bell transport.Bell, peers []*transport.Descriptor) (transport.Endpoint, error) {
	addrs := make([]string, l.ln.size)
	ranks := make([]int, len(peers))
	for i, d := range peers {
		ranks[i] = d.Rank
		addrs[d.Rank] = string(d.Addr(Name))
	}
	l.ln.cfg.Bell = bell
	return l.ln.Connect(ctx, ranks, addrs)
}

// Release closes the listening socket; the endpoint stays up.
func (l *listener) Release() error { return l.ln.Close() }
