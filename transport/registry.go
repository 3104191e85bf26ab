package transport

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/gccl/gccl/internal/errs"
)

// A Transport connects the ranks of a multi-process job: shared memory
// inside a host, sockets or RDMA between hosts. Each registers itself
// (Register) from its package's init; a communicator's Init then runs them
// in four steps that this package drives:
//
//  1. Prepare: every registered transport Listens (or says why it cannot);
//     the rank publishes the resulting Descriptor.
//  2. The communicator exchanges descriptors through its rendezvous.
//  3. Select picks, for every peer, the first transport in priority order
//     that Reaches it, logging "rank 0 -> 1 via SHM", and a WARN (an error
//     under GCCL_STRICT=1) when a faster transport the pair expected could
//     not be used.
//  4. Connect connects each transport to the peers chosen for it and
//     returns one Mux; once every rank has connected (a barrier), Release
//     frees what only connecting needed.
//
// Adding a transport is one package that implements Transport and calls
// Register, plus its import where the communicator lists the built-in
// transports (comm/transports.go).
type Transport interface {
	// Name is the transport's name in logs and descriptors: "SHM", "TCP".
	Name() string
	// Listen prepares this rank's side for the job: a listening socket, a
	// shared-memory segment, a device's queue pairs. It returns nil, nil
	// when the transport has nothing to do here (no peer it could reach),
	// and an error when it is unusable on this rank; the error's text is
	// the reason a downgrade names ("GCCL_SHM_DISABLE=1").
	Listen(ctx context.Context, s *Setup) (Listener, error)
	// Reach says whether the transport can carry traffic between the ranks
	// of two descriptors (me, then the peer), each holding the transport's
	// address or why it is off there.
	Reach(me, peer *Descriptor) Reach
}

// Reach is a transport's answer for one pair of ranks.
type Reach struct {
	// OK: the transport connects the pair.
	OK bool
	// Expected: the pair would use this transport if it worked (same
	// host for shared memory, a common fabric for RDMA), so not using it
	// is a downgrade, a WARN, and an error under GCCL_STRICT=1.
	Expected bool
	// Why the transport does not connect an expected pair.
	Why string
}

// Listener is a transport's side of one rank while the job connects.
type Listener interface {
	// Addr is what peers need to connect to this rank (published in its
	// Descriptor).
	Addr() []byte
	// Connect connects to peers, the ranks Select chose this transport for,
	// and returns this rank's endpoint to them. The endpoint rings bell
	// whenever a connection changes state and has the Setup's slot size.
	//
	// What a pair needs only to carry traffic (slot rings, queue pairs)
	// should wait for the pair's first Sender or Receiver: a rank talks to
	// a few of its peers (a ring's neighbours, a tree's parent and
	// children), and memory or connections made for every pair at Init
	// grow with the square of the job. Such a first use must not wait for
	// the peer to make the same call (shm: the sender makes the ring and
	// publishes it; the receiver maps it once it is there), because ranks
	// reach their first use of a pair in any order, and a blocking
	// handshake there could deadlock a program whose sends would
	// otherwise be buffered. Per-pair state that must be exchanged goes
	// through Setup.Store, keyed by the pair, which is written once and
	// read when needed.
	Connect(ctx context.Context, bell Bell, peers []*Descriptor) (Endpoint, error)
	// Release frees what only connecting needed (a listening socket, a
	// shared-memory name) once every rank has connected, or the whole
	// listener when Connect was never called. Endpoints stay up.
	Release() error
}

// BellOwner is a Listener that provides the rank's bell, for every
// transport of the rank: shared memory's bell is a futex word that peers in
// other processes ring, so a rank with shared-memory peers sleeps on it.
type BellOwner interface {
	Bell() Bell
}

// Claimer is a Listener that certainly serves some peers (shared memory:
// every peer on its host), so that transports of lower priority need not
// listen for them.
type Claimer interface {
	Claims() []int
}

// Setup is what a transport gets to prepare one rank of a job.
type Setup struct {
	// JobID names the job's resources (shared-memory segments) and derives
	// connection tokens; every rank of the job has the same.
	JobID      string
	Rank, Size int
	// SlotSize and SlotCount size the slot rings of every transport.
	SlotSize, SlotCount int
	// Hosts and Pids are every rank's host identity and process id, from
	// the communicator's first exchange.
	Hosts []string
	Pids  []int
	// LocalRank is this rank's index among the ranks of its host.
	LocalRank int
	// Unclaimed are the peers no higher-priority listener of this rank
	// claims (Claimer); a transport with none to serve may skip listening.
	Unclaimed []int
	// Store is the job's key-value store (the rendezvous's), for what a
	// transport exchanges per pair at Connect (queue pair numbers). It is
	// nil where there is no rendezvous.
	Store Store
	// Getenv reads the environment (GCCL_SHM_DISABLE, GCCL_SOCKET_IFNAME,
	// ...).
	Getenv func(string) string
	// Logger receives the transports' own logs.
	Logger *slog.Logger
}

