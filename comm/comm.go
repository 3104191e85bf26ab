// Package comm is gccl's public API: communicators and the collectives,
// point-to-point transfers and group calls that run on them.
//
// A Comm is one rank's handle on a group of n ranks. Create communicators
// once per job and reuse them for every iteration; creating them is the
// expensive part. Every rank must issue the same collectives, with the same
// counts, types, ops and roots, in the same order (as with NCCL and MPI);
// gccl checks this on every message and reports ErrMismatch instead of
// computing garbage.
//
// Blocking calls run on the caller's goroutine and allocate nothing in steady
// state. Async calls return a *Request and run, in issue order, on the Comm's
// progress goroutine. A Comm must not be used by two goroutines at once.
//
// Any failure while data moves (a lost peer, a timeout, a cancelled context)
// aborts the Comm: the failing call and every later call return an error,
// and peers waiting on this rank see ErrPeerLost instead of hanging.
package comm

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/algo/hier"
	"github.com/gccl/gccl/algo/tune"
	"github.com/gccl/gccl/bootstrap"
	"github.com/gccl/gccl/internal/logx"
	"github.com/gccl/gccl/internal/units"
	"github.com/gccl/gccl/topo"
	"github.com/gccl/gccl/transport"
	"github.com/gccl/gccl/transport/inproc"
)

// DefaultTimeout bounds how long one operation waits for its peers when the
// Config does not say otherwise.
const DefaultTimeout = 5 * time.Minute

// Config tunes a communicator. The zero value is a good default.
type Config struct {
	// Algo forces an algorithm for the collectives that have several:
	// "ring", "tree", "hier" (hierarchical all-reduce and all-gather for
	// jobs on several hosts; elsewhere it means ring) or "doubling"
	// (recursive doubling for all-reduce, the ring elsewhere). Empty means
	// the tuner chooses; the environment variable GCCL_ALGO is the default.
	Algo string
	// Timeout bounds how long one operation may wait for its peers before it
	// fails with ErrTimeout and aborts the Comm. Zero means DefaultTimeout
	// (or GCCL_TIMEOUT, in seconds); negative means wait forever.
	Timeout time.Duration
	// Watchdog is how long a collective waits before gccl logs which ranks
	// have not reached it (a hang diagnosis; the operation keeps waiting
	// until Timeout). Zero means 10 s (or GCCL_WATCHDOG, in seconds);
	// negative turns it off.
	Watchdog time.Duration
	// SlotSize and SlotCount size the slot rings between ranks: the
	// pipeline chunk, and how many chunks may be in flight per connection.
	// Zero means the transport's default.
	SlotSize, SlotCount int
	// Deterministic makes every reduction (AllReduce, Reduce,
	// ReduceScatter, their Avg and PreMulSum included) return, for a fixed
	// number of ranks, the bits of the rank-order fold
	// (((x0+x1)+x2)+...) of each element, whatever the message's size, the
	// algorithm, the transport or the buffers (the contract in full:
	// determ.go). It costs some speed (docs/PERFORMANCE.md). False means
	// GCCL_DETERMINISTIC decides (1 or true: on). Every rank must agree.
	Deterministic bool
	// Logger receives gccl's logs. Nil means GCCL_DEBUG decides.
	Logger *slog.Logger
	// Bootstrap describes the job for Init. Nil means the environment
	// decides (gccl-run, torchrun, Open MPI, PMI, Slurm).
	Bootstrap *bootstrap.Config
	// TelemetryFile, when set, receives one JSON line per operation
	// (comm/telemetry_file.go); %r in it is the rank, %p the process ID,
	// %h the host name. Empty means GCCL_TELEMETRY_FILE decides.
	TelemetryFile string
}

const (
	stateOpen    int32 = iota
	stateClosing       // Close waits for the async operations queued before it
	stateClosed
	stateAborted
)

