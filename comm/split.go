package comm

import (
	"context"
	"fmt"
)

// NoColor is the Split color of a rank that joins no new communicator.
const NoColor = -1

// Split creates communicators from subsets of c's ranks, like
// ncclCommSplit and MPI_Comm_split: ranks passing the same color form one
// communicator, ordered by key, ties broken by their rank in c. A rank
// passing NoColor gets nil. Every rank of c must call Split, in the same
// order relative to its other operations.
func (c *Comm) Split(ctx context.Context, color, key int) (*Comm, error) {
	if color < 0 && color != NoColor {
		// Numbered as the all-gather it skips, so that the peers' Split
		// meets this rank's next call as a mismatch, not as its data.
		if err := c.enter(); err != nil {
			return nil, err
		}
		defer c.leave()
		return nil, c.rejected("Split", invalid("color %d is negative (use NoColor)", color))
	}
	// Through the data path first: Split is numbered with the collectives,
	// and a peer that runs another operation here fails with ErrMismatch.
	all := make([]int64, 2*c.size)
	if err := AllGather(ctx, c, []int64{int64(color), int64(key)}, all); err != nil {
		return nil, err
	}
	c.splitSeq++
	sub, err := c.rv.split(ctx, color, key)
	if err != nil || sub == nil {
		return nil, err
	}
	// Its shared-memory names carry the parent's names, the split's number
	// and color, so sibling communicators, and the children of siblings,
	// never collide.
	return sub.open(ctx, &c.cfg, fmt.Sprintf("%s-s%dc%d", c.jobID, c.splitSeq, color))
}
