package tcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/gccl/gccl/internal/tlsx"
	"github.com/gccl/gccl/transport"
)

// Connecting. A pair's sockets are made at its first use: the endpoint's
// first Sender or Receiver for the peer, or the peer's dial, whichever comes
// first. The lower rank of each pair dials the higher one (every stream is
// its own connection and handshake), so every pair connects exactly once
// whatever order ranks reach it in; the higher rank accepts for as long as
// its endpoint is open. Until its streams are up a peer has its rings but no
// sockets: sends queue (up to SlotCount messages, as for a slow peer),
// receives find nothing, and nobody waits for the other side to connect, so
// a first use in any order cannot deadlock. Connect (eager) uses every peer
// at once and returns when all are up, which is what tests and the RDMA
// fallback want; ConnectLazy returns at once, which is what a job wants: a
// rank connects to the few peers its plans use, not to every rank of the
// job.

// handshakeTimeout bounds one handshake when ctx has no deadline, so a
// silent client cannot hold a slot forever, and how long a dial may keep
// failing before the pair fails. (A var so that tests can shorten it.)
var handshakeTimeout = 30 * time.Second

// deadlineFor is when a handshake must be over.
func deadlineFor(ctx context.Context) time.Time {
	d := time.Now().Add(handshakeTimeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		d = cd
	}
	return d
}

// Connect opens Streams connections with each of peers (both directions
// share them) and returns the endpoint once all are up, or an error when
// ctx ends first. addrs holds every rank's Listener.Addr, indexed by rank.
// Connect or ConnectLazy may be called once per Listener.
func (l *Listener) Connect(ctx context.Context, peers []int, addrs []string) (*Endpoint, error) {
	return l.ConnectPinned(ctx, peers, addrs, nil)
}

// ConnectPinned is Connect for a listener with TLS: pins holds every
// rank's Listener.Pin, indexed by rank, and a peer whose key does not match
// its pin is refused.
func (l *Listener) ConnectPinned(ctx context.Context, peers []int, addrs, pins []string) (*Endpoint, error) {
	e, err := l.open(peers, addrs, pins, false)
	if err != nil {
		return nil, err
	}
	for _, p := range peers {
		if _, err := e.conn.use(p); err != nil {
			e.conn.discard()
			return nil, err
		}
	}
	if err := e.conn.waitUp(ctx, peers); err != nil {
		e.conn.discard()
		return nil, err
	}
	return e, nil
}

// ConnectLazy returns the endpoint to peers at once; each pair connects at
// its first use (see above). The endpoint owns the listening socket from
// then on and closes it when it closes; Listener.Close leaves it open.
func (l *Listener) ConnectLazy(peers []int, addrs, pins []string) (*Endpoint, error) {
	return l.open(peers, addrs, pins, true)
}

