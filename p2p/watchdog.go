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
	var expired []uint64
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
			if silent := time.Duration(now - p.lastRecv.Load()); silent > a.cfg.PeerTimeout {
				p.fail(fmt.Errorf("%w: %s sent nothing for %v (PeerTimeout)", ErrRemoteDisconnect, p.name, silent.Round(time.Millisecond)), true)
				continue
			}
			if time.Duration(now-p.lastSend.Load()) > a.cfg.PeerTimeout/4 {
				p.queue(reply{op: opPing})
			}
			expired = expired[:0]
			p.mu.Lock()
			for id, r := range p.inflight {
				if now > r.stop.deadline.Load() {
					expired = append(expired, id)
				}
			}
			p.mu.Unlock()
			for _, id := range expired {
				if r := p.take(id); r != nil { // not finished (and posted again) meanwhile
					r.finish(r.timeoutErr())
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
