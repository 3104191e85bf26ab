package comm

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/gccl/gccl/transport/inproc"
)

// localRendezvous is the rendezvous of ranks that are goroutines of one
// process (InitLocal, and the Splits and Shrinks of such communicators):
// the ranks of a group meet in a shared localGroupState, where each
// exchange, split and shrink is a record found by its number, which every
// rank counts alike.
type localRendezvous struct {
	g       *localGroupState
	rank    int
	timeout time.Duration // the communicator's: how long an exchange waits
	// This rank's calls so far, which number the records.
	gathers, splits, shrinks, grows uint64
}

// localGroupState is what the ranks of one in-process group share.
type localGroupState struct {
	size  int
	comms localGroup // the group's communicators, for the watchdog

	mu      sync.Mutex
	world   *inproc.World // their endpoints, made by the first open
	rounds  map[uint64]*localRound
	splits  map[splitKey]*localGroupState
	taken   map[splitKey]int // members of a split that took their group so far
	shrinks map[uint64]*pendingShrink
	grows   localGrows // grow_local.go
	closed  int        // members closed
}

type splitKey struct {
	seq   uint64
	color int
}

func newLocalGroup(n int) *localGroupState {
	return &localGroupState{size: n, comms: make(localGroup, n), rounds: map[uint64]*localRound{},
		splits: map[splitKey]*localGroupState{}, taken: map[splitKey]int{}, shrinks: map[uint64]*pendingShrink{}}
}

// localRound is one all-gather of a group, until every rank has taken the
// result.
type localRound struct {
	data    [][]byte
	arrived int
	done    chan struct{}
}

func (l *localRendezvous) allGather(ctx context.Context, mine []byte) ([][]byte, error) {
	l.gathers++
	g := l.g
	g.mu.Lock()
	r := g.rounds[l.gathers]
	if r == nil {
		r = &localRound{data: make([][]byte, g.size), done: make(chan struct{})}
		g.rounds[l.gathers] = r
	}
	r.data[l.rank] = slices.Clone(mine)
	if r.arrived++; r.arrived == g.size {
		delete(g.rounds, l.gathers)
		close(r.done)
	}
	g.mu.Unlock()
	if err := l.wait(ctx, r.done, func() string {
		g.mu.Lock()
		defer g.mu.Unlock()
		return fmt.Sprintf("%d of the %d ranks have called", r.arrived, g.size)
	}); err != nil {
		return nil, err
	}
	return slices.Clone(r.data), nil
}

// timer fires after the communicator's timeout (never without one).
func (l *localRendezvous) timer() (<-chan time.Time, func()) {
	if l.timeout <= 0 {
		return nil, func() {}
	}
	t := time.NewTimer(l.timeout)
	return t.C, func() { t.Stop() }
}

// wait waits for done, ctx or the timeout; progress says how far the
// others got, for the timeout's error.
func (l *localRendezvous) wait(ctx context.Context, done <-chan struct{}, progress func() string) error {
	timer, stop := l.timer()
	defer stop()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-timer:
		return fmt.Errorf("%w: after %v, %s", ErrTimeout, l.timeout, progress())
	}
}

func (l *localRendezvous) split(ctx context.Context, color, key int) (rendezvous, error) {
	var mine [16]byte
	binary.LittleEndian.PutUint64(mine[:], uint64(int64(color)))
	binary.LittleEndian.PutUint64(mine[8:], uint64(int64(key)))
	all, err := l.allGather(ctx, mine[:])
	if err != nil {
		return nil, err
	}
	l.splits++
	if color == NoColor {
		return nil, nil
	}
	var members []int
	keys := make([]int64, len(all))
	for r, b := range all {
		keys[r] = int64(binary.LittleEndian.Uint64(b[8:]))
		if int64(binary.LittleEndian.Uint64(b)) == int64(color) {
			members = append(members, r)
		}
	}
	sort.SliceStable(members, func(i, j int) bool { return keys[members[i]] < keys[members[j]] })
	newRank := slices.Index(members, l.rank)
	g := l.g
	k := splitKey{l.splits, color}
	g.mu.Lock()
	sub := g.splits[k]
	if sub == nil {
		sub = newLocalGroup(len(members))
		g.splits[k] = sub
	}
	if g.taken[k]++; g.taken[k] == len(members) {
		delete(g.splits, k)
		delete(g.taken, k)
	}
	g.mu.Unlock()
	return &localRendezvous{g: sub, rank: newRank, timeout: l.timeout}, nil
}

// pendingShrink is an in-process Shrink until every survivor has arrived;
// when the survivors disagreed, until the parent group's last rank closes
// (latecomers to a failed shrink must fail too, and nobody knows how many
// will come).
type pendingShrink struct {
	out     []bool // the first caller's exclusions
	sub     *localGroupState
	arrived int           // calls so far
	gaveUp  int           // of those, the ones that stopped waiting
	ready   chan struct{} // closed when every survivor arrived, or on err
	err     error
}