// open checks Connect's arguments and makes the endpoint, accepting.
func (l *Listener) open(peers []int, addrs, pins []string, lazy bool) (*Endpoint, error) {
	if len(addrs) != l.size {
		return nil, fmt.Errorf("tcp: %d addresses for %d ranks", len(addrs), l.size)
	}
	want := make([]bool, l.size)
	for _, p := range peers {
		if p < 0 || p >= l.size || p == l.rank {
			return nil, fmt.Errorf("tcp: rank %d cannot connect to peer %d of %d", l.rank, p, l.size)
		}
		if want[p] {
			return nil, fmt.Errorf("tcp: peer %d listed twice", p)
		}
		want[p] = true
	}
	if l.tls != nil {
		if err := l.tls.setPins(l.rank, peers, pins); err != nil {
			return nil, err
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.connected {
		return nil, errors.New("tcp: listener closed or already connected")
	}
	e, err := newEndpoint(l, want, addrs)
	if err != nil {
		return nil, err
	}
	l.connected, l.owned = true, lazy
	return e, nil
}

// connector makes an endpoint's connections: the accepting goroutine, a
// dialing goroutine per peer this rank dials, a handshake goroutine per
// accepted connection.
type connector struct {
	e     *Endpoint
	l     *Listener
	want  []bool   // the peers this endpoint serves
	addrs []string // by rank
	ctx   context.Context
	end   context.CancelFunc
	wg    sync.WaitGroup

	mu       sync.Mutex
	stopping bool       // stop began: no new peer, dial or attach
	pend     []*pending // by rank: accepted streams not yet attached
	changed  chan struct{}
}

// pending is a peer's accepted streams, attached once all are there.
type pending struct {
	conns []*net.TCPConn
	sec   []*secureStream
	ready int // streams whose handshake ended well
}

func (c *connector) init(e *Endpoint, l *Listener, want []bool, addrs []string) {
	c.e, c.l, c.want, c.addrs = e, l, want, addrs
	c.ctx, c.end = context.WithCancel(context.Background())
	c.pend = make([]*pending, l.size)
	c.changed = make(chan struct{}, 1)
	c.wg.Add(1)
	go c.acceptLoop()
}

// use returns the peer p, making it (and starting its dial, if this rank
// dials) at its first use.
func (c *connector) use(p int) (*peer, error) {
	e := c.e
	if !c.want[p] {
		return nil, &transport.PeerError{Peer: p, Err: fmt.Errorf("tcp: rank %d does not connect to rank %d", e.rank, p)}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.peerLocked(p)
}

func (c *connector) peerLocked(p int) (*peer, error) {
	e := c.e
	if pr := e.peers[p].Load(); pr != nil {
		return pr, nil
	}
	if c.stopping {
		return nil, transport.ErrClosed
	}
	pr := newPeer(e, p, &c.l.cfg, c.l.tls != nil)
	e.peers[p].Store(pr)
	if p > e.rank {
		c.wg.Add(1)
		go c.dial(pr)
	}
	return pr, nil
}

// notify wakes an eager Connect waiting for its peers.
func (c *connector) notify() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// waitUp returns once every peer is up, or the first that failed to
// connect, or when ctx ends.
func (c *connector) waitUp(ctx context.Context, peers []int) error {
	for {
		var missing []string
		for _, p := range peers {
			pr := c.e.peers[p].Load()
			if pr.up.Load() {
				continue
			}
			if f := pr.rxErr.Load(); f != nil {
				return f.err
			}
			missing = append(missing, fmt.Sprintf("%d streams with rank %d", len(pr.watches), p))
		}
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-c.changed:
		case <-ctx.Done():
			return fmt.Errorf("tcp: rank %d connecting: %w (still missing %v)", c.e.rank, ctx.Err(), missing)
		}
	}
}

// stop ends connecting: dials and handshakes in progress are cut short,
// the accepting goroutine returns, and streams accepted for a peer that
// never came up are closed. A lazy endpoint's listening socket closes.
func (c *connector) stop() {
	c.mu.Lock()
	c.stopping = true
	c.mu.Unlock()
	c.end()
	if c.l.owned {
		c.l.ln.Close()
	} else {
		_ = c.l.ln.SetDeadline(time.Unix(1, 0)) // ends Accept
	}
	c.wg.Wait()
	for _, pd := range c.pend {
		if pd != nil {
			for _, nc := range pd.conns {
				if nc != nil {
					nc.Close()
				}
			}
		}
	}
}

// discard closes an endpoint whose eager Connect failed, at once. Not shut:
// nobody has had the endpoint, so there is nothing to deliver, no abort to
// send and no rank to wake.
func (c *connector) discard() {
	e := c.e
	e.closed.Store(true)
	e.halt(time.Time{})
	if e.ownBell {
		e.bell.Close()
	}
}

// attach hands a peer its connected streams and wakes whoever waits on it.
func (c *connector) attach(pr *peer, conns []*net.TCPConn, sec []*secureStream) {
	e := c.e
	c.mu.Lock()
	if c.stopping {
		c.mu.Unlock()
		for _, nc := range conns {
			nc.Close()
		}
		return
	}
	err := pr.install(conns, sec)
	if err == nil {
		how := ""
		if sec != nil {
			how = ", TLS 1.3"
		}
		e.log.Info(fmt.Sprintf("rank %d <-> %d via TCP/%s, %d streams%s", e.rank, pr.rank, c.l.iface.Name, len(conns), how), "subsys", "NET")
		pr.up.Store(true)
	}
	c.mu.Unlock()
	if err != nil {
		pr.failConnect(err)
	} else {
		// Send what was queued while connecting, and arm what the owner
		// needs if it sleeps.
		pr.flushTx(true)
		pr.watchAll()
		e.bell.Ring()
	}
	c.notify()
}

func (c *connector) myHello(stream int) hello {
	cfg := &c.l.cfg
	return hello{rank: uint32(c.l.rank), size: uint32(c.l.size), stream: uint32(stream), streams: uint32(cfg.Streams), slotSize: uint32(cfg.SlotSize), nonce: newNonce()}
}

// dial opens every stream to a higher rank, retrying while the peer is not
// listening yet, and attaches them.
func (c *connector) dial(pr *peer) {
	defer c.wg.Done()
	p, addr := pr.rank, c.addrs[pr.rank]
	ctx := c.ctx
	d := net.Dialer{Control: setSocketBuffers}
	streams := c.l.cfg.Streams
	conns := make([]*net.TCPConn, 0, streams)
	var secs []*secureStream
	if c.l.tls != nil {
		secs = make([]*secureStream, 0, streams)
	}
	closeAll := func() {
		for _, nc := range conns {
			nc.Close()
		}
	}
	start := time.Now()
	for stream := 0; stream < streams; stream++ {
		backoff := 10 * time.Millisecond
		for {
			nc, sec, err := c.dialStream(ctx, &d, p, addr, stream)
			if err == nil {
				conns = append(conns, nc)
				if secs != nil {
					secs = append(secs, sec)
				}
				break
			}
			if ctx.Err() != nil {
				closeAll()
				return
			}
			if errors.Is(err, errRefused) {
				closeAll()
				pr.failConnect(fmt.Errorf("tcp: rank %d connecting to rank %d at %s: %w", c.l.rank, p, addr, err))
				c.notify()
				return
			}
			// The peer listens from before its address was published, so
			// a dial that keeps failing means it is gone or unreachable.
			if time.Since(start) > handshakeTimeout {
				closeAll()
				pr.failConnect(fmt.Errorf("tcp: rank %d could not connect to rank %d at %s for %v: %w", c.l.rank, p, addr, handshakeTimeout, err))
				c.notify()
				return
			}
			c.l.log.Debug("dial failed, retrying", "subsys", "NET", "peer", p, "addr", addr, "err", err)
			select {
			case <-ctx.Done():
				closeAll()
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 500*time.Millisecond)
		}
	}
	c.attach(pr, conns, secs)
}

func (c *connector) dialStream(ctx context.Context, d *net.Dialer, p int, addr string, stream int) (*net.TCPConn, *secureStream, error) {
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	tc := nc.(*net.TCPConn)
	stop := context.AfterFunc(ctx, func() { tc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	tc.SetDeadline(deadlineFor(ctx))
	var conn net.Conn = tc
	var sec *secureStream
	if c.l.tls != nil {
		if sec, err = c.l.tls.clientStream(ctx, tc, p); err != nil {
			tc.Close()
			return nil, nil, err
		}
		conn = sec.tc
	}
	if err := dialHandshake(conn, c.l.cfg.Token, c.myHello(stream), p); err != nil {
		tc.Close()
		if sec != nil {
			err = tlsRefusal(err, p)
		}
		return nil, nil, err
	}
	if err := tc.SetDeadline(time.Time{}); err != nil || ctx.Err() != nil {
		tc.Close()
		return nil, nil, errors.Join(err, ctx.Err())
	}
	return tc, sec, nil
}

// acceptLoop takes connections from lower ranks until the endpoint stops
// connecting. Each handshake runs on its own goroutine so a slow or hostile
// client cannot hold up the others.
func (c *connector) acceptLoop() {
	defer c.wg.Done()
	for {
		nc, err := c.l.ln.AcceptTCP()
		if err != nil {
			if c.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			c.l.log.Warn("accept failed", "subsys", "NET", "err", err)
			select {
			case <-c.ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		c.wg.Add(1)
		go c.accept(nc)
	}
}

func (c *connector) accept(tc *net.TCPConn) {
	defer c.wg.Done()
	ctx := c.ctx
	stop := context.AfterFunc(ctx, func() { tc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	tc.SetDeadline(deadlineFor(ctx))
	l := c.l
	cfg := &l.cfg
	var conn net.Conn = tc
	var sec *secureStream
	var pin tlsx.Pin
	if l.tls != nil {
		var err error
		if sec, pin, err = l.tls.serverStream(ctx, tc, l.rank); err != nil {
			l.log.Warn("refused a connection", "subsys", "NET", "from", tc.RemoteAddr(), "err", err)
			tc.Close()
			return
		}
		conn = sec.tc
	}
	check := func(h hello) error {
		switch p := int(h.rank); {
		case p >= l.size || p >= l.rank || !c.want[p]:
			return fmt.Errorf("rank %d is not a peer that dials rank %d", h.rank, l.rank)
		case int(h.size) != l.size:
			return fmt.Errorf("rank %d says the job has %d ranks, not %d", h.rank, h.size, l.size)
		case int(h.streams) != cfg.Streams || h.stream >= h.streams:
			return fmt.Errorf("rank %d opens stream %d of %d, this rank uses %d (every rank must set the same %s)", h.rank, h.stream, h.streams, cfg.Streams, EnvSockets)
		case int(h.slotSize) != cfg.SlotSize:
			return fmt.Errorf("rank %d uses %d-byte slots, this rank %d (slot sizes must match)", h.rank, h.slotSize, cfg.SlotSize)
		case sec != nil && pin != l.tls.pins[p]:
			return fmt.Errorf("the dialer claims to be rank %d but holds another rank's TLS key", h.rank)
		}
		return nil
	}
	var pd *pending
	var pr *peer
	claim := func(h hello) error { // h passed check: rank and stream are in range
		c.mu.Lock()
		defer c.mu.Unlock()
		var err error
		if pr, err = c.peerLocked(int(h.rank)); err != nil {
			return err
		}
		pd = c.pend[h.rank]
		if pd == nil {
			pd = &pending{conns: make([]*net.TCPConn, cfg.Streams)}
			if sec != nil {
				pd.sec = make([]*secureStream, cfg.Streams)
			}
			c.pend[h.rank] = pd
		}
		if pr.up.Load() || pd.conns[h.stream] != nil {
			pd = nil
			return fmt.Errorf("rank %d opened stream %d twice", h.rank, h.stream)
		}
		pd.conns[h.stream] = tc
		if sec != nil {
			pd.sec[h.stream] = sec
		}
		return nil
	}
	h, err := acceptHandshake(conn, cfg.Token, l.rank, check, claim)
	if err == nil {
		err = tc.SetDeadline(time.Time{})
	}
	var conns []*net.TCPConn
	var secs []*secureStream
	if pd != nil {
		c.mu.Lock()
		switch {
		case err != nil:
			pd.conns[h.stream] = nil
			if sec != nil {
				pd.sec[h.stream] = nil
			}
		case pd.ready+1 == len(pd.conns):
			conns, secs = pd.conns, pd.sec
			c.pend[h.rank] = nil
		default:
			pd.ready++
		}
		c.mu.Unlock()
	}
	if err != nil {
		l.log.Warn("refused a connection", "subsys", "NET", "from", tc.RemoteAddr(), "err", err)
		tc.Close()
		return
	}
	if conns != nil {
		c.attach(pr, conns, secs)
	}
}
