package comm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/gccl/gccl/bootstrap"
	"github.com/gccl/gccl/transport/inproc"
)

// Shrink makes a communicator of c's ranks that are not in exclude, in the
// same order (ncclCommShrink, MPI_Comm_shrink): the way to go on after
// ranks fail. Every rank not excluded calls it with the same list of ranks
// of c, in any order; excluded ranks do not call it and may be dead. It
// needs nothing from them, so it works on a Comm that an operation aborted
// (the usual case: a collective failed with ErrPeerLost, whose error names
// the lost rank), and on a healthy one, which stays usable. Ranks that pass
// different lists all get an error.
//
// c and the new Comm are independent: close c when done with it. Across
// processes the rendezvous must survive, so the rank that serves it (rank 0
// of the job, unless gccl-bootstrap runs it) cannot be excluded while dead.
// A rank excluded while alive must not call Shrink on c afterwards; like
// every rank it numbers its Shrink calls on c, and it would be behind.
func (c *Comm) Shrink(ctx context.Context, exclude []int) (*Comm, error) {
	if c.released.Load() {
		return nil, &OpError{Op: "Shrink", Rank: c.rank, Peer: -1, Err: ErrClosed}
	}
	// Numbered before any check, so that a rank whose call is refused stays
	// in step with the others for the next attempt (the rendezvous client
	// numbers its own calls the same way).
	c.shrinkSeq++
	if c.boot != nil {
		return c.shrinkRemote(ctx, exclude)
	}
	if c.world == nil {
		return nil, &OpError{Op: "Shrink", Rank: c.rank, Peer: -1, Err: fmt.Errorf("%w: Shrink of this communicator", ErrNotSupported)}
	}
	out, err := shrinkSet(c.rank, c.size, exclude)
	if err != nil {
		return nil, &OpError{Op: "Shrink", Rank: c.rank, Peer: -1, Err: err}
	}
	return c.shrinkLocal(ctx, out)
}

// LostRanks returns the ranks of c that are gone from the job so far, in
// order: the list to pass to Shrink. They are the ranks the rendezvous
// declared lost and those whose process left the job (closed its last
// communicator, say after an error of its own). A rank whose process died is
// declared lost within milliseconds of its death, a hung one after the
// heartbeat timeout (3 s); so a survivor whose operation failed may see an
// empty list for a moment. In-process communicators have no rendezvous:
// their ranks are goroutines, which are never lost on their own; LostRanks
// returns nil.
func (c *Comm) LostRanks() []int {
	if c.boot == nil {
		return nil
	}
	return c.boot.LostRanks()
}

// shrinkSet checks an in-process Shrink's exclusion list (the rendezvous
// checks a remote one) and returns it as a set.
func shrinkSet(rank, size int, exclude []int) ([]bool, error) {
	out := make([]bool, size)
	for _, r := range exclude {
		switch {
		case r < 0 || r >= size:
			return nil, invalid("excluded rank %d is outside 0..%d", r, size-1)
		case out[r]:
			return nil, invalid("rank %d is excluded twice", r)
		}
		out[r] = true
	}
	if out[rank] {
		return nil, invalid("rank %d excludes itself (excluded ranks do not call Shrink)", rank)
	}
	return out, nil
}

// shrinkRemote makes the communicator over the rendezvous, which checks the
// list and that the survivors agree, and needs nothing from the excluded
// ranks.
func (c *Comm) shrinkRemote(ctx context.Context, exclude []int) (*Comm, error) {
	sub, err := c.boot.Shrink(ctx, exclude)
	if err != nil {
		return nil, &OpError{Op: "Shrink", Rank: c.rank, Peer: -1, Err: fromBootstrap(err)}
	}
	// Shared-memory names carry the shrink's number, as a split's do.
	jobID := fmt.Sprintf("%s-x%d", c.jobID, c.shrinkSeq)
	nc, err := connect(ctx, sub, &c.cfg, jobID)
	if err != nil {
		sub.Close()
		return nil, &OpError{Op: "Shrink", Rank: c.rank, Peer: -1, Err: err}
	}
	return nc, nil
}

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

// The in-process worlds being made by Shrink, until every survivor has taken
// its endpoint; when the survivors disagreed, until the parent world is
// closed (latecomers to a failed shrink must fail too, and nobody knows how
// many will come).
var (
	shrinkMu  sync.Mutex
	shrinksOf = map[shrinkKey]*pendingShrink{}
)

