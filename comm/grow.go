package comm

import (
	"context"
	"fmt"
	"os"

	"github.com/gccl/gccl/bootstrap"
)

// AnyRank, as the rank a newcomer asks for (Join's GCCL_RANK, JoinLocal's
// rank), takes any free rank of the grown communicator.
const AnyRank = bootstrap.AnyRank

// Grow makes a communicator of c's ranks and size-c.Size() newcomers, as
// ncclCommGrow does: with Shrink, the way to replace lost ranks and go on
// without restarting the others. Every rank of c calls it with the same
// size, in the same order relative to its other Grow calls on c, and keeps
// its rank; the newcomers, processes started later that call Join (or, in
// process, goroutines that call JoinLocal), get ranks c.Size()..size-1.
// Grow returns once every rank of c called it and every newcomer came, and
// then connects the grown communicator's ranks as Init does.
//
// Ranks of c that pass different sizes all get ErrMismatch; after the
// communicator's timeout (or ctx's end) Grow fails with ErrTimeout naming
// the ranks that did not call it and how many newcomers did not come. A
// rank of c lost meanwhile fails it with ErrPeerLost. Unlike Shrink, Grow
// needs a c that no rank aborted (across processes the rendezvous refuses
// an aborted group with ErrAborted): after a failure, Shrink first (with
// an empty list if no rank is to go) and grow the result. c and the new
// Comm are independent: close c when done with it.
func (c *Comm) Grow(ctx context.Context, size int) (*Comm, error) {
	if c.released.Load() {
		return nil, &OpError{Op: "Grow", Rank: c.rank, Peer: -1, Err: ErrClosed}
	}
	// Numbered before any check, so that a rank whose call is refused stays
	// in step with the others for the next attempt; the rendezvous numbers
	// its own calls the same way, and checks the size after counting.
	c.growSeq++
	// Shared-memory names carry the grow's number, as a shrink's do; the
	// newcomers learn the name from the rendezvous.
	name := fmt.Sprintf("%s-g%d", c.jobID, c.growSeq)
	sub, err := c.rv.grow(ctx, size, name)
	if err != nil {
		return nil, &OpError{Op: "Grow", Rank: c.rank, Peer: -1, Err: err}
	}
	nc, err := sub.open(ctx, &c.cfg, name)
	if err != nil {
		return nil, &OpError{Op: "Grow", Rank: c.rank, Peer: -1, Err: err}
	}
	return nc, nil
}

// Join starts a newcomer: a process that joins a running job's Grow (a
// replacement for a lost rank, or a new host) instead of its Init. It
// dials the job's rendezvous with the job's secret, from cfg.Bootstrap (a
// Config for bootstrap.JoinGrow) or from the environment
// (bootstrap.NewcomerFromEnv: GCCL_BOOTSTRAP_ADDR and GCCL_SECRET, and
// optionally GCCL_RANK and GCCL_SIZE, the rank asked for in the grown
// communicator and its size), waits (at most the bootstrap timeout) for the
// job's ranks to call Grow, and returns its rank of the grown communicator.
// A newcomer with a wrong secret is refused (bootstrap.ErrUnauthenticated);
// one that asks for another size than the Grow's gets ErrMismatch.
func Join(ctx context.Context, cfg *Config) (*Comm, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	var bcfg bootstrap.Config
	if cfg.Bootstrap != nil {
		bcfg = *cfg.Bootstrap
	} else {
		var err error
		if bcfg, err = bootstrap.NewcomerFromEnv(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
		}
	}
	client, name, err := bootstrap.JoinGrow(ctx, bcfg)
	if err != nil {
		return nil, fromBootstrap(err)
	}
	return bootRendezvous{client}.open(ctx, cfg, name)
}

// EnvJoin set to 1 makes Init a Join: gccl-run --join sets it, so that a
// replacement process runs the job's program unchanged.
const EnvJoin = "GCCL_JOIN"

func newcomerFromEnv() bool { return os.Getenv(EnvJoin) == "1" }

func (b bootRendezvous) grow(ctx context.Context, size int, name string) (rendezvous, error) {
	sub, err := b.client.Grow(ctx, size, name)
	if err != nil {
		return nil, fromBootstrap(err)
	}
	return bootRendezvous{sub}, nil
}
