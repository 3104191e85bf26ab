// Package tcp connects ranks on hosts without RDMA: each pair of ranks talks
// over a few TCP sockets (streams), and messages of at least 256 KiB are
// striped across them.
//
// A rank calls Listen, publishes Listener.Addr through the bootstrap, then
// calls ConnectLazy (or Connect) with every rank's address and the peers it
// may need. A pair connects at its first use, or within Connect for every
// peer (see connect.go): the lower rank dials, and both sides prove they
// hold the job token (HMAC challenge-response, so the token never crosses
// the wire).
//
// The data path follows transport's slot model, and the rank's own goroutine
// moves the data. A Sender hands out local staging slots; Commit writes the
// slot straight to the socket when the socket has room. A Receiver's
// messages land straight in local receive slots: TryNext reads the socket
// itself (non-blocking) when nothing is buffered, so a rank that spins
// waiting for a message gets it with no goroutine or thread hop. A full set
// of receive slots stops the reading, which pushes back on the sender
// through TCP flow control. The halves also take the caller's memory
// (transport.RefSender, transport.PostReceiver): a message written straight
// from it, and a posted buffer that the message's payload is read straight
// into, so that a large copy-only chunk crosses with the kernel's two copies
// and none of the rank's.
//
// After the handshake the sockets leave Go's netpoller, which would wake an
// idle runtime thread for every arriving segment. One watcher goroutine per
// endpoint sleeps in epoll instead, and is armed only when needed: to finish
// writes that found a socket full, and to read and ring the rank's Bell
// while the rank sleeps (see Endpoint.PrepareWait).
//
// With Config.TLS (GCCL_TLS=1) every stream runs TLS 1.3 first, with keys
// pinned through the rendezvous (Listener.Pin, ConnectPinned); the data
// path keeps its raw descriptors and epoll (see tls.go).
//
// Wire format: every message is a 16-byte header (length, kind, tag) and the
// payload; see frame.go. Steady state allocates nothing. The transport runs
// on Linux; elsewhere Listen reports that it is not supported.
package tcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gccl/gccl/internal/logx"
	"github.com/gccl/gccl/transport"
)

// Defaults. A slot is one pipeline chunk of a collective; at 512 KiB the
// per-message cost (a system call on each side, a few µs) stays small next
// to the copy, and four slots keep a ring step's worth in flight.
const (
	DefaultSlotSize  = 512 << 10
	DefaultSlotCount = 4
	DefaultStreams   = 2
	// MaxStreams bounds Config.Streams.
	MaxStreams = 16
)

// socketBufferSize is the SO_SNDBUF and SO_RCVBUF asked for where the kernel
// grants it (net.core.wmem_max and rmem_max at least this large; elsewhere
// the kernel sizes the buffers itself).
const socketBufferSize = 4 << 20

// closeLinger bounds how long Close waits for queued messages to reach the
// kernel, and then for the peers to take them, before it closes the sockets
// anyway; abortLinger bounds the same wait for Abort's last frame. (Vars
// so that tests can shorten them.)
var (
	closeLinger = 5 * time.Second
	abortLinger = 500 * time.Millisecond
)

// Config sets up a rank's TCP transport.
type Config struct {
	// SlotSize is the largest message, and SlotCount how many messages
	// may be in flight per peer and direction (at least 2). Zero means
	// DefaultSlotSize and DefaultSlotCount. Both ranks of a pair must use
	// the same SlotSize.
	SlotSize, SlotCount int
	// Streams is the number of sockets per peer; large messages are
	// striped across them. Zero means DefaultStreams. Both ranks of a pair
	// must use the same number.
	Streams int
	// IfName selects the interface to listen on, in NCCL_SOCKET_IFNAME
	// syntax ("eth", "^docker,lo", "=eth0"). Empty means the environment
	// variable GCCL_SOCKET_IFNAME, then the default search (see
	// SelectInterfaces).
	IfName string
	// Bell is the rank's bell, rung whenever a connection changes state (a
	// message arrived, a slot was freed, a peer was lost). The endpoint
	// does not own it and never closes it. Nil means a private Doorbell,
	// closed with the endpoint.
	Bell transport.Bell
	// Token is the job's secret. Both sides of every connection must hold
	// the same token; a dialer that cannot prove it is refused.
	Token []byte
	// TLS encrypts every connection with TLS 1.3 and checks each peer's
	// key against the pin it published (see Listener.Pin and
	// ConnectPinned). Both ranks of a pair must agree. The registered
	// transport sets it from GCCL_TLS=1.
	TLS bool
	// TLSCert, TLSKey and TLSCA are PEM files for sites with a PKI: the
	// listener's certificate and key (empty: a key made by Listen) and the
	// CA peers' certificates must chain to (empty: pins alone).
	TLSCert, TLSKey, TLSCA string
	// Logger receives connection events and refusals (subsystem NET). Nil
	// means GCCL_DEBUG decides.
	Logger *slog.Logger
}