// Store is a key-value store shared by the ranks of a job: Set publishes a
// value, Get waits until some rank has set the key (bootstrap.Client).
type Store interface {
	Set(ctx context.Context, key string, value []byte) error
	Get(ctx context.Context, key string) ([]byte, error)
}

// SameHost lists the ranks on this rank's host, itself excluded.
func (s *Setup) SameHost() []int {
	var out []int
	for p, h := range s.Hosts {
		if p != s.Rank && h == s.Hosts[s.Rank] {
			out = append(out, p)
		}
	}
	return out
}

type registration struct {
	t        Transport
	priority int
	id       uint64
}

var registry struct {
	mu   sync.Mutex
	list []registration // by priority, then registration order
	next uint64
}

// Register adds t to the transports every multi-process communicator
// tries, before those of a higher priority number (NVLink 0, SHM 10,
// IB 20, TCP 30, by convention). It returns a function that removes it
// again (tests).
func Register(t Transport, priority int) (unregister func()) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	registry.next++
	id := registry.next
	registry.list = append(registry.list, registration{t: t, priority: priority, id: id})
	slices.SortStableFunc(registry.list, func(a, b registration) int { return cmp.Compare(a.priority, b.priority) })
	return func() {
		registry.mu.Lock()
		defer registry.mu.Unlock()
		registry.list = slices.DeleteFunc(registry.list, func(r registration) bool { return r.id == id })
	}
}

// Registered lists the registered transports, highest priority first.
func Registered() []Transport {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	out := make([]Transport, len(registry.list))
	for i, r := range registry.list {
		out[i] = r.t
	}
	return out
}

// Prepared is one rank's transports between Prepare and Connect.
type Prepared struct {
	setup      Setup
	transports []Transport
	listeners  []Listener // by transport; nil where it does not listen
	me         Descriptor
	eps        []Endpoint
	done       bool
}

