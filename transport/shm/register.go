package shm

import (
	"context"
	"errors"
	"fmt"

	"github.com/gccl/gccl/transport"
)

// Name is the transport's name in logs and descriptors.
const Name = "SHM"

// Priority puts shared memory before every transport between hosts.
const Priority = 10

func init() { transport.Register(shmTransport{}, Priority) }

// shmTransport connects the ranks of one host through their mailboxes.
type shmTransport struct{}

func (shmTransport) Name() string { return Name }

// Listen creates the rank's mailbox when it has peers on its host.
func (shmTransport) Listen(ctx context.Context, s *transport.Setup) (transport.Listener, error) {
	local := s.SameHost()
	if len(local) == 0 {
		return nil, nil
	}
	if s.Getenv("GCCL_SHM_DISABLE") == "1" {
		return nil, errors.New("GCCL_SHM_DISABLE=1")
	}
	mb, err := Create(s.JobID, s.Rank, s.Size, local, Config{SlotSize: s.SlotSize, SlotCount: s.SlotCount})
	if err != nil {
		return nil, fmt.Errorf("shared memory unavailable: %w", err)
	}
	return &listener{mb: mb, local: local}, nil
}

// Reach: ranks of one host expect shared memory; it works when both
// created their mailboxes.
func (shmTransport) Reach(me, peer *transport.Descriptor) transport.Reach {
	if me.Host != peer.Host {
		return transport.Reach{}
	}
	r := transport.ReachBoth(Name, me, peer)
	if r.Why == "not listening" {
		r.Why = "shared memory unavailable"
	}
	return r
}

type listener struct {
	mb        *Mailbox
	local     []int
	connected bool
}

func (l *listener) Addr() []byte         { return []byte(l.mb.Name()) }
func (l *listener) Claims() []int        { return l.local }
func (l *listener) Bell() transport.Bell { return l.mb.Bell() }

// Connect maps the chosen peers' mailboxes. The bell is the mailbox's own
// (the listener is the rank's BellOwner).
func (l *listener) Connect(ctx context.Context, _ transport.Bell, peers []*transport.Descriptor) (transport.Endpoint, error) {
	m := make(map[int]Peer, len(peers))
	for _, d := range peers {
		m[d.Rank] = Peer{Name: string(d.Addr(Name)), Pid: d.Pid}
	}
	ep, err := l.mb.Connect(ctx, m)
	if err != nil {
		return nil, err
	}
	l.connected = true
	return ep, nil
}

// Release unlinks the mailbox once every local peer has mapped it (nothing
// is left in /dev/shm if a rank crashes afterwards); unconnected, it closes
// it.
func (l *listener) Release() error {
	if l.connected {
		return l.mb.Unlink()
	}
	return l.mb.Close()
}
