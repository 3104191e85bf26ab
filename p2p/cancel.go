package p2p

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

var (
	// ErrCanceled: the post was cancelled (Request.Cancel), or a region it
	// used was deregistered while it was in flight.
	ErrCanceled = errors.New("p2p: request canceled")
	// ErrStalled: the post made no progress for Config.StallTimeout while
	// its peer was alive (answering on its connection); a dead or silent
	// peer is ErrRemoteDisconnect instead. A stall's error is of the
	// timeout kind too (errors.Is(err, ErrTimeout)), but a timeout is not
	// a stall.
	ErrStalled = errors.New("p2p: transfer stalled")

	errDeregistered = fmt.Errorf("%w: a region it uses was deregistered while it was in flight", ErrCanceled)
)

// stallError is a stall: ErrStalled, and of the timeout kind.
type stallError struct{ msg string }

func (e *stallError) Error() string { return e.msg }

func (e *stallError) Is(target error) bool {
	return target == ErrStalled || errors.Is(ErrTimeout, target)
}

// stalled is a stall's error.
func stalled(format string, args ...any) error {
	return &stallError{msg: ErrStalled.Error() + ": " + fmt.Sprintf(format, args...)}
}

// PartReport is what one part of a cancelled post moved.
type PartReport struct {
	Bytes  uint64 // the part's size
	Landed uint64 // bytes known to have landed at the destination (a lower bound)
	Done   bool   // the whole part landed (and was notified, when it has a notification)
}

// CancelReport is what Request.Cancel found.
type CancelReport struct {
	// Canceled is false when the post was not in progress any more (it
	// had finished, or failed: Err says how).
	Canceled bool
	Err      error // the post's outcome: ErrCanceled when Canceled
	Parts    []PartReport
	Landed   uint64 // the sum of the parts' Landed
}

// canceler is a backend that takes a post out of flight itself on Cancel
// (tcp, rdma); the copy backends stop at their next block.
type canceler interface {
	cancel(ctx context.Context, r *Request, err error) error
}

// lander is a backend that knows how many bytes of each part of a post
// landed (tcp, rdma).
type lander interface {
	landed(r *Request, out []uint64) bool
}

// Cancel stops the current post of the request and waits until nothing of
// it can still land: no more of it is posted or copied; work already handed
// to the RDMA device completes or is flushed (the QPs go to ERR and are
// replaced, on both sides); frames already sent over tcp are landed by the
// target before Cancel returns (a fence through the connection); a copy
// stops at its next block. Then the post fails with ErrCanceled (Wait
// returns it) and its memory is its owner's again: the buffers may be
// reused and the regions deregistered. The report says how many bytes of
// each part landed; a part not Done may have landed in part beyond that
// (a partial transfer, as after a timeout), and was not notified. A post
// that is not in progress is left alone (Canceled false).
//
// If ctx ends first, Cancel returns an error: the post still fails, but
// whether anything of it can still land at the target is not confirmed.
func (r *Request) Cancel(ctx context.Context) (CancelReport, error) {
	return r.cancelWith(ctx, ErrCanceled, stopCanceled)
}

func (r *Request) cancelWith(ctx context.Context, err error, why int32) (CancelReport, error) {
	r.mu.Lock()
	if r.state.Load() != reqPosted {
		rep := CancelReport{Err: r.err}
		if r.state.Load() == reqIdle {
			rep.Err = errors.New("p2p: request not posted")
		}
		r.mu.Unlock()
		return r.report(rep, r.id), nil
	}
	id, done := r.id, r.done
	r.stop.why.CompareAndSwap(0, why) // copies stop at their next block; a queued post does not start
	r.mu.Unlock()
	if l := r.a.laneOf(r.peer); l != nil && l.remove(r) {
		r.finish(err) // it never started
	}
	var berr error
	if c, ok := r.spec.backend.(canceler); ok {
		berr = c.cancel(ctx, r, err)
	}
	select {
	case <-done:
	default:
		select {
		case <-done:
		case <-ctx.Done():
			return CancelReport{Canceled: true, Err: err}, fmt.Errorf("p2p: cancel of a %v to %s: %w (whether the rest can still land is not confirmed)", r.op, r.peer, ctx.Err())
		}
	}
	r.mu.Lock()
	rep := CancelReport{Canceled: true, Err: r.err}
	if r.id != id {
		rep.Err = err // posted again since
	}
	r.mu.Unlock()
	rep = r.report(rep, id)
	if berr != nil {
		return rep, fmt.Errorf("p2p: cancel of a %v to %s: %w", r.op, r.peer, berr)
	}
	return rep, nil
}

