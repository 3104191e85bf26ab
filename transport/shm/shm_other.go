//go:build !linux

package shm

import (
	"context"
	"time"

	"github.com/gccl/gccl/transport"
)

// Mailbox is a rank's segment; on this system Create returns ErrNotSupported.
type Mailbox struct{}

// Create returns ErrNotSupported on this system.
func Create(jobID string, rank, size int, localPeers []int, cfg Config) (*Mailbox, error) {
	return nil, ErrNotSupported
}

func (mb *Mailbox) Name() string         { return "" }
func (mb *Mailbox) Bell() transport.Bell { return nil }
func (mb *Mailbox) Unlink() error        { return ErrNotSupported }
func (mb *Mailbox) Close() error         { return ErrNotSupported }

// Connect returns ErrNotSupported on this system.
func (mb *Mailbox) Connect(ctx context.Context, peers map[int]Peer) (*Endpoint, error) {
	return nil, ErrNotSupported
}

// Endpoint is a rank's shared-memory endpoint; it cannot be made on this
// system.
type Endpoint struct{}

var _ transport.Endpoint = (*Endpoint)(nil)

func (e *Endpoint) Rank() int                                { return 0 }
func (e *Endpoint) Size() int                                { return 0 }
func (e *Endpoint) Name() string                             { return "SHM" }
func (e *Endpoint) SlotSize() int                            { return 0 }
func (e *Endpoint) Sender(int) (transport.Sender, error)     { return nil, ErrNotSupported }
func (e *Endpoint) Receiver(int) (transport.Receiver, error) { return nil, ErrNotSupported }
func (e *Endpoint) Seq() uint64                              { return 0 }
func (e *Endpoint) Close() error                             { return nil }
func (e *Endpoint) Abort(error)                              {}
func (e *Endpoint) Wait(context.Context, uint64, time.Time) error {
	return ErrNotSupported
}
