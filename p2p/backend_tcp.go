package p2p

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
	"unsafe"

	"github.com/gccl/gccl/internal/cuda"
)

// The tcp backend: everything the others cannot do (another host; shared
// memory, process_vm or CUDA IPC unusable or off; a peer's file). Requests
// go as frames on the one connection per peer pair; the target's progress
// goroutine checks every descriptor against its regions, lands WRITE data
// straight in the region and serves READs from it. The side that holds a
// VRAM end stages it through pinned bounce buffers. A post finishes when
// the target has acknowledged it (WRITE) or all its data has landed (READ).
var tcpSpec = backendSpec{
	backend: tcpBackend{}, kind: BackendTCP, name: "tcp", async: true, postInline: true, postInlineIf: tcpPostsInline,
	cost: costModel{fixed: 40 * time.Microsecond, perPiece: 300 * time.Nanosecond, perPart: 10 * time.Microsecond, bytesPerSec: 1.5e9},
}

type tcpBackend struct{}

// serves takes every request to a peer: it is the last resort, and says
// why nothing faster could take it.
func (tcpBackend) serves(pl placement) (bool, string) {
	if pl.self {
		return false, ""
	}
	switch {
	case pl.remoteType == FILE:
		return true, "a peer's file is reached through its agent"
	case pl.remoteType == VRAM && !pl.sameHost:
		return true, "another host; the target stages its VRAM through pinned buffers"
	case pl.remoteType == VRAM && pl.ipcOff:
		return true, "same host, CUDA IPC disabled (GCCL_SHM_DISABLE, GCCL_P2P_CUDAIPC_DISABLE or Config); the target stages its VRAM"
	case pl.remoteType == VRAM:
		return true, "same host, but the target's VRAM is not opened here (same process, no CUDA driver here, or no IPC handle); the target stages it"
	case !pl.sameHost:
		return true, "another host"
	case pl.shmOff:
		return true, "same host, shared memory disabled (GCCL_SHM_DISABLE or Config.DisableSHM) and process_vm unusable"
	case pl.localType == VRAM:
		return true, "same host, the target's regions are not shared, and process_vm cannot reach VRAM"
	}
	return true, "same host, but the target's regions are not shared and process_vm is unusable"
}

func (tcpBackend) prepare(*Request) error { return nil }

// cancel takes the post out of flight (its memory is not touched after
// that: see retire), then fences the connection: once the peer answered,
// it has landed every frame of the post that went out (the rest of a WRITE
// frame cut short is zeros).
func (tcpBackend) cancel(ctx context.Context, r *Request, err error) error {
	p := r.p
	if p == nil {
		return nil
	}
	if p.take(r.id) == r {
		r.finish(err)
	}
	return p.fence(ctx)
}

// landed is, per part, the bytes of a WRITE sent live (landed, after a
// fence) or of a READ landed here.
func (tcpBackend) landed(r *Request, out []uint64) bool {
	for i := range r.tcpLanded {
		out[i] = r.tcpLanded[i].Load()
	}
	return true
}

// run sends the post's frames; the reader finishes the post on the
// target's acks (WRITE) or answers (READ).
func (tcpBackend) run(r *Request) error {
	r.runTCP()
	return nil
}

// retire waits until the connection's goroutines are done with the post's
// memory. They touch it only while the post is in flight, under landMu
// (READ answers) or sendMu (WRITE data); it is out now, so once a copy
// under way ends they are done with it. The owner may reuse or deregister
// the memory as soon as it sees the outcome, while after a timeout the
// peer may still be answering or the writer still be sending.
func (tcpBackend) retire(r *Request) {
	m := &r.p.sendMu
	if r.op == Read {
		m = &r.p.landMu
	}
	m.Lock() // an empty critical section: a barrier
	m.Unlock()
}

// The initiator's side: a post's frames out, the target's acks and READ
// answers in (the reader goroutine).