// report fills rep's parts for post id (the bytes are the last post's: a
// post made meanwhile by another goroutine is not told apart).
func (r *Request) report(rep CancelReport, id uint64) CancelReport {
	rep.Parts = make([]PartReport, len(r.parts))
	landed := make([]uint64, len(r.parts))
	exact := false
	if l, ok := r.spec.backend.(lander); ok {
		exact = l.landed(r, landed)
	}
	done := int(r.partsDone.Load())
	var copied uint64 // the copy backends' count, all parts together
	if !exact {
		copied = r.stop.landed.Load()
	}
	for i := range r.parts {
		p := &rep.Parts[i]
		p.Bytes = r.parts[i].bytes
		p.Done = i < done
		switch {
		case p.Done:
			p.Landed = p.Bytes
		case exact:
			p.Landed = min(landed[i], p.Bytes)
		default:
			p.Landed = min(copied, p.Bytes)
		}
		if !exact {
			copied -= min(copied, p.Bytes)
		}
		rep.Landed += p.Landed
	}
	return rep
}

// cancelUsers cancels the posts in flight that use region g (DeregisterMem
// of it), and returns once nothing of them can land.
func (a *Agent) cancelUsers(g *Region) {
	a.postMu.Lock()
	var users []*Request
	for r := range a.posts {
		if slices.Contains(r.local.pinned, g) || r.self && slices.Contains(r.remote.pinned, g) {
			users = append(users, r)
		}
	}
	a.postMu.Unlock()
	for _, r := range users {
		ctx, cancel := context.WithTimeout(context.Background(), a.cfg.RequestTimeout)
		if _, err := r.cancelWith(ctx, errDeregistered, stopDeregistered); err != nil {
			a.log.Warn("p2p deregistration: a request using the region did not confirm its end", "region", g.info.ID, "peer", r.peer, "err", err)
		}
		cancel()
	}
}

// laneOf is peer's lane, if any.
func (a *Agent) laneOf(peer string) *lane {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.lanes[peer]
}

// remove takes r out of the lane's queue, if it is still there.
func (l *lane) remove(r *Request) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, q := range l.q {
		if q == r {
			l.q = append(l.q[:i], l.q[i+1:]...)
			return true
		}
	}
	return false
}

// PeerFailure is a peer's request to this agent that failed on the peer's
// side after it started (cancelled, timed out, stalled, or its device
// failed): its parts after PartsDone will not be notified, and some of
// their bytes may have landed.
type PeerFailure struct {
	Peer      string
	Request   uint64 // the peer's post ID
	PartsDone int
	Err       string
	At        time.Time
}

const maxFailures = 1024

// reportFailure tells the target of a post that it failed: a cancelled or
// stalled post on any backend, and any failure of a post the target runs no
// code for (rdma, shm, pvm, cudaipc). Not when the target knows already (it
// refused the post, or the connection is gone), nor a tcp post that timed
// out (its target saw its frames stop, and the protocol is as before).
func (r *Request) reportFailure(err error) {
	p := r.p
	if p == nil || errors.Is(err, ErrRemoteDisconnect) || errors.Is(err, ErrClosed) || errors.Is(err, ErrOutOfBounds) ||
		!r.spec.initiatorChecks && !errors.Is(err, ErrCanceled) && !errors.Is(err, ErrStalled) {
		return
	}
	msg := fmt.Sprintf("%v of %d bytes in %d parts: %v", r.op, r.bytes, len(r.parts), err)
	if len(msg) > 4096 {
		msg = msg[:4096]
	}
	p.queue(reply{op: opAbort, req: r.id, aux: uint64(r.partsDone.Load()), payload: []byte(msg)})
}

// deliverFailure records a peer's failure report.
func (a *Agent) deliverFailure(f PeerFailure) {
	a.notifMu.Lock()
	if len(a.failures) >= maxFailures {
		a.failures = a.failures[1:]
	}
	a.failures = append(a.failures, f)
	a.notifMu.Unlock()
	a.log.Info("p2p a peer's request to this agent failed", "peer", f.Peer, "parts_done", f.PartsDone, "err", f.Err)
	select {
	case a.notifCh <- struct{}{}:
	default:
	}
}

// GetFailures returns the failure reports of peers' requests received
// since the last call, oldest first.
func (a *Agent) GetFailures() []PeerFailure {
	a.notifMu.Lock()
	defer a.notifMu.Unlock()
	f := a.failures
	a.failures = nil
	return f
}

// WaitEvents blocks until there are notifications or failure reports, and
// returns both as GetNotifs and GetFailures do: a target that waits for a
// request's notifications learns here that it will not get them.
func (a *Agent) WaitEvents(ctx context.Context) (map[string][][]byte, []PeerFailure, error) {
	for {
		n, f := a.GetNotifs(), a.GetFailures()
		if n != nil || f != nil {
			return n, f, nil
		}
		select {
		case <-a.notifCh:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-a.done:
			return nil, nil, ErrClosed
		}
	}
}

// fence returns once the peer has processed every frame sent on the
// connection before it (a ping answered in order), or ctx ends.
func (p *peer) fence(ctx context.Context) error {
	w := make(chan struct{})
	p.mu.Lock()
	if p.failed != nil {
		p.mu.Unlock()
		return nil // nothing more lands through a closed connection
	}
	p.hsSeq++
	id := p.hsSeq
	p.pongs[id] = w
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.pongs, id)
		p.mu.Unlock()
	}()
	p.queue(reply{op: opPing, aux: id})
	select {
	case <-w:
		return nil
	case <-p.closed:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s did not answer a fence: %w", p.name, ctx.Err())
	}
}
