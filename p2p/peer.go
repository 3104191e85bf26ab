package p2p

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

const connBufSize = 256 << 10

// errBye is how a peer that closed its agent ends its connections.
var errBye = fmt.Errorf("%w (orderly close)", ErrRemoteDisconnect)

// peer is one connection to another agent. Either side posts requests on
// it; each side's reader goroutine serves the other's requests (the
// target's progress engine) and completes its own. The reader never waits
// on a write: replies go through the responder goroutine (or, when the
// socket takes them at once, out of the reader: replyNow), so two agents
// reading from each other cannot block each other's readers.
type peer struct {
	a    *Agent
	name string
	pid  int
	segs []string // the peer's shared segments, removed if it dies

	conn net.Conn
	br   *bufio.Reader
	tc   *tcpConn   // under br and bw: the socket (tcp_conn.go)
	data recvReader // br for data payloads: bytes arriving count as life

	wmu  sync.Mutex // one writer at a time on bw (lockWriter)
	bye  atomic.Bool
	bw   *bufio.Writer
	hdr  [wireHeaderLen]byte
	werr error

	mu       sync.Mutex
	inflight map[uint64]*Request // this side's requests awaiting acks or data
	refused  map[uint64]string   // the peer's requests with a refused write (target side)
	failed   error

	// Held while the reader copies a READ answer into a post's memory
	// (landMu) or the writer copies a WRITE post's memory into the
	// connection's buffer (sendMu), each time after checking that the post
	// is still in flight; complete takes the one of its post's op once the
	// post is out, so neither touches the memory after that.
	landMu sync.Mutex
	sendMu sync.Mutex

	respMu   sync.Mutex
	respCond *sync.Cond
	resp     []reply
	respDone bool
	// overflowed: the replies for the peer passed maxQueuedReplies, and
	// the connection is being failed.
	overflowed atomic.Bool
	respBusy   bool // the responder is writing a batch (see replyNow)
	// respWork counts the replies queued and not yet written: while there
	// are any the reader does not spin (the responder needs a core).
	respWork atomic.Int32

	lastRecv atomic.Int64
	lastSend atomic.Int64
	closed   chan struct{}

	// RDMA: this agent's channel to the peer (connected on first use), and
	// its responder to the peer's channel.
	rcMu  sync.Mutex
	rc    *rdmaChan
	rcErr error
	rmu   sync.Mutex
	rsp   *rdmaResp
	hs    map[uint64]chan hsReply  // RDMA handshakes awaiting the peer's accept (under mu)
	pongs map[uint64]chan struct{} // fences awaiting their pong (under mu)
	hsSeq uint64
}

// reply is work for the responder: an ack, a pong or a READ to serve.
type reply struct {
	op      op
	req     uint64
	aux     uint64
	region  *Region // readResp: pinned until served
	offset  uint64
	length  uint64
	err     string
	payload []byte // notif
}

func newPeer(a *Agent, conn net.Conn, br *bufio.Reader, info *agentInfo) *peer {
	p := &peer{
		a: a, name: info.Name, pid: int(info.Pid), conn: conn, br: br,
		bw: bufio.NewWriterSize(conn, connBufSize), inflight: map[uint64]*Request{},
		refused: map[uint64]string{}, closed: make(chan struct{}),
		hs: map[uint64]chan hsReply{}, pongs: map[uint64]chan struct{}{},
	}
	if info.Host == a.host {
		for _, r := range info.Regions {
			if r.SHM != "" {
				p.segs = append(p.segs, r.SHM)
			}
		}
	}
	p.startTCP()
	p.data = recvReader{p}
	p.respCond = sync.NewCond(&p.respMu)
	now := monoNow()
	p.lastRecv.Store(now)
	p.lastSend.Store(now)
	return p
}