// runTCP sends the request's frames. A WRITE sends each piece's data, and a
// commit per part that the target acknowledges once the part's data is in
// place (after delivering the part's notification); a READ asks for every
// piece, and the reader lands the answers and finishes the request.
func (r *Request) runTCP() {
	p := r.p
	if len(r.segs) == 0 && r.op == Read { // nothing to ask for
		for i := range r.parts {
			if e := r.notifyPart(i); e != nil {
				r.finish(e)
				return
			}
		}
		r.finish(nil)
		return
	}
	// Once in flight the post may time out and the request be posted again
	// while its frames are still being written: they keep this post's ID.
	id := r.id
	p.mu.Lock()
	if p.failed != nil {
		err := p.failed
		p.mu.Unlock()
		r.finish(err)
		return
	}
	p.inflight[id] = r
	r.progress.Store(monoNow())
	p.mu.Unlock()
	p.tc.noteSize(r.bytes)
	if r.stop.why.Load() != 0 { // cancelled before it went out
		if p.take(id) == r {
			r.finish(r.halted())
		}
		return
	}
	p.lockWriter()
	r.sendTCP(id)
}

// sendTCP writes post id's frames (the caller holds the writer; sendTCP
// releases it).
func (r *Request) sendTCP(id uint64) {
	p := r.p
	// A small or inline post's frames never wait for the peer (see tcpConn).
	p.tc.nonblock = (r.bytes <= directMin || r.postedInline.Load()) && p.tc.backlog.Load() < overMax
	var err error
	var st stager
	defer st.put(r.a)
	start := 0
	for i := range r.parts {
		ps := &r.parts[i]
		for k := start; k < ps.end && err == nil; k++ {
			s := &r.segs[k]
			switch {
			case !p.inFlight(id, r):
				// It failed (timed out): its memory is its owner's again,
				// and nothing more of it goes out, nor is asked for.
			case r.op == Read:
				err = p.frameLocked(header{op: opReadReq, region: s.rinfo.ID, req: id, aux: uint64(k), offset: s.raddr, length: s.n}, nil)
			case s.local.info.Type == VRAM:
				err = st.writeFrames(r.a, p, id, r, s, i)
			default:
				err = p.writePiece(header{op: opWrite, region: s.rinfo.ID, req: id, offset: s.raddr, length: s.n}, id, r, s, i)
			}
		}
		if r.op == Write && err == nil {
			// A commit even for a post that failed meanwhile: its ack, which
			// nobody waits for, clears the target's record of refusals. But
			// no notification: some of its data may be missing or zeros. A
			// post still in flight now sent all of this part's data.
			h := header{op: opCommit, req: id, aux: uint64(i), flags: flagAck}
			var payload []byte
			if ps.flag && p.inFlight(id, r) {
				h.flags |= flagNotify
				payload = nonNil(ps.notif)
			}
			err = p.frameLocked(h, payload)
		}
		start = ps.end
	}
	if err == nil {
		err = p.flushLocked()
	}
	if p.tc.nonblock {
		p.tc.nonblock = false
		if len(p.tc.over) > 0 {
			p.queue(reply{op: opFlush})
		}
	}
	p.wmu.Unlock()
	if err != nil {
		r.sendFailed(p, id, err)
	}
}

// sendFailed ends post id after its frames failed to go out on p with err
// (out of sendTCP: its error value would cost an allocation per post). p
// is the post's connection, not r.p: the post may have failed meanwhile
// (its peer lost) and the request been posted again, which resets r.p.
func (r *Request) sendFailed(p *peer, id uint64, err error) {
	var de deviceError
	if errors.As(err, &de) {
		// The frames written so far are whole: the connection stays; the
		// target lands them, but without a commit nobody is notified.
		if p.take(id) == r {
			r.finish(fmt.Errorf("p2p: %v to %s: staging local VRAM: %w", r.op, r.peer, de.err))
		}
		return
	}
	// A frame may be half written: the connection is unusable.
	p.fail(fmt.Errorf("%w: %s: %v", ErrRemoteDisconnect, r.peer, err), true)
}

// inFlight reports whether post id of r is still in flight, so that its
// memory may be touched (under landMu or sendMu: see complete).
func (p *peer) inFlight(id uint64, r *Request) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inflight[id] == r
}

// zeroPad fills the rest of a WRITE frame whose post failed.
var zeroPad [64 << 10]byte