func (c *Config) withDefaults() (Config, error) {
	cfg := *c
	if cfg.SlotSize == 0 {
		cfg.SlotSize = DefaultSlotSize
	}
	if cfg.SlotCount == 0 {
		cfg.SlotCount = DefaultSlotCount
	}
	if cfg.Streams == 0 {
		cfg.Streams = DefaultStreams
	}
	if cfg.IfName == "" {
		cfg.IfName = os.Getenv("GCCL_SOCKET_IFNAME")
	}
	if cfg.Logger == nil {
		cfg.Logger = logx.Default()
	}
	// Two slots at least: a fused receive-and-send holds one slot while it
	// waits for the next (see algo.Plan).
	switch {
	case cfg.SlotSize < 64 || cfg.SlotSize > 1<<30:
		return cfg, fmt.Errorf("tcp: slot size %d out of range [64, 1 GiB]", cfg.SlotSize)
	case cfg.SlotCount < 2 || cfg.SlotCount > 1<<16:
		return cfg, fmt.Errorf("tcp: slot count %d out of range [2, 65536]", cfg.SlotCount)
	case cfg.Streams < 1 || cfg.Streams > MaxStreams:
		return cfg, fmt.Errorf("tcp: %d streams per peer out of range [1, %d]", cfg.Streams, MaxStreams)
	}
	return cfg, nil
}

// Listener is a rank's listening socket, waiting for Connect.
type Listener struct {
	rank, size int
	cfg        Config
	log        *slog.Logger
	ln         *net.TCPListener
	iface      Interface
	tls        *tlsState // nil without TLS

	mu        sync.Mutex
	connected bool
	owned     bool // a lazy endpoint took the socket over (ConnectLazy)
	closed    bool
}

// Listen opens rank's listening socket on the first selected interface, on a
// port the system picks.
func Listen(rank, size int, cfg Config) (*Listener, error) {
	if !supported {
		return nil, errUnsupportedOS
	}
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("tcp: rank %d of %d", rank, size)
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	ifs, err := SelectInterfaces(c.IfName)
	if err != nil {
		return nil, err
	}
	iface, addr, err := pickAddr(ifs, os.Getenv("GCCL_SOCKET_FAMILY"))
	if err != nil {
		return nil, err
	}
	ts, err := newTLSState(&c)
	if err != nil {
		return nil, err
	}
	lc := net.ListenConfig{Control: setSocketBuffers}
	ln, err := lc.Listen(context.Background(), "tcp", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		return nil, fmt.Errorf("tcp: listening on %s (%s): %w", iface.Name, addr, err)
	}
	l := &Listener{rank: rank, size: size, cfg: c, log: c.Logger.With("rank", rank), ln: ln.(*net.TCPListener), iface: iface, tls: ts}
	l.log.Info(fmt.Sprintf("NET/Socket : Using [0]%s:%s", iface.Name, addr), "subsys", "NET", "listen", l.Addr())
	return l, nil
}

// pickAddr chooses the interface and address to listen on: the first
// selected interface's preferred address (IPv4 first), or with family
// "AF_INET" or "AF_INET6" (GCCL_SOCKET_FAMILY, as NCCL_SOCKET_FAMILY) the
// first address of that family.
func pickAddr(ifs []Interface, family string) (Interface, netip.Addr, error) {
	want := func(netip.Addr) bool { return true }
	switch family {
	case "":
	case "AF_INET":
		want = netip.Addr.Is4
	case "AF_INET6":
		want = func(a netip.Addr) bool { return a.Is6() }
	default:
		return Interface{}, netip.Addr{}, fmt.Errorf("tcp: GCCL_SOCKET_FAMILY=%q (want AF_INET or AF_INET6)", family)
	}
	for _, it := range ifs {
		for _, a := range it.Addrs {
			if want(a) {
				return it, a, nil
			}
		}
	}
	return Interface{}, netip.Addr{}, fmt.Errorf("tcp: no selected interface has an %s address", family)
}

