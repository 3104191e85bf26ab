package comm

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/gccl/gccl/transport/inproc"
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
	all := make([]int64, 2*c.size)
	if err := AllGather(ctx, c, []int64{int64(color), int64(key)}, all); err != nil {
		return nil, err
	}
	c.splitSeq++
	if color == NoColor {
		if c.boot != nil {
			// The rendezvous's split is collective: take part, get nothing.
			if _, err := c.boot.Split(ctx, NoColor, key); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}
	var members []int
	for r := 0; r < c.size; r++ {
		if all[2*r] == int64(color) {
			members = append(members, r)
		}
	}
	sort.SliceStable(members, func(i, j int) bool { return all[2*members[i]+1] < all[2*members[j]+1] })
	newRank := 0
	for i, r := range members {
		if r == c.rank {
			newRank = i
		}
	}
	if c.boot != nil {
		return c.splitRemote(ctx, color, key)
	}
	if c.world == nil {
		return nil, &OpError{Op: "Split", Rank: c.rank, Peer: -1, Err: fmt.Errorf("%w: Split of this communicator", ErrNotSupported)}
	}
	p, err := localSplit(c.world, c.splitSeq, color, len(members), &c.cfg)
	if err != nil {
		return nil, err
	}
	return joinLocal(p.w, p.group, newRank, &c.cfg)
}

// joinLocal makes rank's communicator of an in-process world made by Split
// or Shrink, and registers it with the group's watchdog.
func joinLocal(w *inproc.World, group localGroup, rank int, cfg *Config) (*Comm, error) {
	nc, err := newComm(w.Endpoint(rank), cfg)
	if err != nil {
		return nil, err
	}
	nc.world = w
	group[rank].Store(nc)
	nc.laggards = group.laggards
	return nc, nil
}

// The in-process worlds being created by Split, until every member has
// taken its endpoint.
var (
	splitMu  sync.Mutex
	splitsOf = map[splitKey]*pendingSplit{}
)

type splitKey struct {
	parent *inproc.World
	seq    uint64
	color  int
}

type pendingSplit struct {
	w     *inproc.World
	taken int
	group localGroup // the new communicators, for the watchdog
}

func localSplit(parent *inproc.World, seq uint64, color, size int, cfg *Config) (*pendingSplit, error) {
	splitMu.Lock()
	defer splitMu.Unlock()
	k := splitKey{parent, seq, color}
	p := splitsOf[k]
	if p == nil {
		w, err := inproc.NewWorld(size, cfg.SlotSize, cfg.SlotCount)
		if err != nil {
			return nil, err
		}
		p = &pendingSplit{w: w, group: make(localGroup, size)}
		splitsOf[k] = p
	}
	if p.taken++; p.taken == size {
		delete(splitsOf, k)
	}
	return p, nil
}