// connectPeer returns the connection to info's agent, dialling it if there
// is none.
func (a *Agent) connectPeer(ctx context.Context, info *agentInfo) (*peer, error) {
	a.mu.RLock()
	p := a.peers[info.Name]
	a.mu.RUnlock()
	if p != nil {
		return p, nil
	}
	if info.Addr == "" {
		return nil, fmt.Errorf("p2p: agent %q has no listener and is not connected", info.Name)
	}
	return a.dial(ctx, info.Addr, info.Token)
}

// Connect exchanges metadata with the agent listening at addr, directly over
// a socket (no store needed), and returns its name. Both agents then know
// each other. The peer must not have RequireToken set.
func (a *Agent) Connect(ctx context.Context, addr string) (string, error) {
	p, err := a.dial(ctx, addr, [tokenLen]byte{})
	if err != nil {
		return "", err
	}
	return p.name, nil
}

// dial connects, sends hello (the peer's token and this agent's metadata),
// and reads the peer's hello.
func (a *Agent) dial(ctx context.Context, addr string, token [tokenLen]byte) (*peer, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultDialTimeout)
		defer cancel()
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("p2p: connecting to %s: %w", addr, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	if a.tls != nil {
		tc, err := a.tls.clientConn(ctx, conn, addr, token)
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("p2p: connecting to %s: %w", addr, err)
		}
		conn = tc
	}
	br := bufio.NewReaderSize(conn, connBufSize)
	sent := a.snapshot()
	if err := writeHello(conn, token, encodeMetadata(sent)); err != nil {
		conn.Close()
		return nil, fmt.Errorf("p2p: hello to %s: %w", addr, err)
	}
	info, err := readHello(br, nil)
	if a.tls == nil && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) {
		err = fmt.Errorf("%w (the agent there closed the connection: it refused this agent's token, or it uses GCCL_TLS=1 and this agent does not)", err)
	}
	if err == nil && info.Name == a.name {
		err = errors.New("p2p: connected to itself")
	}
	if err == nil && info.Token != token && token != ([tokenLen]byte{}) {
		err = errors.New("p2p: the agent at that address is not the one whose metadata was loaded")
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("p2p: handshake with %s: %w", addr, err)
	}
	conn.SetDeadline(time.Time{})
	return a.startPeer(conn, br, info, sent)
}

func (a *Agent) acceptLoop() {
	defer a.wg.Done()
	var backoff time.Duration
	for {
		conn, err := a.ln.Accept()
		if err != nil {
			select {
			case <-a.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				a.log.Warn("p2p listener stopped", "err", err)
				return
			}
			// Out of descriptors or memory for a moment (EMFILE, ENFILE,
			// ENOBUFS), an aborted connection: wait and accept again.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			a.log.Warn("p2p accept failed; retrying", "err", err, "in", backoff)
			select {
			case <-a.done:
				return
			case <-time.After(backoff):
			}
			continue
		}
		backoff = 0
		a.mu.Lock() // Close closes connections still in their handshake
		if a.closed {
			a.mu.Unlock()
			conn.Close()
			return
		}
		a.handshakes[conn] = true
		a.wg.Add(1)
		a.mu.Unlock()
		go func() {
			defer a.wg.Done()
			err := a.accept(conn)
			a.mu.Lock()
			delete(a.handshakes, conn)
			a.mu.Unlock()
			if err != nil {
				conn.Close()
				if !errors.Is(err, ErrClosed) {
					a.log.Warn("p2p refused a connection", "remote", conn.RemoteAddr().String(), "err", err)
				}
			}
		}()
	}
}