// writePiece writes WRITE frame h of piece s of post id of r. A piece of
// directMin bytes or more on a socket goes to it straight from the piece
// (writeDirect: non-blocking writes, each under sendMu while the post is
// in flight). Smaller ones, and any on a connection without a descriptor
// (TLS), go through the connection's buffer, copied into it under sendMu
// while the post is in flight, never written from the piece by a blocking
// write: that write, to a slow peer, would read the piece after the post
// timed out, when its owner may be reusing the memory. The header
// announced the length, so a post that fails midway sends zeros for the
// rest. The caller holds the writer.
func (p *peer) writePiece(h header, id uint64, r *Request, s *segment, part int) error {
	if err := p.frameLocked(h, nil); err != nil {
		return err
	}
	// Direct: straight from the post's memory, after the frame's header.
	// A small post's piece goes through the buffer with its header, in one
	// write(2): a header sent alone wakes the target for nothing (64 KiB
	// WRITEs fell from 1.6 to 0.9 GB/s that way).
	if direct := s.n >= directMin && p.tc.raw != nil; direct && (!p.tc.nonblock || s.n > directMin) {
		if err := p.flushLocked(); err != nil {
			return err
		}
		if p.tc.nonblock {
			return p.writeDirectNow(id, r, s.local.mem[s.loff:s.loff+s.n], part)
		}
		return p.writeDirect(id, r, s.local.mem[s.loff:s.loff+s.n], part)
	}
	live := true
	for off := uint64(0); off < s.n; {
		if p.bw.Available() == 0 {
			if err := p.flushLocked(); err != nil {
				return err
			}
		}
		k := min(s.n-off, uint64(p.bw.Available()))
		p.sendMu.Lock()
		if live {
			live = p.inFlight(id, r)
		}
		var err error
		if live {
			_, err = p.bw.Write(s.local.mem[s.loff+off : s.loff+off+k])
			r.tcpLanded[part].Add(k)
			r.progress.Store(monoNow())
		} else {
			k = min(k, uint64(len(zeroPad)))
			_, err = p.bw.Write(zeroPad[:k])
		}
		p.sendMu.Unlock()
		if err != nil { // fits the buffer: only a past flush's error
			p.werr = err
			return err
		}
		off += k
	}
	return nil
}

// deviceError is a CUDA failure while a transfer's frames go out: unlike a
// socket error it leaves the connection usable.
type deviceError struct{ err error }

func (e deviceError) Error() string { return e.err.Error() }

func (e deviceError) Unwrap() error { return e.err }

// stager is a tcp request's CUDA slot, taken on its first VRAM piece.
type stager struct{ sl *cudaSlot }

func (st *stager) put(a *Agent) {
	if st.sl != nil {
		a.gpu.put(st.sl)
		st.sl = nil
	}
}

// writeFrames sends segment s of a WRITE of post id of r from local VRAM
// as frames of at most bounceSize bytes, each copied to a pinned buffer
// first. Each device copy is made and waited for under sendMu, only while
// the post is in flight (see writePiece), so none may still read the
// piece once the post failed: the copy of the next chunk does not overlap
// the socket write of this one. A post that failed sends no more frames.
// The caller holds the peer's writer.
func (st *stager) writeFrames(a *Agent, p *peer, id uint64, r *Request, s *segment, part int) error {
	if st.sl == nil {
		sl, err := a.gpu.slot(int(s.local.info.Dev))
		if err != nil {
			return deviceError{err}
		}
		st.sl = sl
	}
	sl := st.sl
	bufs, err := sl.bounces()
	if err != nil {
		return deviceError{err}
	}
	src := cuda.DevicePtr(s.local.info.Base + s.loff)
	for off := uint64(0); off < s.n; {
		k := min(s.n-off, bounceSize)
		chunk := bufs[0][:k]
		p.sendMu.Lock()
		live := p.inFlight(id, r)
		if live {
			if err = sl.ctx.CopyFromDeviceAsync(chunk, src+cuda.DevicePtr(off), sl.stream); err == nil {
				err = sl.fence()
			}
		}
		p.sendMu.Unlock()
		switch {
		case !live:
			return nil
		case err != nil:
			return deviceError{err}
		}
		if err := p.frameLocked(header{op: opWrite, region: s.rinfo.ID, req: id, offset: s.raddr + off}, chunk); err != nil {
			return err
		}
		r.tcpLanded[part].Add(k)
		r.progress.Store(monoNow())
		off += k
	}
	return nil
}

