package p2p

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/gccl/gccl/internal/verbs"
)

// The rdma backend: RDMA READ and WRITE between regions registered with
// both agents' RDMA devices (DRAM, and VRAM through GPUDirect RDMA), on
// RC QPs connected over the peer's tcp connection; the target runs no code
// per byte. A request's descriptors become chained work requests, once, at
// MakeRequest: each carries up to rdmaMaxSGE scatter/gather entries of
// local pieces that are contiguous on the target, and at most rdmaMaxWR
// bytes; a request of at least rdmaStripeMin bytes is striped over the
// channel's QPs. Each part's notification is a SEND behind its data
// (rdma_chan.go). It is chosen between hosts when both agents have an RDMA
// device on a common fabric and every region of the request is
// registered with it; between agents of one host only with
// Config.RDMASameHost.
var rdmaSpec = backendSpec{
	backend: rdmaBackend{}, kind: BackendRDMA, name: "rdma", async: true, postInline: true, initiatorChecks: true,
	cost: costModel{fixed: 8 * time.Microsecond, perPiece: 60 * time.Nanosecond, perPart: 4 * time.Microsecond, bytesPerSec: 10e9},
}

type rdmaBackend struct{}

func (rdmaBackend) serves(pl placement) (bool, string) {
	if pl.self || pl.remoteType == FILE || !pl.rdma || pl.sameHost && !pl.rdmaSameHost {
		return false, ""
	}
	why := "another host; RDMA READ/WRITE between registered regions"
	if pl.sameHost {
		why = "same host, RDMA between two agents of one host (Config.RDMASameHost)"
	}
	if pl.vram() {
		why += "; GPUDirect RDMA for the VRAM"
	}
	return true, why
}

// rdmaPlan is a request's work requests, per QP, and its current post's
// progress (under the channel's mu).
type rdmaPlan struct {
	wrs     [][]verbs.SendWR // per QP, in posting order
	wrPart  [][]int32        // per QP: each work request's part
	partEnd [][]int32        // per part, per QP: work requests up to its end
	partSeq []uint64         // per part: its notification's sequence number

	post      uint64  // the post these counters are for
	posted    []int32 // per QP: work requests posted
	done      []int32 // per QP: work requests completed
	notified  int     // parts whose notification is posted (or needs none)
	confirmed int     // parts over: data complete, notification delivered
	notifOut  int     // notification SENDs outstanding
	delivered uint64  // the last of its notifications the target acknowledged
	failed    error   // the post fails with it once nothing is outstanding
	canceled  bool
}

