package comm

import (
	"encoding/binary"
	"fmt"

	"github.com/gccl/gccl/transport"
)

// Send/Recv of device buffers. On a single-host communicator a send from a
// PeerDeviceBuffer does not move its bytes through the transport: it sends
// the receiver a description of the buffer (DeviceEngine.AppendExport) and
// waits for the answer. A receiver whose buffer is a PeerDeviceBuffer maps
// the sender's buffer, copies it into its own with its engine's copy
// engines, and answers "copied": nothing crosses to host memory. Any other
// receiver (a host slice, a device buffer the engine cannot reach) answers
// "send the data", and the sender stages its buffer through host memory
// and sends it as a host send would. So a device send matches any receive,
// as with staging, and only the pair that can go direct does; the price is
// one round trip per message, which the copy it saves dwarfs.
//
// A receive into a PeerDeviceBuffer takes whichever comes: a description,
// or the data of a sender that staged (a host send, a device buffer whose
// memory has no IPC handle), into host staging copied to the device after.
//
// The answers travel on the connection the receiver's own sends use, so a
// rank reading from a peer sorts what arrives by its tag kind: answers go
// to the device send waiting for one (a peer sends at most one per waiting
// send, and sends to one peer go one at a time), everything else to the
// receive from that peer.

// A description message: the buffer's length in bytes (8), the
// description's length (2), padding (6), the description.
const (
	p2pDescHeader = 16
	p2pDescLen    = p2pDescHeader + MaxDeviceDescLen
)

// Answers.
const (
	p2pCopied   byte = 1
	p2pSendData byte = 2
)

// Device states of a group op (p2pProgress.dev).
const (
	devNone   uint8 = iota // a host op, or a device op staged through host memory
	devOffer               // send: the description is not sent yet
	devAwait               // send: the description is sent, the answer not in yet
	devMaybe               // receive into a device buffer: nothing arrived yet
	devAnswer              // receive: the answer (p2pProgress.answer) is not sent yet
)

// prepareDeviceGroup decides, for each op of a group on device buffers,
// whether it may go direct, exports the buffers of the sends that do, and
// stages the rest: a send's device buffer is copied to host staging, a
// receive gets host staging copied back after (stageOut). held says the
// buffers' streams were waited for already.
func (c *Comm) prepareDeviceGroup(ops []P2P, st []p2pProgress, held bool) error {
	direct := !c.multiHost && c.ep.SlotSize() >= p2pDescLen
	d := &c.dev
	if need := len(ops) * MaxDeviceDescLen; direct && cap(d.p2pDescs) < need {
		d.p2pDescs = make([]byte, need)
	}
	var readied DeviceEngine
	ready := func(op *P2P, what string) error {
		// The work queued on the buffer before the call must be complete:
		// peers read and write it once this rank describes it (its own copy
		// is on another stream), and staging copies it on the legacy
		// default stream, which does not wait for the device's other
		// streams.
		eng := peerEngine(op.v.dev)
		if held || eng == nil || eng == readied {
			return nil
		}
		readied = eng
		if err := eng.Ready(); err != nil {
			return fmt.Errorf("waiting for the work queued on the device %s buffer: %w", what, err)
		}
		return nil
	}
	canGo := func(op *P2P) bool {
		return direct && op.v.addr && op.peer != c.rank && len(op.v.b) > 0
	}
	// Sends first: a send overlapping a receive of the group is seen on
	// the receive's device addresses, before they get host staging.
	for i := range ops {
		op := &ops[i]
		if op.recv || op.v.dev == nil {
			continue
		}
		if err := ready(op, "send"); err != nil {
			return err
		}
		if canGo(op) && !overlapsRecv(ops, op.v.b) {
			eng := op.v.dev.(PeerDeviceBuffer).Engine()
			off := i * MaxDeviceDescLen
			desc, err := eng.AppendExport(d.p2pDescs[off:off:off+MaxDeviceDescLen], addrOf(op.v.b), len(op.v.b))
			if err == nil && len(desc) > MaxDeviceDescLen {
				err = fmt.Errorf("gccl: internal error: %s exported a description longer than %d bytes", eng.Name(), MaxDeviceDescLen)
			}
			if err == nil {
				st[i].dev, st[i].descLen = devOffer, len(desc)
				c.logDirectP2P(eng)
				continue
			}
			// Memory with no IPC handle (some allocators') is staged.
			c.log.Debug("device send buffer not shareable, host staging: "+err.Error(), "subsys", "P2P")
		}
		if err := stageSend(op); err != nil {
			return err
		}
	}
	for i := range ops {
		op := &ops[i]
		if !op.recv || op.v.dev == nil {
			continue
		}
		// Staged, the receive's staging is copied over it at the end
		// (stageOut).
		if err := ready(op, "receive"); err != nil {
			return err
		}
		if canGo(op) {
			st[i].dev = devMaybe
			continue
		}
		op.v.staging()
	}
	return nil
}