// ackReceived reads the target's ack of a WRITE's part, with its refusal
// if any (reader goroutine).
func (p *peer) ackReceived(h header) error {
	var why string
	if h.flags&flagError != 0 {
		b := make([]byte, h.length)
		if _, err := io.ReadFull(p.br, b); err != nil {
			return err
		}
		why = string(b)
	}
	p.acked(h.req, why)
	return nil
}

// acked handles the target's ack of post id (reader goroutine).
func (p *peer) acked(id uint64, why string) {
	p.mu.Lock()
	r, done, err := p.inflight[id], false, error(nil)
	if r != nil {
		// Counted under p.mu while the post is in flight: an ack of a post
		// that timed out meanwhile must not count towards the next one.
		if why != "" {
			done, err = true, refusal(r.peer, "the write", why)
		} else {
			r.partsDone.Add(1)
			r.acks++
			done = r.acks == len(r.parts)
			r.progress.Store(monoNow())
		}
		if done {
			delete(p.inflight, id) // whoever takes the post out finishes it
		}
	}
	p.mu.Unlock()
	if done {
		r.finish(err)
	}
}

// refusal is the initiator's error for a transfer the target refused with
// the text why; a descriptor outside the target's regions is
// ErrOutOfBounds on this side too.
func refusal(target, what, why string) error {
	if rest, ok := strings.CutPrefix(why, ErrOutOfBounds.Error()); ok {
		return fmt.Errorf("p2p: %s refused %s: %w%s", target, what, ErrOutOfBounds, rest)
	}
	return fmt.Errorf("p2p: %s refused %s: %s", target, what, why)
}

// readResp lands READ data in the request's local memory.
func (p *peer) readResp(h header) error {
	p.mu.Lock()
	r := p.inflight[h.req]
	p.mu.Unlock()
	if h.flags&flagError != 0 {
		b := make([]byte, h.length)
		if _, err := io.ReadFull(p.br, b); err != nil {
			return err
		}
		if r := p.take(h.req); r != nil {
			r.finish(refusal(p.name, "a read", string(b)))
		}
		return nil
	}
	if r == nil || h.aux >= uint64(len(r.segs)) || r.segs[h.aux].n != h.length {
		_, err := io.CopyN(io.Discard, p.data, int64(h.length)) // timed out meanwhile, or nonsense
		return err
	}
	s := &r.segs[h.aux]
	if s.local.info.Type == VRAM {
		landed, devErr, err := p.landDevice(h.req, r, s)
		switch {
		case err != nil:
			return err
		case devErr != nil:
			if r := p.take(h.req); r != nil {
				r.finish(fmt.Errorf("p2p: READ from %s: landing in local VRAM: %w", p.name, devErr))
			}
		case landed:
			p.segDone(h.req, r, int(h.aux))
		}
		return nil
	}
	landed, err := p.landRead(h.req, r, s)
	if err != nil {
		return err
	}
	if landed {
		p.segDone(h.req, r, int(h.aux))
	}
	return nil
}

// landRead lands the answer to piece s of post id of r. The bytes wait in
// the connection's buffer and are copied into the piece a buffer-full at a
// time under landMu, only while the post is in flight, never read from the
// socket straight into it: the post may time out while the rest of the
// answer is still coming, and its owner may then reuse or deregister the
// memory (an Alloc'd region is unmapped) at once. That costs a memory copy
// per byte received. What arrives after the post failed is drained. It
// reports whether the whole piece landed.
func (p *peer) landRead(id uint64, r *Request, s *segment) (bool, error) {
	live := true
	for off := uint64(0); off < s.n; {
		if _, err := p.br.Peek(1); err != nil {
			return false, err
		}
		p.lastRecv.Store(monoNow()) // bytes arrived (see recvReader)
		k := min(s.n-off, uint64(p.br.Buffered()))
		b, _ := p.br.Peek(int(k))
		p.landMu.Lock()
		if live {
			live = p.inFlight(id, r)
		}
		if live {
			copy(s.local.mem[s.loff+off:s.loff+off+k], b)
			r.tcpLanded[r.partOf(s)].Add(k)
			r.progress.Store(monoNow())
		}
		p.landMu.Unlock()
		p.br.Discard(int(k))
		off += k
	}
	return live, nil
}

