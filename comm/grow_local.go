package comm

import (
	"context"
	"fmt"
	"slices"
)

// localGrows is an in-process group's record of its Grow calls: the open
// ones, which newcomers (JoinLocal) fill, and the failed ones, whose
// members arriving late get the failure at once.
type localGrows struct {
	open    []*localGrow // oldest first
	failed  map[uint64]error
	changed chan struct{} // closed and replaced when a grow opens
}

// localGrow is one in-process Grow, until every member and newcomer came.
type localGrow struct {
	seq      uint64
	size     int // the grown group's
	sub      *localGroupState
	arrived  int    // members so far
	taken    []bool // newcomers' ranks, from the group's size on
	filled   int
	name     string
	ready    chan struct{} // closed when complete, or on err
	finished bool
	err      error
}

// growsLocked returns g's grow record, made on first use.
func (g *localGroupState) growsLocked() *localGrows {
	if g.grows.failed == nil {
		g.grows.failed = map[uint64]error{}
		g.grows.changed = make(chan struct{})
	}
	return &g.grows
}

func (g *localGroupState) completeGrowLocked(p *localGrow) {
	if p.finished || p.arrived < g.size || p.filled < len(p.taken) {
		return
	}
	p.finished = true
	close(p.ready)
	g.removeGrowLocked(p)
}

func (g *localGroupState) failGrowLocked(p *localGrow, err error) {
	if p.finished {
		return
	}
	p.finished, p.err = true, err
	close(p.ready)
	g.removeGrowLocked(p)
	g.growsLocked().failed[p.seq] = err
}

func (g *localGroupState) removeGrowLocked(p *localGrow) {
	gs := g.growsLocked()
	if i := slices.Index(gs.open, p); i >= 0 {
		gs.open = slices.Delete(gs.open, i, i+1)
	}
}

// missingLocked says who p still waits for.
func (g *localGroupState) growMissingLocked(p *localGrow) string {
	return fmt.Sprintf("%d of the %d ranks have called Grow, %d of the %d newcomers have called JoinLocal",
		p.arrived, g.size, p.filled, len(p.taken))
}

func (l *localRendezvous) grow(ctx context.Context, size int, name string) (rendezvous, error) {
	l.grows++ // before any check, as the bootstrap client counts
	g := l.g
	if size <= g.size {
		return nil, invalid("grow to %d ranks: the communicator has %d already; Grow adds at least one", size, g.size)
	}
	g.mu.Lock()
	gs := g.growsLocked()
	if err, failed := gs.failed[l.grows]; failed {
		g.mu.Unlock()
		return nil, err
	}
	var p *localGrow
	for _, o := range gs.open {
		if o.seq == l.grows {
			p = o
		}
	}
	if p == nil {
		p = &localGrow{seq: l.grows, size: size, sub: newLocalGroup(size), taken: make([]bool, size-g.size), name: name, ready: make(chan struct{})}
		gs.open = append(gs.open, p)
		close(gs.changed)
		gs.changed = make(chan struct{})
	}
	if p.size != size {
		g.failGrowLocked(p, fmt.Errorf("%w: rank %d grows to %d ranks, another rank to %d: every rank must pass the same size", ErrMismatch, l.rank, size, p.size))
	} else {
		p.arrived++
		g.completeGrowLocked(p)
	}
	g.mu.Unlock()
	if err := l.waitGrow(ctx, p); err != nil {
		return nil, err
	}
	return &localRendezvous{g: p.sub, rank: l.rank, timeout: l.timeout}, nil
}

// waitGrow waits for p to complete; a member or newcomer that gives up
// fails it for everyone, who must not get a group without it.
func (l *localRendezvous) waitGrow(ctx context.Context, p *localGrow) error {
	g := l.g
	err := l.wait(ctx, p.ready, func() string {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.growMissingLocked(p)
	})
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil && !p.finished {
		g.failGrowLocked(p, err)
	}
	return p.err
}

// JoinLocal makes a newcomer of an in-process communicator: a goroutine
// that joins the Grow of the communicator of which of is a rank (any
// rank's Comm will do), as Join does for processes. rank is the rank it
// asks for in the grown communicator, from of.Size() on, or AnyRank. It
// waits for the ranks to call Grow (at most of's timeout) and returns its
// Comm of the grown communicator, made with cfg.
func JoinLocal(ctx context.Context, of *Comm, rank int, cfg *Config) (*Comm, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	l, ok := of.rv.(*localRendezvous)
	if !ok {
		return nil, invalid("JoinLocal grows in-process communicators; a process joins a job's Grow with Join")
	}
	if rank != AnyRank && rank < of.size {
		return nil, invalid("a newcomer asks for a rank from %d (after the communicator's) or AnyRank, not %d", of.size, rank)
	}
	g := l.g
	waiter := &localRendezvous{g: g, timeout: l.timeout}
	timer, stop := waiter.timer()
	defer stop()
	g.mu.Lock()
	var p *localGrow
	slot := -1
	for p == nil {
		gs := g.growsLocked()
		var refusals []string
		for _, o := range gs.open {
			switch {
			case o.filled == len(o.taken):
			case rank != AnyRank && rank >= o.size:
				refusals = append(refusals, fmt.Sprintf("the communicator grows to %d ranks, so rank %d is outside it", o.size, rank))
			case rank != AnyRank && o.taken[rank-g.size]:
				refusals = append(refusals, fmt.Sprintf("rank %d is taken", rank))
			case p == nil && rank != AnyRank:
				p, slot = o, rank-g.size
			case p == nil:
				p, slot = o, slices.Index(o.taken, false)
			}
		}
		if p != nil {
			break
		}
		if len(refusals) > 0 {
			g.mu.Unlock()
			return nil, fmt.Errorf("%w: newcomer asking for rank %d: %s", ErrMismatch, rank, refusals[0])
		}
		changed := gs.changed
		g.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer:
			return nil, fmt.Errorf("%w: after %v, no rank of the %d-rank communicator called Grow", ErrTimeout, l.timeout, g.size)
		}
		g.mu.Lock()
	}
	p.taken[slot] = true
	p.filled++
	g.completeGrowLocked(p)
	g.mu.Unlock()
	if err := waiter.waitGrow(ctx, p); err != nil {
		return nil, err
	}
	sub := &localRendezvous{g: p.sub, rank: g.size + slot, timeout: l.timeout}
	return sub.open(ctx, cfg, p.name)
}