// Comm is one rank of a communicator.
type Comm struct {
	rank, size int
	ep         transport.Endpoint
	cfg        Config // as given, for communicators made by Split
	splitSeq   uint64
	shrinkSeq  uint64
	growSeq    uint64
	log        *slog.Logger
	timeout    time.Duration
	watchdog   time.Duration
	algoPref   algo.Algorithm // 0: the tuner decides
	intraNet   bool           // a host's ranks talk over a network transport (intraOverNetwork)

	reached  atomic.Uint64 // sequence number of the last collective entered
	arrivals [arrivalLog]arrival

	state    atomic.Int32
	failure  atomic.Pointer[error]
	busy     atomic.Bool
	released atomic.Bool    // Close released the transport and the rendezvous
	notices  sync.WaitGroup // abort notices on their way to the rendezvous

	// Per-operation state, touched only by the goroutine running an op.
	exec      executor
	args      collArgs
	collSeq   uint64
	sendSeq   []uint64 // p2p messages sent to each peer
	recvSeq   []uint64 // p2p messages received from each peer
	senders   []transport.Sender
	receivers []transport.Receiver
	plans     map[planKey]*algo.Plan
	lastKey   planKey // the latest plan looked up: a loop's calls skip the map
	lastPlan  *algo.Plan
	tmp       []byte
	scratch   []byte // staging for in-place all-to-all
	barrier   [2]byte
	departure [1]byte // this rank's departure in rounds.go: 1 when it failed its share
	p2pState  []p2pProgress
	groupOps  []P2P // a blocking group's copy of its ops, when it has device buffers
	vOps      []P2P // the sends and receives of a variable-size collective (vcoll.go)

	async asyncState
	rv    rendezvous        // Split, Shrink and Alloc's (rendezvous.go)
	boot  *bootstrap.Client // multi-process communicators only
	jobID string            // names shared memory (multi-process only)
	// initPhases: where connect's time went, for Init's last INFO line.
	initPhases string

	// Symmetric memory (symmetric.go): live Alloc regions, and per peer
	// where the running symmetric operation finds its buffers.
	allocSeq   uint32
	symMu      sync.Mutex
	syms       atomic.Pointer[symTable]
	symPeers   []symPeer
	symScratch []byte             // one chunk of a large symmetric all-reduce
	symMsg     [symRecordLen]byte // this rank's arrival record
	symOps     atomic.Uint64      // symmetric all-reduces run (tests, debugging)

	// hier is the placement of the ranks on hosts when the job spans
	// several hosts with the same number of ranks (more than one) on each;
	// nil otherwise.
	hier *hier.Layout
	// multiHost: the ranks are on more than one host (device collectives
	// need one).
	multiHost bool
	// dev is the device collectives' state (devexec.go).
	dev devState
	// Device windows and flag pages (devflags.go).
	winSeq uint32
	winMu  sync.Mutex
	wins   atomic.Pointer[devWinTable]
	flags  atomic.Pointer[flagState]
	// cma is the single-copy path's state (cmaexec.go).
	cma cmaState
	// topo is the job's system graph (multi-process communicators whose
	// hosts could describe themselves), and progressCPUs where the
	// progress goroutine's thread is pinned (empty: not pinned).
	topo         *topo.Job
	progressCPUs []int
	// ringOrder is the ranks in ring order when it is not 0..n-1 (from
	// the topology), and ringPos each rank's position in it.
	ringOrder, ringPos []int
	// tuner is the cost model's choices for this layout (tune.go).
	tuner *tune.Tuner
	// tel is the per-operation records and totals (telemetry.go).
	tel telemetry
}

type planKey struct {
	coll algo.Collective
	alg  algo.Algorithm
	root int
}

// InitLocal creates n communicating ranks inside this process, one Comm per
// rank, like ncclCommInitAll. Each Comm is then used by its own goroutine.
func InitLocal(n int, cfg *Config) ([]*Comm, error) {
	if n < 1 {
		return nil, invalid("InitLocal of %d ranks", n)
	}
	if cfg == nil {
		cfg = &Config{}
	}
	if cfg.SlotSize != 0 || cfg.SlotCount != 0 {
		size, count := cfg.SlotSize, cfg.SlotCount
		if size == 0 {
			size = inproc.DefaultSlotSize
		}
		if count == 0 {
			count = inproc.DefaultSlotCount
		}
		if err := checkSlots(size, count); err != nil {
			return nil, err
		}
	}
	g := newLocalGroup(n)
	comms := make([]*Comm, n)
	for r := range comms {
		c, err := (&localRendezvous{g: g, rank: r}).open(context.Background(), cfg, "")
		if err != nil {
			for _, c := range comms[:r] {
				c.Close()
			}
			return nil, err
		}
		comms[r] = c
	}
	return comms, nil
}