func (a *Agent) accept(conn net.Conn) error {
	conn.SetDeadline(time.Now().Add(DefaultDialTimeout))
	var tc *tls.Conn
	if a.tls != nil {
		var err error
		if tc, err = a.tls.serverConn(conn); err != nil {
			return err
		}
		conn = tc
	}
	br := bufio.NewReaderSize(conn, connBufSize)
	var token [tokenLen]byte
	info, err := readHello(br, &token)
	if err != nil {
		return err
	}
	if tc != nil {
		if err := checkClient(tc, info); err != nil {
			return err
		}
	}
	if token != a.token && (a.cfg.RequireToken || token != [tokenLen]byte{}) {
		return errors.New("the peer presented a wrong token (it did not load this agent's metadata)")
	}
	if info.Name == a.name {
		return errors.New("a peer with this agent's own name")
	}
	sent := a.snapshot()
	if err := writeHello(conn, info.Token, encodeMetadata(sent)); err != nil {
		return err
	}
	conn.SetDeadline(time.Time{})
	_, err = a.startPeer(conn, br, info, sent)
	return err
}

func writeHello(w io.Writer, token [tokenLen]byte, md []byte) error {
	var h [wireHeaderLen]byte
	putHeader(h[:], header{op: opHello, length: uint64(tokenLen + len(md))})
	b := append(append(h[:], token[:]...), md...)
	_, err := w.Write(b)
	return err
}

func readHello(br *bufio.Reader, token *[tokenLen]byte) (*agentInfo, error) {
	var hb [wireHeaderLen]byte
	if _, err := io.ReadFull(br, hb[:]); err != nil {
		return nil, err
	}
	h, err := parseHeader(hb[:])
	if err != nil {
		return nil, err
	}
	if h.op != opHello || h.length < tokenLen {
		return nil, fmt.Errorf("p2p: expected hello, got %v", h.op)
	}
	body := make([]byte, h.length)
	if _, err := io.ReadFull(br, body); err != nil {
		return nil, err
	}
	if token != nil {
		copy(token[:], body[:tokenLen])
	}
	return decodeMetadata(body[tokenLen:])
}

// startPeer loads the peer's metadata (so that both sides know each other
// after one handshake) and starts the connection's goroutines.
//
// sent is the metadata this agent sent in its hello: regions deregistered
// since are invalidated at once, since DeregisterMem did not know the peer.
func (a *Agent) startPeer(conn net.Conn, br *bufio.Reader, info *agentInfo, sent *agentInfo) (*peer, error) {
	if _, err := a.loadInfo(info); err != nil {
		conn.Close()
		return nil, err
	}
	p := newPeer(a, conn, br, info)
	conn = p.conn // out of the netpoller (startTCP)
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		conn.Close()
		return nil, ErrClosed
	}
	a.conns[p] = true
	sender := a.peers[info.Name]
	if sender == nil {
		sender = p
		a.peers[info.Name] = p
	} // else both dialled at once: send on the first; this one is served all the same
	var gone []uint32
	for _, r := range sent.Regions {
		if cur, ok := a.regions[r.ID]; !ok || cur.info != r {
			gone = append(gone, r.ID)
		}
	}
	a.wg.Add(2)
	a.mu.Unlock()
	go p.readLoop()
	go p.respond()
	for _, id := range gone {
		p.sendInvalidate(id)
	}
	a.log.Info("p2p connected", "peer", info.Name, "local", conn.LocalAddr().String(), "remote", conn.RemoteAddr().String())
	return sender, nil
}