// SetBell makes b the bell of the endpoint Connect will make, for a caller
// that listens before it has the rank's bell (the RDMA transport's
// fallback).
func (l *Listener) SetBell(b transport.Bell) {
	l.mu.Lock()
	l.cfg.Bell = b
	l.mu.Unlock()
}

// Addr is the address peers dial (host:port), to publish via the bootstrap.
func (l *Listener) Addr() string { return l.ln.Addr().String() }

// Pin is the hash of the listener's TLS key (hex), to publish with Addr
// for ConnectPinned; empty without TLS.
func (l *Listener) Pin() string {
	if l.tls == nil {
		return ""
	}
	return l.tls.id.Pin.String()
}

// Interface is the interface the listener is bound to.
func (l *Listener) Interface() Interface { return l.iface }

// Close stops listening. Endpoints made by Connect stay up; after
// ConnectLazy the socket is the endpoint's, which closes it itself.
func (l *Listener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.owned {
		return nil
	}
	l.closed = true
	return l.ln.Close()
}

// Endpoint is one rank's TCP attachment to its peers. It implements
// transport.Endpoint; one goroutine at a time (the owner) uses its Senders
// and Receivers, as the executor does. A single watcher goroutine serves all
// peers in the background.
type Endpoint struct {
	rank, size int
	slotSize   int
	bell       transport.Bell
	ownBell    bool
	log        *slog.Logger
	peers      []atomic.Pointer[peer] // by rank; nil for self and peers not yet used
	poll       *poller
	watcher    sync.WaitGroup
	stopping   atomic.Bool
	closeOnce  sync.Once
	closed     atomic.Bool
	waitHooked atomic.Bool // PrepareWait was called: sleepers announce themselves
	conn       connector   // how pairs connect (connect.go)
}

// newEndpoint makes l's endpoint with no connection yet, and starts its
// watcher.
func newEndpoint(l *Listener, want []bool, addrs []string) (*Endpoint, error) {
	cfg := &l.cfg
	e := &Endpoint{rank: l.rank, size: l.size, slotSize: cfg.SlotSize, bell: cfg.Bell, log: l.log, peers: make([]atomic.Pointer[peer], l.size)}
	var err error
	if e.poll, err = newPoller(); err != nil {
		return nil, fmt.Errorf("tcp: %w", err)
	}
	if e.bell == nil {
		e.bell, e.ownBell = transport.NewDoorbell(), true
	}
	e.conn.init(e, l, want, addrs)
	e.watcher.Add(1)
	go e.watch()
	return e, nil
}

// watch is the watcher goroutine: it sleeps in epoll until a socket needs
// service, then moves data for its peer.
func (e *Endpoint) watch() {
	defer e.watcher.Done()
	var events []pollEvent
	for {
		var err error
		events, err = e.poll.wait(events[:0])
		if err != nil {
			e.log.Error("tcp: the socket watcher failed; peers are served only while this rank polls", "subsys", "NET", "err", err)
			return
		}
		for _, ev := range events {
			if ev.wake {
				if e.stopping.Load() {
					return
				}
				continue
			}
			if ev.peer >= 0 && ev.peer < len(e.peers) {
				if p := e.peers[ev.peer].Load(); p != nil {
					p.onEvent(ev)
				}
			}
		}
	}
}

func (e *Endpoint) Rank() int     { return e.rank }
func (e *Endpoint) Size() int     { return e.size }
func (e *Endpoint) Name() string  { return "TCP" }
func (e *Endpoint) SlotSize() int { return e.slotSize }
func (e *Endpoint) Seq() uint64   { return e.bell.Seq() }

// peer returns the connection with p, starting it at the first use.
func (e *Endpoint) peer(p int) (*peer, error) {
	if e.closed.Load() {
		return nil, transport.ErrClosed
	}
	if p < 0 || p >= e.size || p == e.rank {
		return nil, fmt.Errorf("tcp: rank %d has no peer %d", e.rank, p)
	}
	if pr := e.peers[p].Load(); pr != nil {
		return pr, nil
	}
	return e.conn.use(p)
}

// Sender returns the sending half of the connection to peer.
func (e *Endpoint) Sender(p int) (transport.Sender, error) {
	pr, err := e.peer(p)
	if err != nil {
		return nil, err
	}
	return (*sender)(pr), nil
}

// Receiver returns the receiving half of the connection from peer.
func (e *Endpoint) Receiver(p int) (transport.Receiver, error) {
	pr, err := e.peer(p)
	if err != nil {
		return nil, err
	}
	return (*receiver)(pr), nil
}