func newComm(ep transport.Endpoint, cfg *Config) (*Comm, error) {
	c := &Comm{
		cfg:       *cfg,
		rank:      ep.Rank(),
		size:      ep.Size(),
		ep:        ep,
		log:       cfg.Logger,
		timeout:   cfg.Timeout,
		sendSeq:   make([]uint64, ep.Size()),
		recvSeq:   make([]uint64, ep.Size()),
		senders:   make([]transport.Sender, ep.Size()),
		receivers: make([]transport.Receiver, ep.Size()),
		symPeers:  make([]symPeer, ep.Size()),
		dev:       devState{peers: make([]devPeer, ep.Size())},
		plans:     map[planKey]*algo.Plan{},
	}
	if c.log == nil {
		c.log = logx.Default()
	}
	c.log = c.log.With("rank", c.rank)
	if c.timeout == 0 {
		c.timeout = DefaultTimeout
		if s := os.Getenv("GCCL_TIMEOUT"); s != "" {
			d, err := units.ParseDuration(s)
			if err != nil {
				return nil, invalid("GCCL_TIMEOUT=%q: %v", s, err)
			}
			c.timeout = d
		}
	}
	c.watchdog = cfg.Watchdog
	if c.watchdog == 0 {
		c.watchdog = 10 * time.Second
		if s := os.Getenv("GCCL_WATCHDOG"); s != "" {
			d, err := units.ParseDuration(s)
			if err != nil {
				return nil, invalid("GCCL_WATCHDOG=%q: %v", s, err)
			}
			c.watchdog = d
		}
	}
	pref := cfg.Algo
	if pref == "" {
		pref = os.Getenv("GCCL_ALGO")
	}
	switch strings.ToLower(pref) {
	case "":
	case "ring":
		c.algoPref = algo.Ring
	case "tree":
		c.algoPref = algo.Tree
	case "hier":
		c.algoPref = algo.Hier
	case "doubling":
		c.algoPref = algo.Doubling
	default:
		return nil, invalid("unknown algorithm %q (want ring, tree, hier or doubling)", pref)
	}
	det, err := deterministic(cfg)
	if err != nil {
		return nil, err
	}
	c.cfg.Deterministic = det
	c.retune(nil)
	// Tmp holds one chunk per block; trees use two blocks.
	c.tmp = make([]byte, 2*ep.SlotSize())
	c.exec.c = c
	c.initTelemetry(cfg)
	c.log.Debug("communicator ready", "subsys", "INIT", "size", c.size, "transport", ep.Name())
	return c, nil
}

// Rank returns this rank's number, in [0, Size()).
func (c *Comm) Rank() int { return c.rank }

// Size returns the number of ranks.
func (c *Comm) Size() int { return c.size }

// chunkElems is the pipeline chunk, in elements of esz bytes.
func (c *Comm) chunkElems(esz int) int { return c.ep.SlotSize() / esz }

func (c *Comm) sender(peer int) (transport.Sender, error) {
	if s := c.senders[peer]; s != nil {
		return s, nil
	}
	s, err := c.ep.Sender(peer)
	if err != nil {
		return nil, err
	}
	c.senders[peer] = s
	if c.boot == nil {
		// Multi-process communicators log their routes once, at Init.
		c.log.Info(fmt.Sprintf("rank %d -> %d via %s", c.rank, peer, transport.Via(c.ep, peer)), "subsys", "INIT")
	}
	return s, nil
}

func (c *Comm) receiver(peer int) (transport.Receiver, error) {
	if r := c.receivers[peer]; r != nil {
		return r, nil
	}
	r, err := c.ep.Receiver(peer)
	if err != nil {
		return nil, err
	}
	c.receivers[peer] = r
	return r, nil
}