// fail ends the connection once: its requests in flight fail with err, the
// peer's metadata is dropped (unless the agent is closing), and the shared
// segments of a peer that died are removed.
func (p *peer) fail(err error, forget bool) {
	select {
	case <-p.a.done:
		// Closing: whatever ended the connection first (the goodbye's short
		// write deadline cutting a frame, or the socket Close shut), the
		// requests end because the agent closed, as Close documents.
		err = ErrClosed
	default:
	}
	p.mu.Lock()
	if p.failed != nil {
		p.mu.Unlock()
		return
	}
	p.failed = err
	reqs := p.inflight
	p.inflight = map[uint64]*Request{}
	p.mu.Unlock()
	close(p.closed)
	p.conn.Close()
	p.respMu.Lock()
	p.respDone = true
	p.respCond.Broadcast()
	p.respMu.Unlock()
	for _, r := range reqs {
		r.finish(err)
	}
	p.closeRDMA(err)
	a := p.a
	a.mu.Lock()
	delete(a.conns, p)
	if a.peers[p.name] == p {
		delete(a.peers, p.name)
		for q := range a.conns { // another connection to the same agent takes over
			if q.name == p.name {
				a.peers[p.name] = q
				break
			}
		}
	}
	_, stillConnected := a.peers[p.name]
	a.mu.Unlock()
	select {
	case <-a.done:
		// Closing: the peer's end saw our goodbye first, unless its
		// process died, when nobody else will remove its segments. A
		// killed process is exiting before its sockets close, so one
		// look suffices, and Close does not wait on live peers.
		if len(p.segs) > 0 {
			a.removeDeadSegments(p.pid, p.segs)
		}
		return
	default:
	}
	if !forget {
		return
	}
	// Reap even while another connection to the same agent remains (both
	// dialled at once): it broke with the process too, but its reader may
	// see that only after the application closed this agent, and Close's
	// own failing forgets nothing. reapSegments removes nothing of a live
	// process.
	p.reapIfDead()
	if stillConnected {
		return
	}
	if errors.Is(err, errBye) {
		a.log.Info("p2p peer left", "peer", p.name, "failed_requests", len(reqs))
	} else {
		a.log.Warn("p2p peer lost", "peer", p.name, "err", err, "failed_requests", len(reqs))
	}
	a.Invalidate(p.name)
}

// reapIfDead removes the segments of a peer whose process died, in
// the background unless the agent is closing.
func (p *peer) reapIfDead() {
	a := p.a
	if len(p.segs) > 0 {
		a.mu.Lock() // Close waits for a.wg once closed is set: add before that
		closing := a.closed
		if !closing {
			a.wg.Add(1)
			go func() {
				defer a.wg.Done()
				a.reapSegments(p.pid, p.segs)
			}()
		}
		a.mu.Unlock()
		if closing {
			// The application may close the agent as soon as this
			// peer's requests failed, before this point: reap here
			// (briefly, the agent being closed), or nobody will.
			a.reapSegments(p.pid, p.segs)
		}
	}
}

func (p *peer) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}

// readLoop is the connection's progress engine.
func (p *peer) readLoop() {
	defer p.a.wg.Done()
	var hb [wireHeaderLen]byte
	held := p.tc.raw != nil && p.tc.reading.CompareAndSwap(false, true)
	for {
		var err error
		if p.tc.raw != nil {
			err = p.awaitFrame(held)
			held = true
		}
		if err == nil {
			_, err = io.ReadFull(p.br, hb[:])
		}
		if err != nil {
			p.fail(fmt.Errorf("%w: %s: %v", ErrRemoteDisconnect, p.name, err), true)
			return
		}
		p.lastRecv.Store(monoNow())
		h, err := parseHeader(hb[:])
		if err == nil {
			err = p.handle(h)
		}
		if err != nil {
			if errors.Is(err, errBye) {
				p.fail(fmt.Errorf("%w: %s closed its agent", errBye, p.name), true)
				return
			}
			if !errors.Is(err, ErrRemoteDisconnect) {
				p.a.log.Warn("p2p protocol error; dropping the connection", "peer", p.name, "err", err)
			}
			p.fail(fmt.Errorf("%w: %s: %v", ErrRemoteDisconnect, p.name, err), true)
			return
		}
	}
}

