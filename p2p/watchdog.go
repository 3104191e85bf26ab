package p2p

import (
	"fmt"
	"time"
)

// watchdog fails requests past their deadline, sends keepalives, and drops
// peers that stayed silent for PeerTimeout.
func (a *Agent) watchdog() {
	defer a.wg.Done()
	tick := min(a.cfg.RequestTimeout, a.cfg.PeerTimeout) / 4
	tick = max(min(tick, 100*time.Millisecond), time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	var expired, stalledIDs []uint64
	st := a.cfg.StallTimeout
	for {
		select {
		case <-a.done:
			return
		case <-t.C:
		}
		now := monoNow()
		a.mu.RLock()
		peers := a.livePeersLocked()
		a.mu.RUnlock()
		for _, p := range peers {
			p.rcMu.Lock()
			if ch := p.rc; ch != nil {
				p.rcMu.Unlock()
				ch.watch()
			} else {
				p.rcMu.Unlock()
			}
			if silent := time.Duration(now - p.lastRecv.Load()); silent > a.cfg.PeerTimeout {
				p.fail(fmt.Errorf("%w: %s sent nothing for %v (PeerTimeout)", ErrRemoteDisconnect, p.name, silent.Round(time.Millisecond)), true)
				continue
			}
			if time.Duration(now-p.lastSend.Load()) > a.cfg.PeerTimeout/4 {
				p.queue(reply{op: opPing})
			}
			expired, stalledIDs = expired[:0], stalledIDs[:0]
			// A tcp post that made no progress for StallTimeout while the
			// peer answers stalled; rdma posts are the channel's business.
			alive := time.Duration(now-p.lastRecv.Load()) <= a.cfg.PeerTimeout/2
			p.mu.Lock()
			for id, r := range p.inflight {
				switch {
				case now > r.stop.deadline.Load():
					expired = append(expired, id)
				case st > 0 && alive && r.backend == BackendTCP && time.Duration(now-r.progress.Load()) > st:
					stalledIDs = append(stalledIDs, id)
				}
			}
			p.mu.Unlock()
			for _, id := range expired {
				if r := p.take(id); r != nil { // not finished (and posted again) meanwhile
					r.finish(r.timeoutErr())
				}
			}
			for _, id := range stalledIDs {
				if r := p.take(id); r != nil {
					r.finish(stalled("%v to %s: nothing sent, landed or acknowledged for %v while it answers", r.op, r.peer,
						time.Duration(now-r.progress.Load()).Round(time.Millisecond)))
				}
			}
		}
	}
}

// clockBase anchors monoNow. Deadlines and liveness are measured on the
// monotonic clock: a step of the wall clock (NTP, an operator) must neither
// time out every request nor drop every peer at once.
var clockBase = time.Now()

// monoNow is nanoseconds on the monotonic clock since clockBase.
func monoNow() int64 { return int64(time.Since(clockBase)) }