// closedErr is the error for a call on a Comm that is no longer open.
func (c *Comm) closedErr() error {
	if c.state.Load() == stateAborted {
		if p := c.failure.Load(); p != nil && *p != nil {
			return fmt.Errorf("%w: %w", ErrAborted, *p)
		}
		return ErrAborted
	}
	return ErrClosed
}

// fail aborts the Comm after err, keeping the first failure as the reason,
// and tells the other ranks.
func (c *Comm) fail(err error) { c.abortWith(err, true) }

func (c *Comm) abortWith(err error, announce bool) {
	first := c.failure.CompareAndSwap(nil, &err)
	if first {
		c.log.Warn("communicator aborted", "subsys", "COLL", "err", err)
	}
	c.state.Store(stateAborted)
	c.ep.Abort(err)
	c.releaseFlags() // this rank's stream must not wait for peers that may be gone
	if first && announce && c.boot != nil {
		// Tell every rank through the rendezvous too: peers that wait on
		// others (or on shared memory, which has no EOF) fail at once.
		c.notices.Add(1)
		go func() {
			defer c.notices.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c.boot.Abort(ctx, fmt.Sprintf("rank %d: %v", c.rank, err))
		}()
	}
}

// running reports whether operations may still run: the Comm is open, or
// closing while the async operations queued before Close finish.
func (c *Comm) running() bool {
	s := c.state.Load()
	return s == stateOpen || s == stateClosing
}

// Abort stops the Comm at once: operations in flight and later calls fail,
// and peers waiting on this rank see ErrPeerLost. It is safe to call from any
// goroutine, at any time, more than once; during a Close it fails the
// operations that Close waits for, so Close returns.
func (c *Comm) Abort(err error) {
	if err == nil {
		err = ErrAborted
	}
	if !c.running() {
		return
	}
	c.fail(err)
	c.async.stop(c)
}

// Err reports whether the Comm can still run operations: nil while it is
// open; once it aborted, ErrAborted wrapping the first failure (an
// operation's error, a peer the rendezvous declared lost, or Abort's
// argument); once it is closing or closed, ErrClosed. It is this rank's
// view: a peer's failure shows once this rank hears of it, from a transport
// or from the rendezvous. Like ncclCommGetAsyncError, it lets a training
// loop notice between collectives that a peer died, and Shrink or stop.
// It is safe to call from any goroutine.
func (c *Comm) Err() error {
	if c.state.Load() == stateOpen {
		return nil
	}
	return c.closedErr()
}

// Close waits for the async operations issued before it (they run to
// completion; later calls fail with ErrClosed), then releases the Comm:
// its transport, symmetric memory, goroutines and rendezvous connection,
// also after an abort. Peers that still expect data from this rank see
// ErrPeerLost. Close is not a collective: each rank closes its own Comm.
// Calls after the first return nil.
func (c *Comm) Close() error {
	if c.state.CompareAndSwap(stateOpen, stateClosing) {
		c.async.drain()
		c.state.CompareAndSwap(stateClosing, stateClosed)
	}
	if !c.released.CompareAndSwap(false, true) {
		return nil
	}
	// Symmetric memory goes once no async operation can touch it.
	c.async.stop(c)
	c.telClose()
	c.closeFlags()
	c.freeAllSym()
	err := c.ep.Close()
	// An abort notice leaves through the rendezvous connection: let it
	// go first (it gives up after 5 s).
	c.notices.Wait()
	if rerr := c.rv.close(); err == nil {
		err = rerr
	}
	return err
}

// enter marks the Comm busy for one operation issued on the caller's goroutine.
func (c *Comm) enter() error {
	if c.state.Load() != stateOpen {
		return c.closedErr()
	}
	if !c.busy.CompareAndSwap(false, true) {
		return ErrConcurrentUse
	}
	return nil
}

func (c *Comm) leave() { c.busy.Store(false) }

// Via names the transport that carries this rank's traffic to peer:
// "INPROC", "SHM" or "TCP".
func (c *Comm) Via(peer int) string { return transport.Via(c.ep, peer) }