func (c *Comm) logDirectP2P(eng DeviceEngine) {
	if !c.dev.p2pLogged {
		c.dev.p2pLogged = true
		c.log.Info("device buffers: Send/Recv copies straight between the peers' device buffers, mapped through "+eng.Name(), "subsys", "P2P")
	}
}

// stepDevice moves op i of a running group along the direct protocol. It
// reports whether anything changed; left counts the ops not ended.
func (c *Comm) stepDevice(ops []P2P, st []p2pProgress, i int, left *int) (bool, error) {
	op, s := &ops[i], &st[i]
	switch s.dev {
	case devOffer:
		snd, err := c.sender(op.peer)
		if err != nil {
			return false, err
		}
		b, ok, err := snd.TryReserve(p2pDescLen)
		if err != nil || !ok {
			return false, err
		}
		clear(b)
		binary.LittleEndian.PutUint64(b, uint64(len(op.v.b)))
		binary.LittleEndian.PutUint16(b[8:], uint16(s.descLen))
		off := i * MaxDeviceDescLen
		copy(b[p2pDescHeader:], c.dev.p2pDescs[off:off+s.descLen])
		snd.Commit(transport.MakeTag(tagP2PDesc, s.tag.Seq()))
		s.dev = devAwait
		return true, nil
	case devAwait, devMaybe:
		r, err := c.receiver(op.peer)
		if err != nil {
			return false, err
		}
		m, t, ok, err := r.TryNext()
		if err != nil || !ok {
			return false, err
		}
		if t.Kind() == tagP2PAnswer {
			return true, c.takeAnswer(ops, st, op.peer, m, t, r, left)
		}
		if s.dev == devAwait {
			if recvPending(ops, st, op.peer) {
				return false, nil // the group's receive from the peer takes it
			}
			return false, c.exec.check(op.peer, m, 1, t, transport.MakeTag(tagP2PAnswer, s.tag.Seq()))
		}
		if t.Kind() == tagP2PDesc {
			if err := c.copyDirect(op, s, m, t); err != nil {
				return false, err
			}
			r.Release()
			s.dev, s.answer = devAnswer, p2pCopied
			return true, nil
		}
		// The sender staged its buffer: its data lands in host staging,
		// copied to the device at the end (stageOut).
		op.v.staging()
		s.dev = devNone
		return true, nil
	case devAnswer:
		snd, err := c.sender(op.peer)
		if err != nil {
			return false, err
		}
		b, ok, err := snd.TryReserve(1)
		if err != nil || !ok {
			return false, err
		}
		b[0] = s.answer
		snd.Commit(transport.MakeTag(tagP2PAnswer, s.tag.Seq()))
		if s.answer == p2pCopied {
			s.done, s.ended = len(op.v.b), true
			*left--
		}
		s.dev = devNone
		return true, nil
	}
	return false, fmt.Errorf("gccl: internal error: group op in device state %d", s.dev)
}