// prepare builds the request's work requests from its pieces: the local
// keys of its regions' registrations, the remote keys from the peer's
// metadata.
func (rdmaBackend) prepare(r *Request) error {
	n := r.a.cfg.RDMAQPs
	keys := r.ra.info.Keys
	type wr struct {
		raddr uint64
		rkey  uint32
		n     uint64
		part  int
		sges  []verbs.SGE
	}
	var all []wr
	var sgeCount int
	for i := range r.parts {
		start := 0
		if i > 0 {
			start = r.parts[i-1].end
		}
		for k := start; k < r.parts[i].end; k++ {
			s := &r.segs[k]
			le := s.local.rd
			rk := keys[s.rinfo.ID]
			if le == nil || len(rk) == 0 {
				return fmt.Errorf("p2p: rdma: piece %d has no RDMA key (local region %d or %s's region %d is not registered with an RDMA device): %w",
					k, s.local.info.ID, r.peer, s.rinfo.ID, ErrNotSupported)
			}
			laddr := s.local.info.Base + s.loff
			loff := laddr - le.key.base
			roff := s.raddr - s.rinfo.Base
			for done := uint64(0); done < s.n; {
				lkey, lroom := le.lkey(loff + done)
				ki := keyAt(rk, roff+done)
				rroom := rk[ki].Off + rk[ki].Len - (roff + done)
				m := min(s.n-done, lroom, rroom, rdmaMaxWR)
				raddr := s.raddr + done
				rkey := rk[ki].RKey
				if c := len(all) - 1; c >= 0 && all[c].part == i && all[c].rkey == rkey && all[c].raddr+all[c].n == raddr &&
					all[c].n < rdmaMaxWR && (len(all[c].sges) < rdmaMaxSGE || lastSGEContinues(all[c].sges, laddr+done, lkey)) {
					m = min(m, rdmaMaxWR-all[c].n)
					w := &all[c]
					if lastSGEContinues(w.sges, laddr+done, lkey) {
						w.sges[len(w.sges)-1].Length += uint32(m)
					} else {
						w.sges = append(w.sges, verbs.SGE{Addr: laddr + done, Length: uint32(m), LKey: lkey})
						sgeCount++
					}
					w.n += m
				} else {
					all = append(all, wr{raddr: raddr, rkey: rkey, n: m, part: i, sges: []verbs.SGE{{Addr: laddr + done, Length: uint32(m), LKey: lkey}}})
					sgeCount++
				}
				done += m
			}
		}
	}
	rp := &rdmaPlan{wrs: make([][]verbs.SendWR, n), wrPart: make([][]int32, n), partEnd: make([][]int32, len(r.parts)),
		partSeq: make([]uint64, len(r.parts)), posted: make([]int32, n), done: make([]int32, n)}
	// One backing array of entries for all the work requests.
	sges := make([]verbs.SGE, 0, sgeCount)
	op := verbs.OpWrite
	if r.op == Read {
		op = verbs.OpRead
	}
	stripe := r.bytes >= rdmaStripeMin
	for i := range r.parts {
		rp.partEnd[i] = make([]int32, n)
	}
	for j, w := range all {
		k := 0
		if stripe {
			k = j % n
		}
		from := len(sges)
		sges = append(sges, w.sges...)
		rp.wrs[k] = append(rp.wrs[k], verbs.SendWR{Op: op, RemoteAddr: w.raddr, RKey: w.rkey, SGEs: sges[from:len(sges):len(sges)]})
		rp.wrPart[k] = append(rp.wrPart[k], int32(w.part))
	}
	for k := range n {
		for i, p := range rp.wrPart[k] {
			rp.partEnd[p][k] = int32(i + 1)
			// Signaled: the last of each part on the QP, and one in
			// rdmaSigEvery (posts make the last of each batch signaled).
			if last := i == len(rp.wrPart[k])-1 || rp.wrPart[k][i+1] != p; last || (i+1)%rdmaSigEvery == 0 {
				rp.wrs[k][i].Flags |= verbs.SendSignaled
			}
		}
		// A part with no work request on QP k ends where the previous did.
		for i := 1; i < len(r.parts); i++ {
			rp.partEnd[i][k] = max(rp.partEnd[i][k], rp.partEnd[i-1][k])
		}
	}
	r.rd = rp
	return nil
}

func lastSGEContinues(sges []verbs.SGE, addr uint64, lkey uint32) bool {
	l := &sges[len(sges)-1]
	return l.LKey == lkey && l.Addr+uint64(l.Length) == addr && uint64(l.Length) < 1<<31
}

// keyAt is the index of the key covering offset off of a region.
func keyAt(keys []rkeyRange, off uint64) int {
	for i := range keys {
		if off < keys[i].Off+keys[i].Len {
			return i
		}
	}
	return len(keys) - 1
}

// run starts the post on the channel; the channel's progress goroutine
// finishes it.
func (rdmaBackend) run(r *Request) error {
	if r.stop.stopped() {
		r.finish(r.halted())
		return nil
	}
	p := r.p
	ch, err := p.rdmaChannel()
	if err != nil {
		r.finish(err)
		return nil
	}
	id := r.id
	p.mu.Lock()
	if p.failed != nil {
		err := p.failed
		p.mu.Unlock()
		r.finish(err)
		return nil
	}
	p.inflight[id] = r
	p.mu.Unlock()
	r.rch = ch
	if err := ch.post(r); err != nil {
		if p.take(id) == r {
			r.finish(err)
		}
		return nil
	}
	ch.finishDone()
	return nil
}

// retire waits until nothing of the post is outstanding on the QPs.
func (rdmaBackend) retire(r *Request) {
	if ch := r.rch; ch != nil {
		ch.retire(r, r.id)
	}
}

