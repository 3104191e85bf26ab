package bootstrap

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	pb "github.com/gccl/gccl/bootstrap/bootstrappb"
)

// NoColor passed to Split leaves the rank out of every new group (NCCL's
// NCCL_SPLIT_NOCOLOR).
const NoColor = -1

// Names of the collective calls, sent with each round so that ranks that
// call them in different orders get an error instead of a hang.
const (
	opAllGather = "AllGather"
	opBarrier   = "Barrier"
	opSplit     = "Split"
	opShrink    = "Shrink"
)

// AllGather contributes data and returns every rank's contribution, indexed
// by rank in the client's group, once all of them contributed. Every rank of
// the group calls it (and Barrier and Split) in the same order; each call is
// one RPC.
func (c *Client) AllGather(ctx context.Context, data []byte) ([][]byte, error) {
	_, all, err := c.collective(ctx, opAllGather, data)
	return all, err
}

// Barrier returns once every rank of the client's group called it.
func (c *Client) Barrier(ctx context.Context) error {
	_, _, err := c.collective(ctx, opBarrier, nil)
	return err
}

// Split makes a Client for a new group of the ranks that pass the same
// color, ordered by key and then by rank in c's group, as MPI_Comm_split and
// ncclCommSplit do. Every rank of c's group calls it; a rank that passes
// NoColor gets nil, nil. The new Client shares c's connection; its keys,
// collective calls and notices are separate from c's and from other
// groups'.
func (c *Client) Split(ctx context.Context, color, key int) (*Client, error) {
	what := fmt.Sprintf("split(color %d, key %d)", color, key)
	if color < 0 && color != NoColor {
		return nil, fmt.Errorf("gccl bootstrap: %s: %w: color must be >= 0 or NoColor", c.describe(what), ErrInvalidArgument)
	}
	mine, err := proto.Marshal(&pb.SplitContribution{Color: int64(color), Key: int64(key)})
	if err != nil {
		return nil, fmt.Errorf("gccl bootstrap: %s: %w", c.describe(what), err)
	}
	seq, all, err := c.collective(ctx, opSplit, mine)
	if err != nil {
		return nil, err
	}
	groupRanks, err := splitGroup(all, c.rank)
	if err != nil {
		return nil, fmt.Errorf("gccl bootstrap: %s: %w", c.describe(what), err)
	}
	if color == NoColor {
		return nil, nil
	}
	sub := &Client{
		sess:    c.sess,
		size:    len(groupRanks),
		group:   fmt.Sprintf("%s/%d.%d", c.group, seq, color), // unique: seq is unique within c's group
		members: make([]int32, len(groupRanks)),
		lost:    make(chan Notice, cap(c.lost)),
	}
	for i, r := range groupRanks {
		sub.members[i] = int32(c.jobRank(r))
		if r == c.rank {
			sub.rank = i
		}
	}
	if err := c.sess.open(sub); err != nil {
		return nil, fmt.Errorf("gccl bootstrap: %s: %w", c.describe(what), err)
	}
	return sub, nil
}

// Shrink makes a Client for the ranks of c's group that are not in exclude
// (ranks of c's group), in the same order, as ncclCommShrink does: the way
// on after ranks die. Every rank not excluded calls it with the same list,
// in the same order relative to its other Shrink calls on c; excluded ranks
// do not call it and may be gone. Unlike Split it needs nothing from them,
// and it works after c's group was aborted. Ranks that pass different lists
// all get an error. The rendezvous must survive: a job whose rendezvous ran
// on an excluded rank cannot shrink.
func (c *Client) Shrink(ctx context.Context, exclude []int) (*Client, error) {
	// Numbered before any check, so that a rank whose call is refused
	// stays in step with the others for the next attempt.
	n := c.shrinks.Add(1)
	what := fmt.Sprintf("shrink #%d (excluding ranks %v)", n, exclude)
	if err := c.usable(what); err != nil {
		return nil, err
	}
	out := make([]bool, c.size)
	for _, r := range exclude {
		switch {
		case r < 0 || r >= c.size:
			return nil, fmt.Errorf("gccl bootstrap: %s: %w: rank %d is outside 0..%d", c.describe(what), ErrInvalidArgument, r, c.size-1)
		case out[r]:
			return nil, fmt.Errorf("gccl bootstrap: %s: %w: rank %d is listed twice", c.describe(what), ErrInvalidArgument, r)
		}
		out[r] = true
	}
	if out[c.rank] {
		return nil, fmt.Errorf("gccl bootstrap: %s: %w: this rank excludes itself (excluded ranks do not call Shrink)", c.describe(what), ErrInvalidArgument)
	}
	sub := &Client{
		sess:  c.sess,
		group: fmt.Sprintf("%s/x%d", c.group, n), // unique: n is unique within c's group
		lost:  make(chan Notice, cap(c.lost)),
	}
	for r := range c.size {
		if out[r] {
			continue
		}
		if r == c.rank {
			sub.rank = len(sub.members)
		}
		sub.members = append(sub.members, int32(c.jobRank(r)))
	}
	sub.size = len(sub.members)
	if err := c.sess.open(sub); err != nil {
		return nil, fmt.Errorf("gccl bootstrap: %s: %w", c.describe(what), err)
	}
	// The rendezvous checks that every member of the new group names the
	// same members, and this returns once all of them have.
	if _, _, err := sub.collective(ctx, opShrink, nil); err != nil {
		sub.Close()
		return nil, err
	}
	return sub, nil
}