type shrinkKey struct {
	parent *inproc.World
	seq    uint64
}

type pendingShrink struct {
	out     []bool // the first caller's exclusions
	w       *inproc.World
	group   localGroup
	arrived int           // calls so far
	gaveUp  int           // of those, the ones that stopped waiting
	ready   chan struct{} // closed when every survivor arrived, or on err
	err     error
}

func (c *Comm) shrinkLocal(ctx context.Context, out []bool) (*Comm, error) {
	survivors, newRank := 0, 0
	for r, x := range out {
		if !x {
			if r == c.rank {
				newRank = survivors
			}
			survivors++
		}
	}
	k := shrinkKey{c.world, c.shrinkSeq}
	shrinkMu.Lock()
	p := shrinksOf[k]
	if p == nil {
		w, err := inproc.NewWorld(survivors, c.cfg.SlotSize, c.cfg.SlotCount)
		if err != nil {
			shrinkMu.Unlock()
			return nil, &OpError{Op: "Shrink", Rank: c.rank, Peer: -1, Err: err}
		}
		p = &pendingShrink{out: out, w: w, group: make(localGroup, survivors), ready: make(chan struct{})}
		shrinksOf[k] = p
	}
	switch {
	case p.err != nil:
	case !slices.Equal(p.out, out):
		p.err = fmt.Errorf("%w: rank %d excludes ranks %v, another rank excludes %v: every survivor must pass the same list",
			ErrMismatch, c.rank, setRanks(out), setRanks(p.out))
		close(p.ready)
	default:
		if p.arrived++; p.arrived-p.gaveUp == len(p.group) {
			delete(shrinksOf, k)
			close(p.ready)
		}
	}
	shrinkMu.Unlock()

	var timer <-chan time.Time
	if c.timeout > 0 {
		t := time.NewTimer(c.timeout)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-p.ready:
	case <-ctx.Done():
		if _, _, ok := p.withdraw(k); ok {
			return nil, &OpError{Op: "Shrink", Rank: c.rank, Peer: -1, Err: ctx.Err()}
		}
	case <-timer:
		if arrived, gaveUp, ok := p.withdraw(k); ok {
			err := fmt.Errorf("%w: after %v, %d of the %d survivors have called Shrink", ErrTimeout, c.timeout, arrived, len(p.group))
			if gaveUp > 0 {
				err = fmt.Errorf("%w (%d of them gave up before the others came)", err, gaveUp)
			}
			return nil, &OpError{Op: "Shrink", Rank: c.rank, Peer: -1, Err: err}
		}
	}
	// Every survivor arrived, or they disagreed.
	if p.err != nil {
		return nil, &OpError{Op: "Shrink", Rank: c.rank, Peer: -1, Err: p.err}
	}
	return joinLocal(p.w, p.group, newRank, &c.cfg)
}

// withdraw takes back the arrival of a survivor that gives up waiting, so
// that one arriving later waits for the others (and fails) rather than
// getting a communicator whose members are gone; the last to leave removes
// the entry. It returns how many survivors had called Shrink and how many
// of them gave up before this one, and false when it is too late: every
// survivor arrived, or they disagreed, meanwhile.
func (p *pendingShrink) withdraw(k shrinkKey) (arrived, gaveUp int, ok bool) {
	shrinkMu.Lock()
	defer shrinkMu.Unlock()
	select {
	case <-p.ready:
		return p.arrived, p.gaveUp, false
	default:
	}
	arrived, gaveUp = p.arrived, p.gaveUp
	if p.gaveUp++; p.gaveUp == p.arrived {
		delete(shrinksOf, k)
	}
	return arrived, gaveUp, true
}

// forgetShrinks drops the shrinks of a world whose every rank has closed:
// no rank of it can call Shrink again, and one still waiting in Shrink
// holds its entry itself.
func forgetShrinks(parent *inproc.World) {
	shrinkMu.Lock()
	defer shrinkMu.Unlock()
	for k := range shrinksOf {
		if k.parent == parent {
			delete(shrinksOf, k)
		}
	}
}

func setRanks(set []bool) []int {
	var out []int
	for r, x := range set {
		if x {
			out = append(out, r)
		}
	}
	return out
}
