package comm

import (
	"context"
	"errors"
	"fmt"

	"github.com/gccl/gccl/bootstrap"
	"github.com/gccl/gccl/internal/shmem"
)

// rendezvous is a communicator's control plane: what Split, Shrink, Alloc
// and the watchdog need besides the data path. Its exchanges work on an
// aborted communicator (Shrink needs that). bootRendezvous serves ranks in
// separate processes, through the bootstrap client; localRendezvous
// (rendezvous_local.go) serves ranks that are goroutines of one process.
// Split, Shrink and Alloc are written once, against it.
type rendezvous interface {
	// allGather exchanges one blob per rank.
	allGather(ctx context.Context, mine []byte) ([][]byte, error)
	// split makes the rendezvous of the ranks that pass color, ordered by
	// key, then by rank; NoColor gets nil. Every rank calls it.
	split(ctx context.Context, color, key int) (rendezvous, error)
	// shrink makes the rendezvous of the ranks not in exclude, which all
	// call it with the same list; the excluded ranks do not.
	shrink(ctx context.Context, exclude []int) (rendezvous, error)
	// grow makes the rendezvous of the group and size-len(group)
	// newcomers (grow.go), which every rank calls with the same size;
	// name names the grown group's shared memory, which newcomers learn.
	grow(ctx context.Context, size int, name string) (rendezvous, error)
	// open makes this rank's communicator of the group; name names its
	// shared-memory resources (a Split's or Shrink's, after the parent's).
	open(ctx context.Context, cfg *Config, name string) (*Comm, error)
	// allocSym allocates this rank's symmetric memory of an Alloc, which
	// peers map by its name (mapSym); mapSym returns nil, nil for a peer
	// whose memory this rank cannot reach.
	allocSym(c *Comm, size int) (symMem, error)
	mapSym(c *Comm, peer int, name string, size int) (symMem, error)
	// laggards lists the ranks that have not reached collective seq.
	laggards(c *Comm, seq uint64) ([]int, error)
	// close releases the rank's part (the rendezvous connection).
	close() error
}

// symMem is one rank's symmetric memory of an Alloc, or this rank's view
// of a peer's.
type symMem interface {
	Bytes() []byte
	Name() string
	// Unlink removes the name once every peer has mapped the memory.
	Unlink() error
	// Close unmaps the memory.
	Close() error
}

// bootRendezvous is the rendezvous of processes: the bootstrap client.
type bootRendezvous struct{ client *bootstrap.Client }

func (b bootRendezvous) allGather(ctx context.Context, mine []byte) ([][]byte, error) {
	return b.client.AllGather(ctx, mine)
}

func (b bootRendezvous) split(ctx context.Context, color, key int) (rendezvous, error) {
	sub, err := b.client.Split(ctx, color, key)
	if err != nil || sub == nil {
		return nil, err
	}
	return bootRendezvous{sub}, nil
}

func (b bootRendezvous) shrink(ctx context.Context, exclude []int) (rendezvous, error) {
	sub, err := b.client.Shrink(ctx, exclude)
	if err != nil {
		return nil, fromBootstrap(err)
	}
	return bootRendezvous{sub}, nil
}

// open connects the group's ranks over the transports (init.go). On
// failure it closes the group's client.
func (b bootRendezvous) open(ctx context.Context, cfg *Config, name string) (*Comm, error) {
	c, err := connect(ctx, b.client, cfg, name)
	if err != nil {
		b.client.Close()
		return nil, err
	}
	return c, nil
}

// allocSym creates a shared-memory region, which peers on this host map.
func (b bootRendezvous) allocSym(c *Comm, size int) (symMem, error) {
	r, err := shmem.Alloc(c.jobID, c.rank, size)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// mapSym maps the region of a peer this rank reaches over shared memory.
func (b bootRendezvous) mapSym(c *Comm, peer int, name string, size int) (symMem, error) {
	if c.Via(peer) != "SHM" {
		return nil, nil
	}
	r, err := shmem.MapRegion(name, size)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (b bootRendezvous) laggards(c *Comm, seq uint64) ([]int, error) { return c.bootstrapLaggards(seq) }

func (b bootRendezvous) close() error { return b.client.Close() }

// fromBootstrap adds comm's sentinel to an error of the rendezvous, so that
// callers test one set of errors.
func fromBootstrap(err error) error {
	for _, m := range []struct{ boot, comm error }{
		{bootstrap.ErrMismatch, ErrMismatch}, // before its kind, ErrInvalidArgument
		{bootstrap.ErrInvalidArgument, ErrInvalidArgument},
		{bootstrap.ErrRankLost, ErrPeerLost},
		{bootstrap.ErrRendezvousLost, ErrPeerLost},
		{bootstrap.ErrTimeout, ErrTimeout},
		{bootstrap.ErrAborted, ErrAborted},
		{bootstrap.ErrClosed, ErrClosed},
	} {
		if errors.Is(err, m.boot) {
			return fmt.Errorf("%w: %w", m.comm, err)
		}
	}
	return err
}