// Wait sleeps on the rank's bell, after PrepareWait.
func (e *Endpoint) Wait(ctx context.Context, seen uint64, deadline time.Time) error {
	if e.closed.Load() {
		return transport.ErrClosed
	}
	e.PrepareWait()
	return e.bell.Wait(ctx, seen, deadline)
}

// PrepareWait arms the background reading that rings the bell when data
// arrives. Whoever sleeps on the bell calls it first (Wait does); while
// receivers poll instead, arriving data wakes nobody. A caller that sleeps
// on the bell some other way never needs to call it: until the first call,
// reading stays armed at all times, which is always safe but costs a thread
// wake-up per message.
func (e *Endpoint) PrepareWait() {
	if !e.waitHooked.Load() {
		e.waitHooked.Store(true)
	}
	for i := range e.peers {
		if p := e.peers[i].Load(); p != nil {
			// Stored before re-arming, and read by every re-arm under the
			// socket's lock, so a sleeper's sockets always end up armed.
			p.rxSleeping.Store(true)
			p.watchAll()
		}
	}
}

// Close writes out what was committed, ends every connection after it and
// closes them once each peer's kernel has taken everything or the peer
// ended its side too (waiting at most a few seconds in all for peers to make
// room). Peers see ErrPeerClosed once they have read everything.
func (e *Endpoint) Close() error {
	e.shut(nil)
	return nil
}

// Abort closes every connection, waiting a moment at most for peers to take
// its last frame; peers see ErrPeerClosed carrying err's text.
func (e *Endpoint) Abort(err error) {
	if err == nil {
		err = errors.New("aborted")
	}
	e.shut(err)
}

// shut writes out what Close must deliver, or Abort's frame, then ends the
// connections the way that delivers it: each socket is shut for writing
// (the peer reads everything, then the end of the stream), what arrives is
// read and dropped until the peer has it all or ended its side too, and only
// then is the socket closed. Closing a socket with unread data would reset
// the connection and throw away what it still had to send. Both waits end
// at the linger deadline, so shut never hangs on a peer that stopped
// reading; a dead peer ends them at once.
func (e *Endpoint) shut(reason error) {
	e.closeOnce.Do(func() {
		e.closed.Store(true)
		// The lingering below can take a while: a rank asleep on the bell
		// should see ErrClosed now.
		e.bell.Ring()
		var deadline time.Time
		if reason == nil {
			// A pair still connecting delivers what was queued for it
			// once it is up, within the same deadline.
			deadline = time.Now().Add(closeLinger)
			for _, p := range e.allPeers() {
				p.drainTx(deadline)
			}
		} else {
			deadline = time.Now().Add(abortLinger)
			for _, p := range e.allPeers() {
				p.sendAbort(reason)
			}
		}
		e.halt(deadline)
		// Wake the rank if it sleeps, so it sees ErrClosed.
		e.bell.Ring()
		if e.ownBell {
			e.bell.Close()
		}
	})
}

// halt stops connecting, the watcher and every peer, then closes the
// peers' sockets and the poller. The sockets linger until deadline; a zero
// deadline (a failed Connect, with nothing to deliver) closes them at once.
// The bell is the caller's: only shut rings it.
func (e *Endpoint) halt(deadline time.Time) {
	e.conn.stop()
	e.stopping.Store(true)
	e.poll.wake()
	e.watcher.Wait()
	peers := e.allPeers()
	var fds []int
	for _, p := range peers {
		p.stop()
		fds = append(fds, p.fds...)
	}
	if !deadline.IsZero() {
		lingerFDs(fds, deadline)
	}
	for _, p := range peers {
		p.release()
	}
	e.poll.close()
}

// allPeers lists the peers made so far.
func (e *Endpoint) allPeers() []*peer {
	var out []*peer
	for i := range e.peers {
		if p := e.peers[i].Load(); p != nil {
			out = append(out, p)
		}
	}
	return out
}

var _ transport.Endpoint = (*Endpoint)(nil)

// peerError is what the connections with rank p report once it is gone.
func peerError(p int, cause error) error {
	var ab *abortError
	switch {
	case cause == nil:
		return &transport.PeerError{Peer: p, Err: transport.ErrPeerClosed}
	case errors.As(cause, &ab):
		return &transport.PeerError{Peer: p, Err: fmt.Errorf("%w: %w", transport.ErrPeerClosed, errors.New(ab.reason))}
	}
	return &transport.PeerError{Peer: p, Err: fmt.Errorf("%w: %w", transport.ErrPeerClosed, cause)}
}
