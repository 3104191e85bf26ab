package comm

import (
	"context"
	"fmt"
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
	// in step with the others for the next attempt (the rendezvous numbers
	// its own calls the same way).
	c.shrinkSeq++
	sub, err := c.rv.shrink(ctx, exclude)
	if err != nil {
		return nil, &OpError{Op: "Shrink", Rank: c.rank, Peer: -1, Err: err}
	}
	// Shared-memory names carry the shrink's number, as a split's do.
	nc, err := sub.open(ctx, &c.cfg, fmt.Sprintf("%s-x%d", c.jobID, c.shrinkSeq))
	if err != nil {
		return nil, &OpError{Op: "Shrink", Rank: c.rank, Peer: -1, Err: err}
	}
	return nc, nil
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