// cancel fails the post once nothing of it can land.
func (rdmaBackend) cancel(ctx context.Context, r *Request, err error) error {
	ch := r.rch
	if ch == nil {
		return nil
	}
	return ch.cancel(r, r.id, err, ctx.Done())
}

// landed reports the bytes of each part that landed.
func (rdmaBackend) landed(r *Request, out []uint64) bool {
	if ch := r.rch; ch != nil && r.rd != nil {
		ch.landed(r, out)
		return true
	}
	return false
}

// notifPath is the way a post's notifications travel to the target: on
// the connection (every backend but rdma), or as SENDs on the RDMA
// channel's QP 0. Each keeps its order; a lane that switches from one to
// the other first makes sure the target has delivered what went the other
// way, so that notifications arrive in posting order whatever the mix of
// backends.
type notifPath uint8

const (
	pathNone notifPath = iota
	pathStream
	pathRDMA
)

// execute runs r, after the switch of notification path it needs.
func (l *lane) execute(r *Request) error {
	if p := r.p; p != nil {
		path := pathStream
		if r.backend == BackendRDMA {
			path = pathRDMA
		}
		if l.path != pathNone && l.path != path {
			ctx, cancel := context.WithDeadline(context.Background(), clockBase.Add(time.Duration(r.stop.deadline.Load())))
			var err error
			if path == pathRDMA {
				err = p.fence(ctx) // the target delivered what came on the connection
			} else {
				err = p.rdmaBarrier(ctx)
			}
			cancel()
			if err != nil {
				l.a.log.Warn("p2p could not order notifications between rdma and the connection", "peer", p.name, "err", err)
			}
		}
		l.path = path
	}
	return l.a.execute(r)
}

// rdmaBarrier waits until the channel's posts are over (their
// notifications acknowledged by the target's device, or failed), then
// sends a barrier on the connection: the target delivers what comes after
// it once its responder has delivered every notification up to the last
// one acknowledged.
func (p *peer) rdmaBarrier(ctx context.Context) error {
	p.rcMu.Lock()
	ch := p.rc
	p.rcMu.Unlock()
	if ch == nil {
		return nil
	}
	stop := context.AfterFunc(ctx, func() {
		ch.mu.Lock()
		ch.cond.Broadcast()
		ch.mu.Unlock()
	})
	defer stop()
	ch.mu.Lock()
	for len(ch.posts) > 0 && ch.state != chDown && ctx.Err() == nil {
		ch.cond.Wait()
	}
	last := ch.acked // every notification of the posts over: acknowledged, or never to be delivered
	ch.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	return p.control(header{op: opRDMABarrier, aux: last}, nil)
}

// rdmaChannel is the connection's RDMA channel, connected on first use.
func (p *peer) rdmaChannel() (*rdmaChan, error) {
	p.rcMu.Lock()
	defer p.rcMu.Unlock()
	if p.rc != nil || p.rcErr != nil {
		return p.rc, p.rcErr
	}
	if p.a.rdma == nil {
		return nil, p.a.rdmaErr
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	ch, err := newRDMAChan(p.a, p)
	if err == nil {
		if err = ch.start(); err != nil {
			ch = nil
		}
	}
	if err != nil {
		p.rcErr = fmt.Errorf("p2p: RDMA to %s: %w", p.name, err)
		return nil, p.rcErr
	}
	p.rc = ch
	p.a.log.Info("p2p RDMA connected", "peer", p.name, "device", p.a.rdma.info.String(), "qps", ch.String())
	return ch, nil
}

// rdmaHandshake sends an RDMA connect with payload and waits for the
// peer's accept (or refusal, or the connection's end).
func (p *peer) rdmaHandshake(payload []byte, timeout time.Duration) ([]byte, error) {
	w := make(chan hsReply, 1)
	p.mu.Lock()
	if p.failed != nil {
		err := p.failed
		p.mu.Unlock()
		return nil, err
	}
	p.hsSeq++
	id := p.hsSeq
	p.hs[id] = w
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.hs, id)
		p.mu.Unlock()
	}()
	if err := p.control(header{op: opRDMAConnect, aux: id}, payload); err != nil {
		return nil, err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case rep := <-w:
		if rep.err != "" {
			return nil, fmt.Errorf("%s refused the RDMA connection: %s", p.name, rep.err)
		}
		return rep.payload, nil
	case <-p.closed:
		return nil, p.err()
	case <-t.C:
		return nil, fmt.Errorf("%w: %s did not answer an RDMA connection in %v", ErrTimeout, p.name, timeout)
	}
}