func (p *peer) handle(h header) error {
	switch h.op {
	case opWrite:
		return p.serveWrite(h)
	case opReadReq:
		p.serveReadReq(h)
	case opReadResp:
		return p.readResp(h)
	case opCommit:
		return p.serveCommit(h)
	case opAck:
		return p.ackReceived(h)
	case opNotif:
		msg := make([]byte, h.length)
		if _, err := io.ReadFull(p.br, msg); err != nil {
			return err
		}
		if err := p.a.deliverNotif(p.name, msg); err != nil {
			return err
		}
	case opPing:
		p.queue(reply{op: opPong, aux: h.aux})
	case opPong:
		if h.aux != 0 {
			p.mu.Lock()
			if w := p.pongs[h.aux]; w != nil {
				close(w)
				delete(p.pongs, h.aux)
			}
			p.mu.Unlock()
		}
	case opRDMAConnect:
		return p.serveRDMAConnect(h)
	case opRDMABarrier:
		p.rmu.Lock()
		rs := p.rsp
		p.rmu.Unlock()
		if rs != nil {
			rs.waitDelivered(h.aux, p.a.cfg.PeerTimeout/2)
		}
	case opRDMAAccept:
		return p.rdmaAccepted(h)
	case opAbort:
		msg := make([]byte, h.length)
		if _, err := io.ReadFull(p.br, msg); err != nil {
			return err
		}
		p.a.deliverFailure(PeerFailure{Peer: p.name, Request: h.req, PartsDone: int(h.aux), Err: string(msg), At: time.Now()})
	case opInvalidate:
		if ra, err := p.a.remote(p.name); err == nil {
			ra.dropRegion(h.region)
		}
	case opBye:
		return errBye
	case opHello:
		return errors.New("a second hello")
	}
	return nil
}

// take removes post id from the requests in flight and returns its
// request, which the caller then finishes; nil if it is no longer in
// flight.
func (p *peer) take(id uint64) *Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.inflight[id]
	delete(p.inflight, id)
	return r
}

// recvReader reads from the connection and notes that the peer is alive:
// one payload may take longer than PeerTimeout to arrive.
type recvReader struct{ p *peer }

func (r recvReader) Read(b []byte) (int, error) {
	n, err := r.p.br.Read(b)
	if n > 0 {
		r.p.lastRecv.Store(monoNow())
	}
	return n, err
}

// maxQueuedReplies bounds the replies waiting for the responder: a peer
// that keeps sending requests or pings and never reads the answers would
// otherwise make them pile up until the write deadline. A variable for
// tests.
var maxQueuedReplies = 1 << 16

func (p *peer) queue(r reply) {
	p.respMu.Lock()
	if p.respDone || len(p.resp) >= maxQueuedReplies {
		n, over := len(p.resp), !p.respDone
		p.respMu.Unlock()
		if r.region != nil {
			r.region.busy.Add(-1)
		}
		if over && p.overflowed.CompareAndSwap(false, true) {
			// Not from the caller's goroutine, which may be the reader or
			// hold the peer's locks.
			p.a.wg.Add(1)
			go func() {
				defer p.a.wg.Done()
				p.fail(fmt.Errorf("%w: %s: %d replies wait, which it does not read (at most %d)",
					ErrRemoteDisconnect, p.name, n, maxQueuedReplies), true)
			}()
		}
		return
	}
	p.resp = append(p.resp, r)
	p.respWork.Add(1)
	p.respCond.Signal()
	p.respMu.Unlock()
}

// respond writes the replies the reader queued.
func (p *peer) respond() {
	defer p.a.wg.Done()
	var batch []reply
	for {
		p.respMu.Lock()
		for len(p.resp) == 0 && !p.respDone {
			p.respCond.Wait()
		}
		if p.respDone {
			left := p.resp
			p.resp = nil
			p.respMu.Unlock()
			for _, r := range left {
				if r.region != nil {
					r.region.busy.Add(-1)
				}
			}
			return
		}
		batch, p.resp = p.resp, batch[:0]
		queued := int32(len(batch))
		p.respBusy = true
		p.respMu.Unlock()
		p.lockWriter()
		var err error
		for i, r := range batch {
			if err == nil {
				err = p.writeReplyLocked(r)
			}
			if r.region != nil {
				r.region.busy.Add(-1)
			}
			batch[i] = reply{}
		}
		if err == nil {
			err = p.flushLocked()
		}
		p.wmu.Unlock()
		p.respMu.Lock()
		p.respBusy = false
		p.respMu.Unlock()
		p.respWork.Add(-queued)
		if err != nil {
			p.fail(fmt.Errorf("%w: %s: %v", ErrRemoteDisconnect, p.name, err), true)
		}
	}
}