// p2pControl handles a message of the direct protocol that a receive in
// host memory (or staged) finds first: an answer for a device send of the
// group, or a sender's description, answered "send the data". It reports
// handled=false for anything else (data, which the caller checks).
func (c *Comm) p2pControl(ops []P2P, st []p2pProgress, i int, m []byte, t transport.Tag, r transport.Receiver, left *int) (handled bool, err error) {
	op, s := &ops[i], &st[i]
	switch {
	case t.Kind() == tagP2PAnswer:
		return true, c.takeAnswer(ops, st, op.peer, m, t, r, left)
	case t.Kind() == tagP2PDesc && s.done == 0:
		if _, err := c.readDesc(op, s, m, t); err != nil {
			return true, err
		}
		r.Release()
		s.dev, s.answer = devAnswer, p2pSendData
		return true, nil
	}
	return false, nil
}

// readDesc checks a sender's description message m against receive op
// and returns the description of the sender's buffer in it.
func (c *Comm) readDesc(op *P2P, s *p2pProgress, m []byte, t transport.Tag) ([]byte, error) {
	if t.Seq() != s.tag.Seq() {
		return nil, c.exec.check(op.peer, m, len(m), transport.MakeTag(tagP2P, t.Seq()), s.tag)
	}
	if len(m) != p2pDescLen {
		return nil, c.exec.check(op.peer, m, p2pDescLen, t, t)
	}
	le := binary.LittleEndian
	if n := le.Uint64(m); n != uint64(len(op.v.b)) {
		return nil, fmt.Errorf("%w: peer sends %d bytes, the receive buffer holds %d (counts differ between ranks)", ErrMismatch, n, len(op.v.b))
	}
	dl := int(le.Uint16(m[8:]))
	if dl > MaxDeviceDescLen {
		return nil, fmt.Errorf("%w: a device buffer description of %d bytes", ErrMismatch, dl)
	}
	return m[p2pDescHeader : p2pDescHeader+dl], nil
}

// copyDirect maps the sender's buffer its description message m names and
// copies it into op's device buffer, waiting for the copy.
func (c *Comm) copyDirect(op *P2P, s *p2pProgress, m []byte, t transport.Tag) error {
	desc, err := c.readDesc(op, s, m, t)
	if err != nil {
		return err
	}
	eng := op.v.dev.(PeerDeviceBuffer).Engine()
	c.logDirectP2P(eng)
	src, err := eng.Import(desc, len(op.v.b))
	if err != nil {
		return fmt.Errorf("mapping the peer's device send buffer: %w", err)
	}
	if err := copyIfApart(eng, addrOf(op.v.b), src, len(op.v.b)); err != nil {
		return err
	}
	return eng.Wait()
}

// takeAnswer gives a receiver's answer m to the group's device send to
// peer that waits for it, and releases it.
func (c *Comm) takeAnswer(ops []P2P, st []p2pProgress, peer int, m []byte, t transport.Tag, r transport.Receiver, left *int) error {
	for j := range ops {
		op, s := &ops[j], &st[j]
		if op.peer != peer || op.recv || s.dev != devAwait {
			continue
		}
		if err := c.exec.check(peer, m, 1, t, transport.MakeTag(tagP2PAnswer, s.tag.Seq())); err != nil {
			return err
		}
		answer := m[0]
		r.Release()
		switch answer {
		case p2pCopied:
			s.done, s.ended, s.dev = len(op.v.b), true, devNone
			*left--
		case p2pSendData:
			if err := stageSend(op); err != nil {
				return err
			}
			s.src, s.dev = op.v.b, devNone
		default:
			return fmt.Errorf("%w: peer answered a device send with %d", ErrMismatch, answer)
		}
		return nil
	}
	return fmt.Errorf("%w: peer answered a device send #%d this rank is not waiting on (operations must be issued in the same order on every rank)", ErrMismatch, t.Seq())
}

// stageSend gives send op's device buffer host staging and copies the
// buffer into it, for the transport to send as a host send.
func stageSend(op *P2P) error {
	op.v.staging()
	if err := op.v.dev.CopyToHost(op.v.b); err != nil {
		return fmt.Errorf("staging a device send buffer: %w", err)
	}
	return nil
}

// recvPending reports whether the group still receives from peer.
func recvPending(ops []P2P, st []p2pProgress, peer int) bool {
	for j := range ops {
		if ops[j].recv && ops[j].peer == peer && !st[j].ended {
			return true
		}
	}
	return false
}