// landDevice is landRead for a piece in local VRAM: each chunk is read
// into a pinned buffer, then copied to the device and waited for under
// landMu, only while the post is in flight, so that no device copy into
// the piece is left running once the post failed. All the answer is read
// even when the device fails (devErr), so the connection stays in step.
func (p *peer) landDevice(id uint64, r *Request, s *segment) (landed bool, devErr, err error) {
	g := &p.a.gpu
	sl, devErr := g.slot(int(s.local.info.Dev))
	var bufs [2][]byte
	if devErr == nil {
		defer g.put(sl)
		bufs, devErr = sl.bounces()
	}
	if devErr != nil {
		_, err = io.CopyN(io.Discard, p.data, int64(s.n))
		return false, devErr, err
	}
	live := true
	dst := cuda.DevicePtr(s.local.info.Base + s.loff)
	for off := uint64(0); off < s.n; {
		k := min(s.n-off, bounceSize)
		chunk := bufs[0][:k]
		if _, err := io.ReadFull(p.data, chunk); err != nil {
			return false, nil, err
		}
		if live && devErr == nil {
			p.landMu.Lock()
			if live = p.inFlight(id, r); live {
				if devErr = sl.ctx.CopyToDeviceAsync(dst+cuda.DevicePtr(off), chunk, sl.stream); devErr == nil {
					devErr = sl.fence()
				}
				if devErr == nil {
					r.tcpLanded[r.partOf(s)].Add(k)
					r.progress.Store(monoNow())
				}
			}
			p.landMu.Unlock()
		}
		off += k
	}
	return live && devErr == nil, devErr, nil
}

// partOf is the part piece s (an element of r.segs) belongs to.
func (r *Request) partOf(s *segment) int {
	k := int((uintptr(unsafe.Pointer(s)) - uintptr(unsafe.Pointer(&r.segs[0]))) / unsafe.Sizeof(segment{}))
	return sort.Search(len(r.parts)-1, func(i int) bool { return k < r.parts[i].end })
}

// segDone counts piece seg of post id of r, which landed (reader
// goroutine); pieces answer in order, so parts finish in order. Nothing
// happens if the post is no longer in flight (it timed out, and r may be
// posted again).
func (p *peer) segDone(id uint64, r *Request, seg int) {
	var err error
	done := false
	p.mu.Lock()
	if p.inflight[id] != r {
		p.mu.Unlock()
		return
	}
	if seg != r.segsDone {
		done, err = true, fmt.Errorf("p2p: %s answered piece %d, expected %d", r.peer, seg, r.segsDone)
	} else {
		r.segsDone++
		// The reader does not wait to write here (a notification may wait
		// for room): the notification goes out now only if the socket
		// takes it at once (replyNow), else the responder sends it.
		for i := int(r.partsDone.Load()); i < len(r.parts) && r.parts[i].end <= r.segsDone; i++ {
			if ps := &r.parts[i]; ps.flag {
				if rp := (reply{op: opNotif, payload: nonNil(ps.notif)}); !p.replyNow(rp) {
					p.queue(rp)
				}
			}
			r.partsDone.Add(1)
		}
		done = r.segsDone == len(r.segs)
	}
	if done {
		delete(p.inflight, id)
	}
	p.mu.Unlock()
	if done {
		r.finish(err)
	}
}

// The target's side: the reader lands WRITE data and queues READ answers,
// which the responder sends (acks and small READ answers the reader sends
// itself when that cannot block: replyNow).

// serveWrite lands a WRITE's data in the target region, or drains it if the
// region does not hold it (the commit then gets a refusal).
func (p *peer) serveWrite(h header) error {
	p.tc.noteSize(h.length)
	r, err := p.a.pinRegion(h.region, h.offset, h.length)
	if err != nil {
		p.refuse(h.req, err)
		_, err := io.CopyN(io.Discard, p.data, int64(h.length))
		return err
	}
	defer r.busy.Add(-1)
	if r.info.Type == VRAM {
		devErr, err := p.a.gpu.toDeviceFrom(p.data, r.vram.dev, h.offset, h.length)
		if devErr != nil {
			p.refuse(h.req, devErr)
		}
		return err
	}
	if r.info.Type == FILE {
		ferr, err := r.file.writeFrom(p.data, int64(h.offset), int64(h.length), p.a.files)
		if ferr != nil { // the file refused the data: the commit says so
			p.refuse(h.req, ferr)
		}
		return err
	}
	off := h.offset - r.info.Base
	// A streamed payload is polled for between segments (tcpConn.spinRead);
	// a small one, whose initiator spins in Wait, is not: two spinners on
	// a small host take each other's cores.
	p.tc.spinRead = h.length > directMin
	_, err = io.ReadFull(p.data, r.mem[off:off+h.length])
	p.tc.spinRead = false
	return err
}