func (l *localRendezvous) shrink(ctx context.Context, exclude []int) (rendezvous, error) {
	// Numbered before any check, so that a rank whose call is refused stays
	// in step with the others for the next attempt.
	l.shrinks++
	g := l.g
	out, err := shrinkSet(l.rank, g.size, exclude)
	if err != nil {
		return nil, err
	}
	survivors, newRank := 0, 0
	for r, x := range out {
		if !x {
			if r == l.rank {
				newRank = survivors
			}
			survivors++
		}
	}
	k := l.shrinks
	g.mu.Lock()
	p := g.shrinks[k]
	if p == nil {
		p = &pendingShrink{out: out, sub: newLocalGroup(survivors), ready: make(chan struct{})}
		g.shrinks[k] = p
	}
	switch {
	case p.err != nil:
	case !slices.Equal(p.out, out):
		p.err = fmt.Errorf("%w: rank %d excludes ranks %v, another rank excludes %v: every survivor must pass the same list",
			ErrMismatch, l.rank, setRanks(out), setRanks(p.out))
		close(p.ready)
	default:
		if p.arrived++; p.arrived-p.gaveUp == p.sub.size {
			delete(g.shrinks, k)
			close(p.ready)
		}
	}
	g.mu.Unlock()

	timer, stop := l.timer()
	defer stop()
	select {
	case <-p.ready:
	case <-ctx.Done():
		if _, _, ok := g.withdraw(p, k); ok {
			return nil, ctx.Err()
		}
	case <-timer:
		if arrived, gaveUp, ok := g.withdraw(p, k); ok {
			err := fmt.Errorf("%w: after %v, %d of the %d survivors have called Shrink", ErrTimeout, l.timeout, arrived, p.sub.size)
			if gaveUp > 0 {
				err = fmt.Errorf("%w (%d of them gave up before the others came)", err, gaveUp)
			}
			return nil, err
		}
	}
	// Every survivor arrived, or they disagreed.
	if p.err != nil {
		return nil, p.err
	}
	return &localRendezvous{g: p.sub, rank: newRank, timeout: l.timeout}, nil
}

// withdraw takes back the arrival of a survivor that gives up waiting, so
// that one arriving later waits for the others (and fails) rather than
// getting a communicator whose members are gone; the last to leave removes
// the record. It returns how many survivors had called Shrink and how many
// of them gave up before this one, and false when it is too late: every
// survivor arrived, or they disagreed, meanwhile.
func (g *localGroupState) withdraw(p *pendingShrink, k uint64) (arrived, gaveUp int, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-p.ready:
		return p.arrived, p.gaveUp, false
	default:
	}
	arrived, gaveUp = p.arrived, p.gaveUp
	if p.gaveUp++; p.gaveUp == p.arrived {
		delete(g.shrinks, k)
	}
	return arrived, gaveUp, true
}

// shrinkSet checks an in-process Shrink's exclusion list (the rendezvous
// server checks a remote one) and returns it as a set.
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

func setRanks(set []bool) []int {
	var out []int
	for r, x := range set {
		if x {
			out = append(out, r)
		}
	}
	return out
}

// open makes the rank's communicator over the group's in-process world,
// which the first member to open makes, and registers it with the group's
// watchdog.
func (l *localRendezvous) open(ctx context.Context, cfg *Config, name string) (*Comm, error) {
	g := l.g
	g.mu.Lock()
	if g.world == nil {
		w, err := inproc.NewWorld(g.size, cfg.SlotSize, cfg.SlotCount)
		if err != nil {
			g.mu.Unlock()
			return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
		}
		g.world = w
	}
	w := g.world
	g.mu.Unlock()
	c, err := newComm(w.Endpoint(l.rank), cfg)
	if err != nil {
		return nil, err
	}
	l.timeout = c.timeout
	c.rv = l
	g.comms[l.rank].Store(c)
	return c, nil
}

// Symmetric memory of in-process ranks is heap memory, which peers reach
// by name through this table until the Alloc's last round unlinks it.
var heapSyms struct {
	sync.Mutex
	next uint64
	m    map[string][]byte
}

// heapSym is a rank's heap memory of an Alloc, or a peer's view of it.
type heapSym struct {
	name string
	b    []byte
}

func (h *heapSym) Bytes() []byte { return h.b }
func (h *heapSym) Name() string  { return h.name }
func (h *heapSym) Close() error  { return nil }

func (h *heapSym) Unlink() error {
	heapSyms.Lock()
	defer heapSyms.Unlock()
	delete(heapSyms.m, h.name)
	return nil
}

func (l *localRendezvous) allocSym(c *Comm, size int) (symMem, error) {
	heapSyms.Lock()
	defer heapSyms.Unlock()
	if heapSyms.m == nil {
		heapSyms.m = map[string][]byte{}
	}
	heapSyms.next++
	h := &heapSym{name: "heap-" + strconv.FormatUint(heapSyms.next, 10), b: make([]byte, size)}
	heapSyms.m[h.name] = h.b
	return h, nil
}

func (l *localRendezvous) mapSym(c *Comm, peer int, name string, size int) (symMem, error) {
	heapSyms.Lock()
	defer heapSyms.Unlock()
	b, ok := heapSyms.m[name]
	if !ok || len(b) != size {
		return nil, fmt.Errorf("rank %d's symmetric memory %q is gone", peer, name)
	}
	return &heapSym{name: name, b: b}, nil
}

func (l *localRendezvous) laggards(c *Comm, seq uint64) ([]int, error) {
	return l.g.comms.laggards(seq)
}

// close counts the rank out; when the group's last rank closes, no rank of
// it can call Shrink again, so failed shrinks kept for latecomers go.
func (l *localRendezvous) close() error {
	g := l.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed++; g.closed == g.size {
		clear(g.shrinks)
	}
	return nil
}