func (p *peer) writeReplyLocked(r reply) error {
	if r.op == opFlush {
		return p.tc.flushOver() // what a nonblocking write left (tcp_conn.go)
	}
	h := header{op: r.op, req: r.req, aux: r.aux}
	if r.err != "" {
		h.flags = flagError
		h.length = uint64(len(r.err))
		if err := p.frameLocked(h, nil); err != nil {
			return err
		}
		_, err := p.bw.WriteString(r.err)
		return err
	}
	if r.op == opNotif || r.op == opRDMAAccept || r.op == opAbort {
		return p.frameLocked(h, nonNil(r.payload))
	}
	if r.op != opReadResp {
		return p.frameLocked(h, nil)
	}
	return p.serveReadLocked(r, h)
}

// frameLocked writes a header and its payload (large payloads go to the
// socket without a copy). The caller holds wmu.
func (p *peer) frameLocked(h header, payload []byte) error {
	if p.werr != nil {
		return p.werr
	}
	if payload != nil {
		h.length = uint64(len(payload))
	}
	putHeader(p.hdr[:], h)
	if _, err := p.bw.Write(p.hdr[:]); err != nil {
		p.werr = err
		return err
	}
	if len(payload) > 0 {
		if _, err := p.bw.Write(payload); err != nil {
			p.werr = err
			return err
		}
	}
	return nil
}

func (p *peer) flushLocked() error {
	if p.werr != nil {
		return p.werr
	}
	if err := p.bw.Flush(); err != nil {
		p.werr = err
		return err
	}
	p.lastSend.Store(monoNow())
	return nil
}

// control sends a frame with no data between requests.
func (p *peer) control(h header, payload []byte) error {
	p.lockWriter()
	err := p.frameLocked(h, payload)
	if err == nil {
		err = p.flushLocked()
	}
	p.wmu.Unlock()
	return err
}

func (p *peer) sendInvalidate(id uint32) { p.control(header{op: opInvalidate, region: id}, nil) }

func (p *peer) sendBye() {
	p.bye.Store(true) // writers stop extending the deadline
	p.conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	p.control(header{op: opBye}, nil)
}

// lockWriter takes the writer and gives its writes RequestTimeout from now:
// bufio writes large payloads (and full buffers) to the socket before the
// flush, so a deadline left over from the last flush must not apply.
func (p *peer) lockWriter() {
	p.wmu.Lock()
	if !p.bye.Load() {
		p.conn.SetWriteDeadline(time.Now().Add(p.a.cfg.RequestTimeout))
	}
}

// reapSegments removes a lost peer's shared segments once its process is
// gone (it may take a moment after its socket closed to become a zombie);
// a peer that is only silent keeps them.
//
// It waits up to a second, and closing the agent does not cut that
// short: an application that closes its agent as soon as a request failed
// (the peer died) would otherwise leave the dead peer's segments to
// nobody (the fault soak, tests/soak_test.go, found that), and on a loaded
// host a killed process can take over 100 ms to exit after its sockets
// closed (a CI run saw it). Only a peer whose connection broke while its
// process lives on makes Close wait the whole second.
func (a *Agent) reapSegments(pid int, segs []string) {
	for range 100 {
		if a.removeDeadSegments(pid, segs) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// removeDeadSegments removes segs if process pid is gone, and reports
// whether it was.
func (a *Agent) removeDeadSegments(pid int, segs []string) bool {
	if !processGone(pid) {
		return false
	}
	for _, s := range segs {
		removeSegment(s)
	}
	a.log.Info("p2p removed a dead peer's shared segments", "pid", pid, "segments", len(segs))
	return true
}
