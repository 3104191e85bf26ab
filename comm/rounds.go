package comm

import "fmt"

// The arrival and departure rounds of the paths that work on peers'
// memory directly (symmetric memory, symexec.go; device buffers,
// devexec.go). Their protocol, the same for both:
//   - arrive: every rank sends every peer its arrival record (what it runs,
//     where its buffers are) and checks each peer's against its own. A bad
//     record does not end the round: every record is received, so that the
//     ranks stay in step, and the rank then does no share of the work.
//   - agree: what to do follows from the records alone, which every rank
//     has, so every rank decides alike (the device path may fall back to
//     host staging together).
//   - depart: every rank that arrived tells every peer it is done with
//     their buffers, or that it failed, and waits for theirs: no rank
//     returns while a peer may still touch its buffers, and a failure
//     anywhere fails the call everywhere.
//
// The rounds are ordinary transport messages under the executor's tag, so
// they get its waits, timeout, watchdog and failure handling, and a rank
// that took another path than its peer fails with ErrMismatch.

// roundKind says whose records an arrival round carries.
type roundKind uint8

const (
	symArrival roundKind = iota // symRecord, checked by symResolve
	devArrival                  // devRecord, checked by devResolve
	cmaArrival                  // cmaRecord, checked by cmaResolve
)

// check checks record rec of rank p against this rank's own (mine), and
// keeps what it says about p's buffers.
func (c *Comm) check(kind roundKind, p int, rec, mine []byte) error {
	switch kind {
	case symArrival:
		return c.symResolve(p, rec, mine)
	case cmaArrival:
		return c.cmaResolve(p, rec, mine)
	}
	return c.devResolve(p, rec, mine)
}

// exchange is the arrival round: it sends msg to every peer and checks
// each peer's record, and this rank's own first (p == c.rank, rec ==
// msg). It returns the first failed check of a peer's record as failed, an
// *OpError naming the peer; err is the transport's error, or the own
// record's.
func (c *Comm) exchange(msg []byte, kind roundKind) (failed, err error) {
	if err := c.announce(msg, kind); err != nil {
		return nil, err
	}
	return c.gatherArrivals(msg, kind)
}

// announce is exchange's first half: it checks this rank's own record
// and sends it to every peer. Work on this rank's own buffers may run
// before the second half, gatherArrivals, while the peers' records travel.
func (c *Comm) announce(msg []byte, kind roundKind) error {
	if err := c.check(kind, c.rank, msg, msg); err != nil {
		return err
	}
	return c.sendRound(msg)
}

// gatherArrivals is exchange's second half: it receives and checks every
// peer's record.
func (c *Comm) gatherArrivals(msg []byte, kind roundKind) (failed, err error) {
	x := &c.exec
	for i := 1; i < c.size; i++ {
		p := (c.rank - i + c.size) % c.size
		m, rcv, err := x.next(p, len(msg), x.tag)
		if err != nil {
			return nil, err
		}
		err = c.check(kind, p, m, msg)
		rcv.Release()
		if err != nil && failed == nil {
			failed = &OpError{Op: x.op, Rank: c.rank, Seq: x.seq, Peer: p, Err: err}
		}
	}
	return failed, nil
}

// A rank's departure: whether it did its share.
const (
	departOK     byte = 0
	departFailed byte = 1
	// departCannot: the rank could not do its share on this path at all
	// (the single-copy path: it may not read its peers' memory), and
	// touched nothing of its output; the ranks then run the call another
	// way together.
	departCannot byte = 2
)

// depart is the departure round: it sends every peer one byte, whether
// this rank failed its share, and waits for theirs. A peer's failure
// fails the call.
func (c *Comm) depart(failed bool) error {
	code := departOK
	if failed {
		code = departFailed
	}
	err, _ := c.departWith(code)
	return err
}

// departWith is the departure round with this rank's code. peerErr names
// a peer that failed; cannot is the lowest rank that departed with
// departCannot (this one included), -1 if none: every rank learns the same.
func (c *Comm) departWith(code byte) (peerErr error, cannot int) {
	x := &c.exec
	c.departure[0] = code
	if err := c.sendRound(c.departure[:]); err != nil {
		return err, -1
	}
	cannot = -1
	if code == departCannot {
		cannot = c.rank
	}
	for i := 1; i < c.size; i++ {
		p := (c.rank - i + c.size) % c.size
		m, rcv, err := x.next(p, 1, x.tag)
		if err != nil {
			return err, -1
		}
		got := m[0]
		rcv.Release()
		switch {
		case got == departCannot:
			if cannot < 0 || p < cannot {
				cannot = p
			}
		case got != departOK && peerErr == nil:
			peerErr = &OpError{Op: x.op, Rank: c.rank, Seq: x.seq, Peer: p,
				Err: fmt.Errorf("peer rank %d could not do its share of the operation (see its error); the result is incomplete", p)}
		}
	}
	return peerErr, cannot
}

// sendRound sends msg to every peer, in ring order from this rank, under
// the executor's current tag.
func (c *Comm) sendRound(msg []byte) error {
	x := &c.exec
	for i := 1; i < c.size; i++ {
		p := (c.rank + i) % c.size
		slot, s, err := x.reserve(p, len(msg))
		if err != nil {
			return err
		}
		copy(slot, msg)
		s.Commit(x.tag)
	}
	return nil
}