// open registers a new client of the session: its Lost channel gets the
// notices that concern it, and it keeps the connection up until it closes.
func (s *session) open(c *Client) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil || s.leaving.Load() {
		return ErrClosed
	}
	s.watchers[c] = true
	return nil
}

// splitGroup decodes the Split contributions of a group (indexed by group
// rank) and returns the group ranks that share self's color, ordered by
// (key, rank); nil when self passed NoColor.
func splitGroup(contributions [][]byte, self int) ([]int, error) {
	if self < 0 || self >= len(contributions) {
		return nil, fmt.Errorf("%w: rank %d missing from %d Split contributions", ErrInvalidArgument, self, len(contributions))
	}
	type entry struct {
		rank       int
		color, key int64
	}
	entries := make([]entry, len(contributions))
	for r, b := range contributions {
		var sc pb.SplitContribution
		if err := proto.Unmarshal(b, &sc); err != nil {
			return nil, fmt.Errorf("%w: rank %d sent a malformed Split contribution: %v", ErrInvalidArgument, r, err)
		}
		if sc.Color < 0 && sc.Color != NoColor {
			return nil, fmt.Errorf("%w: rank %d sent Split color %d", ErrInvalidArgument, r, sc.Color)
		}
		entries[r] = entry{rank: r, color: sc.Color, key: sc.Key}
	}
	color := entries[self].color
	if color == NoColor {
		return nil, nil
	}
	var group []entry
	for _, e := range entries {
		if e.color == color {
			group = append(group, e)
		}
	}
	slices.SortFunc(group, func(a, b entry) int {
		return cmp.Or(cmp.Compare(a.key, b.key), cmp.Compare(a.rank, b.rank))
	})
	out := make([]int, len(group))
	for i, e := range group {
		out[i] = e.rank
	}
	return out, nil
}

// collective makes one collective call of the client's group and returns its
// sequence number and, for AllGather and Split, every member's data.
func (c *Client) collective(ctx context.Context, op string, data []byte) (uint64, [][]byte, error) {
	seq := c.seq.Add(1)
	what := fmt.Sprintf("%s #%d", op, seq)
	if err := c.usable(what); err != nil {
		return seq, nil, err
	}
	rctx, done, timeoutMs := c.sess.blockingContext(ctx)
	defer done()
	round := &pb.Round{Group: c.group, Seq: seq, Op: op, Members: c.members, TimeoutMs: timeoutMs}
	if op == opBarrier {
		if _, err := c.sess.rpc.Barrier(rctx, &pb.BarrierRequest{Rank: c.sess.rank, Round: round}); err != nil {
			return seq, nil, c.sess.callError(ctx, c.describe(what), err)
		}
		return seq, nil, nil
	}
	resp, err := c.sess.rpc.AllGather(rctx, &pb.AllGatherRequest{Rank: c.sess.rank, Round: round, Data: data})
	if err != nil {
		return seq, nil, c.sess.callError(ctx, c.describe(what), err)
	}
	if len(resp.Data) != c.size {
		return seq, nil, fmt.Errorf("gccl bootstrap: %s: the rendezvous answered %d contributions for %d ranks", c.describe(what), len(resp.Data), c.size)
	}
	return seq, resp.Data, nil
}