// refuse records why a write of the peer's request req was refused, for
// its commit's ack.
func (p *peer) refuse(req uint64, err error) {
	p.mu.Lock()
	if _, dup := p.refused[req]; !dup && len(p.refused) < 1<<16 {
		p.refused[req] = err.Error()
	}
	p.mu.Unlock()
}

// serveCommit delivers the notification of a part of a peer's WRITE whose
// data is in place (nothing was refused), and queues its ack, with the
// reason of a refusal if any (target side).
func (p *peer) serveCommit(h header) error {
	var msg []byte
	if h.length > 0 {
		msg = make([]byte, h.length)
		if _, err := io.ReadFull(p.br, msg); err != nil {
			return err
		}
	}
	p.mu.Lock()
	why, bad := p.refused[h.req]
	if bad && h.flags&flagAck != 0 {
		delete(p.refused, h.req)
	}
	p.mu.Unlock()
	// The notification is queued before the ack goes out (once Wait
	// returns, GetNotifs on the target shows it), but its consumer is
	// woken after: that wake-up costs more than the ack's whole trip.
	notified := h.flags&flagNotify != 0 && !bad
	if notified {
		if err := p.a.queueNotif(p.name, msg); err != nil {
			return err
		}
	}
	if h.flags&flagAck != 0 {
		if rp := (reply{op: opAck, req: h.req, aux: h.aux, err: why}); !p.replyNow(rp) {
			p.queue(rp)
		}
	}
	if notified {
		p.a.signalNotif()
	}
	return nil
}

// serveReadReq queues the answer to a peer's READ of one piece (target
// side), or its refusal if no region of this agent holds the piece; the
// region stays pinned until the responder has sent it.
func (p *peer) serveReadReq(h header) {
	p.tc.noteSize(h.length)
	r, err := p.a.pinRegion(h.region, h.offset, h.length)
	if err != nil {
		p.queue(reply{op: opReadResp, req: h.req, aux: h.aux, err: err.Error()})
		return
	}
	if rp := (reply{op: opReadResp, req: h.req, aux: h.aux, region: r, offset: h.offset, length: h.length}); !p.replyNow(rp) {
		p.queue(rp)
	}
}

// serveReadLocked sends the answer to a peer's READ (the responder, holding
// the writer): the piece's bytes from memory, from the file, or from VRAM
// through pinned buffers. h is the answer's header.
func (p *peer) serveReadLocked(r reply, h header) error {
	h.length = r.length
	if r.region.info.Type == FILE {
		if err := r.region.file.holds(int64(r.offset), int64(r.length)); err != nil {
			// Refuse before the header: once it is sent, a failed read
			// leaves the stream out of step and ends the connection.
			return p.writeReplyLocked(reply{op: r.op, req: r.req, aux: r.aux, err: err.Error()})
		}
		if err := p.frameLocked(h, nil); err != nil {
			return err
		}
		return r.region.file.readTo(p.bw, int64(r.offset), int64(r.length), p.a.files)
	}
	if r.region.info.Type == VRAM {
		// Staged through pinned buffers by this (the responder) goroutine.
		sl, err := p.a.gpu.slot(r.region.vram.dev)
		if err == nil {
			if _, err = sl.bounces(); err != nil {
				p.a.gpu.put(sl)
			}
		}
		if err != nil {
			return p.writeReplyLocked(reply{op: r.op, req: r.req, aux: r.aux, err: err.Error()})
		}
		defer p.a.gpu.put(sl)
		if err := p.frameLocked(h, nil); err != nil {
			return err
		}
		// A failed copy after the header leaves the stream out of step:
		// the connection goes.
		return sl.fromDevice(cuda.DevicePtr(r.offset), r.length, func(_ uint64, chunk []byte) error {
			_, err := p.bw.Write(chunk)
			return err
		})
	}
	off := r.offset - r.region.info.Base
	return p.frameLocked(h, r.region.mem[off:off+r.length])
}