// Prepare runs every registered transport's Listen for rank s.Rank, in
// priority order, and returns the rank's descriptor in the result.
func Prepare(ctx context.Context, s Setup) (*Prepared, error) {
	if s.Size < 1 || s.Rank < 0 || s.Rank >= s.Size || len(s.Hosts) != s.Size || len(s.Pids) != s.Size {
		return nil, fmt.Errorf("transport: rank %d of %d with %d hosts and %d pids", s.Rank, s.Size, len(s.Hosts), len(s.Pids))
	}
	if s.Getenv == nil {
		return nil, errors.New("transport: Setup.Getenv is nil")
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	ts := Registered()
	p := &Prepared{setup: s, transports: ts, listeners: make([]Listener, len(ts)),
		me: Descriptor{Rank: s.Rank, Host: s.Hosts[s.Rank], Pid: s.Pids[s.Rank]}}
	claimed := make([]bool, s.Size)
	for i, t := range ts {
		st := s
		for q := range s.Size {
			if q != s.Rank && !claimed[q] {
				st.Unclaimed = append(st.Unclaimed, q)
			}
		}
		l, err := t.Listen(ctx, &st)
		switch {
		case err != nil:
			p.me.set(t.Name(), nil, err.Error())
			continue
		case l == nil:
			continue
		}
		p.listeners[i] = l
		p.me.set(t.Name(), l.Addr(), "")
		if c, ok := l.(Claimer); ok {
			for _, q := range c.Claims() {
				if q >= 0 && q < s.Size {
					claimed[q] = true
				}
			}
		}
	}
	return p, nil
}

// Descriptor is what the rank publishes: one entry per transport.
func (p *Prepared) Descriptor() []byte { return p.me.marshalEntries() }

// Selection is the transport chosen for every peer, with the log lines
// that explain it.
type Selection struct {
	// Via is the transport's index (in Prepared's list) for each peer, -1
	// for this rank.
	via   []int
	peers []*Descriptor
	names []string
	// Infos are "rank 0 -> 1 via SHM" lines (INFO); Downgrades are pairs
	// that use a slower transport than they expected, with the reason
	// (WARN).
	Infos, Downgrades []string
}

// Via names the transport chosen for peer ("" for this rank).
func (s *Selection) Via(peer int) string {
	if peer < 0 || peer >= len(s.via) || s.via[peer] < 0 {
		return ""
	}
	return s.names[s.via[peer]]
}

// Select parses every rank's descriptor (entries, by rank; this rank's
// own included) and picks a transport for each peer (SelectRoutes).
func (p *Prepared) Select(entries [][]byte, strict bool) (*Selection, error) {
	s := &p.setup
	if len(entries) != s.Size {
		return nil, fmt.Errorf("transport: %d descriptors for %d ranks", len(entries), s.Size)
	}
	descs := make([]*Descriptor, s.Size)
	for q, b := range entries {
		d, err := ParseDescriptor(q, s.Hosts[q], s.Pids[q], b)
		if err != nil {
			return nil, fmt.Errorf("transport: rank %d's descriptor: %w", q, err)
		}
		descs[q] = d
	}
	return SelectRoutes(s.Rank, descs, p.transports, strict)
}

// SelectRoutes picks, for rank me, a transport for each peer: the first of
// ts (in priority order) that reaches it. A peer no transport reaches, or
// under strict (GCCL_STRICT=1) any downgrade, is an ErrNotSupported naming
// the pair and the reasons. It is pure: descriptors in, choice out.
func SelectRoutes(me int, descs []*Descriptor, ts []Transport, strict bool) (*Selection, error) {
	sel := &Selection{via: make([]int, len(descs)), peers: descs, names: make([]string, len(ts))}
	for i, t := range ts {
		sel.names[i] = t.Name()
	}
	mine := descs[me]
	for q := range descs {
		sel.via[q] = -1
		if q == me {
			continue
		}
		var missed []string // expected transports that could not be used, with why
		var tried []string
		for i, t := range ts {
			r := t.Reach(mine, descs[q])
			if r.OK {
				sel.via[q] = i
				break
			}
			if r.Expected {
				missed = append(missed, fmt.Sprintf("%s: %s", t.Name(), r.Why))
			}
			if r.Why != "" {
				tried = append(tried, fmt.Sprintf("%s: %s", t.Name(), r.Why))
			}
		}
		if sel.via[q] < 0 {
			why := "no transport in common"
			if len(tried) > 0 {
				why = strings.Join(tried, "; ")
			}
			return nil, fmt.Errorf("%w: no transport reaches rank %d (host %s) from rank %d (host %s): %s",
				errs.ErrNotSupported, q, descs[q].Host, me, mine.Host, why)
		}
		name := sel.names[sel.via[q]]
		sel.Infos = append(sel.Infos, fmt.Sprintf("rank %d -> %d via %s", me, q, name))
		for _, m := range missed {
			exp, why, _ := strings.Cut(m, ": ")
			sel.Downgrades = append(sel.Downgrades, fmt.Sprintf("rank %d -> %d via %s instead of %s (%s)", me, q, name, exp, why))
		}
	}
	if strict && len(sel.Downgrades) > 0 {
		return nil, fmt.Errorf("%w: GCCL_STRICT=1 forbids a downgrade: %s", errs.ErrNotSupported, strings.Join(sel.Downgrades, "; "))
	}
	return sel, nil
}

// Connect connects every transport to the peers sel chose for it and
// returns the rank's Mux. The rank's bell is the one of a BellOwner
// listener that serves peers, else a Doorbell. Listeners that serve no
// peer are released at once.
func (p *Prepared) Connect(ctx context.Context, sel *Selection) (*Mux, error) {
	s := &p.setup
	var bell Bell
	groups := make([][]*Descriptor, len(p.transports))
	for q, i := range sel.via {
		if i >= 0 {
			groups[i] = append(groups[i], sel.peers[q])
		}
	}
	for i, l := range p.listeners {
		if l == nil {
			continue
		}
		if len(groups[i]) == 0 {
			l.Release()
			p.listeners[i] = nil
			continue
		}
		if b, ok := l.(BellOwner); ok && bell == nil {
			bell = b.Bell()
		}
	}
	if bell == nil {
		bell = NewDoorbell()
	}
	routes := make([]Endpoint, s.Size)
	for i, peers := range groups {
		if len(peers) == 0 {
			continue
		}
		l := p.listeners[i]
		if l == nil {
			return nil, fmt.Errorf("transport: rank %d chose %s for rank %d but does not listen on it", s.Rank, sel.names[i], peers[0].Rank)
		}
		ep, err := l.Connect(ctx, bell, peers)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sel.names[i], err)
		}
		p.eps = append(p.eps, ep)
		for _, d := range peers {
			routes[d.Rank] = ep
		}
	}
	return NewMux(s.Rank, s.Size, s.SlotSize, bell, routes)
}

// Release frees what only connecting needed, once every rank has
// connected (after a barrier: a peer may still be mapping this rank's
// shared memory until then).
func (p *Prepared) Release() {
	if p.done {
		return
	}
	p.done = true
	for _, l := range p.listeners {
		if l != nil {
			l.Release()
		}
	}
}

// Abort undoes a Prepare or Connect that will not complete: endpoints
// made so far are aborted with err (their peers learn why) and listeners
// released.
func (p *Prepared) Abort(err error) {
	for _, ep := range p.eps {
		ep.Abort(err)
	}
	p.eps = nil
	p.Release()
}