type hsReply struct {
	payload []byte
	err     string
}

// serveRDMAConnect answers a peer's RDMA connect (reader goroutine: the
// QPs are made on a goroutine of their own, the answer goes through the
// responder).
func (p *peer) serveRDMAConnect(h header) error {
	payload := make([]byte, h.length)
	if _, err := io.ReadFull(p.br, payload); err != nil {
		return err
	}
	a := p.a
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.wg.Add(1)
	a.mu.Unlock()
	go func() {
		defer a.wg.Done()
		out, err := p.acceptRDMA(payload)
		if err != nil {
			a.log.Warn("p2p refused an RDMA connection", "peer", p.name, "err", err)
			p.queue(reply{op: opRDMAAccept, aux: h.aux, err: err.Error()})
			return
		}
		p.queue(reply{op: opRDMAAccept, aux: h.aux, payload: out})
	}()
	return nil
}

// rdmaAccepted hands the peer's accept to the handshake waiting for it.
func (p *peer) rdmaAccepted(h header) error {
	b := make([]byte, h.length)
	if _, err := io.ReadFull(p.br, b); err != nil {
		return err
	}
	rep := hsReply{payload: b}
	if h.flags&flagError != 0 {
		rep = hsReply{err: string(b)}
	}
	p.mu.Lock()
	w := p.hs[h.aux]
	p.mu.Unlock()
	if w != nil {
		w <- rep
	}
	return nil
}

// closeRDMA ends the connection's channel and responder (the connection
// failed).
func (p *peer) closeRDMA(err error) {
	p.rcMu.Lock()
	ch := p.rc
	p.rcMu.Unlock()
	if ch != nil {
		ch.shutdown(err)
	}
	p.rmu.Lock()
	rs := p.rsp
	p.rsp = nil
	p.rmu.Unlock()
	if rs != nil {
		rs.close()
	}
}

// rdmaPath says whether r can go over RDMA, and why not: both agents have
// a device on a common fabric, every region of the request is registered
// with them, and the channel connects.
func (a *Agent) rdmaPath(r *Request) (ok, expected bool, why string) {
	ra := r.ra
	if a.rdma == nil {
		return false, false, "no RDMA device here: " + a.rdmaErr.Error()
	}
	if ra.info.RDMA == nil {
		return false, false, r.peer + " has no RDMA device"
	}
	if ok, why := sameFabric(&a.rdma.info, ra.info.RDMA); !ok {
		return false, false, "no common fabric: " + why
	}
	expected = !ra.sameHost || a.cfg.RDMASameHost
	if !expected {
		return false, false, "same host"
	}
	for i := range r.segs {
		s := &r.segs[i]
		if s.local.rd == nil {
			return false, true, fmt.Sprintf("local %v region %d is not registered with %s", s.local.info.Type, s.local.info.ID, a.rdma.info.Device)
		}
		if len(ra.info.Keys[s.rinfo.ID]) == 0 {
			return false, true, fmt.Sprintf("%s published no RDMA keys for its %v region %d (it could not register it)", r.peer, s.rinfo.Type, s.rinfo.ID)
		}
	}
	a.mu.RLock()
	p := a.peers[r.peer]
	a.mu.RUnlock()
	if p == nil {
		return false, true, "not connected"
	}
	if _, err := p.rdmaChannel(); err != nil {
		return false, true, err.Error()
	}
	return true, true, ""
}

// errStrictRDMA is MakeRequest's error under Config.Strict.
func errStrictRDMA(peer, why string) error {
	return fmt.Errorf("p2p: RDMA to %s expected but unusable (GCCL_STRICT=1): %s: %w", peer, why, ErrNotSupported)
}
