package p2p

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
)

// Backend moves a request's bytes.
type Backend uint8

const (
	// BackendAuto lets the agent choose (RequestOptions.Backend).
	BackendAuto Backend = iota
	// BackendLocal copies between two regions of this agent.
	BackendLocal
	// BackendSHM copies to or from a peer's region mapped here.
	BackendSHM
	// BackendPVM copies with process_vm_readv/writev.
	BackendPVM
	// BackendTCP goes over the connection; the target's progress goroutine
	// lands or serves the data.
	BackendTCP
	// BackendFile reads or writes a FILE region of this agent.
	BackendFile
	// BackendCUDAIPC copies to or from a peer's VRAM on this host, opened
	// here through its CUDA IPC handle: device-to-device, or host-to-device
	// and back for a local DRAM end.
	BackendCUDAIPC
)

func (b Backend) String() string {
	switch b {
	case BackendAuto:
		return "auto"
	case BackendLocal:
		return "local"
	case BackendSHM:
		return "shm"
	case BackendPVM:
		return "pvm"
	case BackendTCP:
		return "tcp"
	case BackendFile:
		return "file"
	case BackendCUDAIPC:
		return "cudaipc"
	}
	return fmt.Sprintf("Backend(%d)", uint8(b))
}

// placement is what backend selection looks at: pure data, so the choice is
// testable without I/O.
type placement struct {
	self       bool    // the target is this agent
	localType  MemType // the initiator's memory (DRAM when zero)
	remoteType MemType // the target's memory
	allMapped  bool    // every target region is mapped here (shared memory; VRAM: CUDA IPC)
	sameHost   bool
	pvm        bool // process_vm_readv reaches the target
	shmOff     bool
	ipcOff     bool // CUDA IPC disabled
}

// selectBackend picks the cheapest backend that can do the transfer and
// says why (logged). forced, if not BackendAuto, is checked instead.
func selectBackend(pl placement, forced Backend) (Backend, string, error) {
	var candidates []Backend
	var why string
	vram := pl.localType == VRAM || pl.remoteType == VRAM
	switch {
	case pl.self && pl.remoteType == FILE:
		candidates, why = []Backend{BackendFile}, "target is a file of this agent"
		if vram {
			why += "; VRAM staged through pinned bounce buffers"
		}
	case pl.self:
		candidates, why = []Backend{BackendLocal}, "both ends in this process"
		if vram {
			why += "; CUDA copies"
		}
	case pl.remoteType == FILE:
		candidates, why = []Backend{BackendTCP}, "a peer's file is reached through its agent"
	case pl.remoteType == VRAM:
		if pl.sameHost && pl.allMapped && !pl.ipcOff {
			candidates, why = append(candidates, BackendCUDAIPC), "the target's VRAM is opened here through CUDA IPC"
		}
		candidates = append(candidates, BackendTCP)
		switch {
		case candidates[0] == BackendCUDAIPC:
		case !pl.sameHost:
			why = "another host; the target stages its VRAM through pinned buffers"
		case pl.ipcOff:
			why = "same host, CUDA IPC disabled (GCCL_SHM_DISABLE, GCCL_P2P_CUDAIPC_DISABLE or Config); the target stages its VRAM"
		default:
			why = "same host, but the target's VRAM is not opened here (same process, no CUDA driver here, or no IPC handle); the target stages it"
		}
	default:
		if pl.allMapped && !pl.shmOff {
			candidates = append(candidates, BackendSHM)
		}
		if pl.sameHost && pl.pvm && pl.localType != VRAM {
			candidates = append(candidates, BackendPVM)
		}
		candidates = append(candidates, BackendTCP)
		switch {
		case candidates[0] == BackendSHM:
			why = "the target's regions are shared memory mapped here"
			if vram {
				why += "; CUDA copies between them and the local VRAM"
			}
		case candidates[0] == BackendPVM:
			why = "same host, heap regions, process_vm_writev permitted"
		case !pl.sameHost:
			why = "another host"
		case pl.shmOff:
			why = "same host, shared memory disabled (GCCL_SHM_DISABLE or Config.DisableSHM) and process_vm unusable"
		case pl.localType == VRAM:
			why = "same host, the target's regions are not shared, and process_vm cannot reach VRAM"
		default:
			why = "same host, but the target's regions are not shared and process_vm is unusable"
		}
	}
	if forced == BackendAuto {
		return candidates[0], why, nil
	}
	for _, c := range candidates {
		if c == forced {
			return c, "forced by RequestOptions.Backend", nil
		}
	}
	return 0, "", fmt.Errorf("p2p: backend %v cannot do this transfer (possible: %v): %w", forced, candidates, ErrNotSupported)
}

func (a *Agent) chooseBackend(r *Request, forced Backend) (Backend, string, error) {
	pl := placement{self: r.self, localType: r.local.typ, remoteType: r.remote.typ, shmOff: a.cfg.DisableSHM,
		ipcOff: a.cfg.DisableCUDAIPC, allMapped: true}
	if !r.self {
		pl.sameHost, pl.pvm = r.ra.sameHost, r.ra.pvm
		for i := range r.segs {
			if s := &r.segs[i]; s.rmem == nil && s.rdev == 0 {
				pl.allMapped = false
				break
			}
		}
	}
	return selectBackend(pl, forced)
}

// The cost model: a fixed cost per request, per piece and per part, plus the
// bytes at the backend's bandwidth. The figures are this VM's, measured with
// gccl-p2pbench (docs/P2P.md); they rank backends and size batches, not
// promise times.
type costModel struct {
	fixed, perPiece, perPart time.Duration
	bytesPerSec              float64
}

var costs = map[Backend]costModel{
	BackendLocal: {fixed: 200 * time.Nanosecond, perPiece: 20 * time.Nanosecond, bytesPerSec: 7e9},
	BackendSHM:   {fixed: 300 * time.Nanosecond, perPiece: 20 * time.Nanosecond, perPart: 5 * time.Microsecond, bytesPerSec: 7e9},
	BackendPVM:   {fixed: 2 * time.Microsecond, perPiece: 100 * time.Nanosecond, perPart: 5 * time.Microsecond, bytesPerSec: 5e9},
	BackendTCP:   {fixed: 40 * time.Microsecond, perPiece: 300 * time.Nanosecond, perPart: 10 * time.Microsecond, bytesPerSec: 1.5e9},
	BackendFile:  {fixed: 20 * time.Microsecond, perPiece: 2 * time.Microsecond, bytesPerSec: 1e9},
	// Not measured: a CUDA copy's launch cost and an H100's copy engines
	// over PCIe 5 (host<->device) or NVLink (device<->device); only the
	// fake driver has run.
	BackendCUDAIPC: {fixed: 10 * time.Microsecond, perPiece: 2 * time.Microsecond, perPart: 5 * time.Microsecond, bytesPerSec: 20e9},
}

// estimateCost is the model's time for pieces merged pieces of bytes in
// parts parts on backend b.
func estimateCost(b Backend, pieces int, bytes uint64, parts int) time.Duration {
	c, ok := costs[b]
	if !ok {
		return 0
	}
	t := c.fixed + time.Duration(pieces)*c.perPiece + time.Duration(parts)*c.perPart
	return t + time.Duration(float64(bytes)/c.bytesPerSec*1e9)
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }

// copyMin is the smallest piece worth giving to another goroutine.
const copyMin = 1 << 20

// copyPool copies large transfers with several goroutines: on this VM one
// core's copy reaches ~7 GB/s, two ~10 GB/s.
type copyPool struct {
	workers int           // including the caller
	tasks   chan copyTask // unbuffered: a send succeeds only into an idle worker
	stop    chan struct{}
	wg      sync.WaitGroup
}

// copyTask is a share of a transfer: pieces whose bytes add up to about the
// transfer's size divided by the workers.
type copyTask struct {
	dst, src [][]byte
	st       *stopper
	fn       func() // instead of dst and src: a share of a pvm transfer
	done     *sync.WaitGroup
}

func (t copyTask) run() {
	if t.fn != nil {
		t.fn()
	}
	copyPieces(t.dst, t.src, t.st)
	t.done.Done()
}

// copyPieces copies src[i] to dst[i] in blocks of copyMin bytes, asking st
// before each block after the first whether to stop (once per copyMin
// bytes, however small the pieces).
func copyPieces(dst, src [][]byte, st *stopper) {
	n := 0
	for i := range dst {
		d, s := dst[i], src[i]
		for len(d) > 0 {
			if n >= copyMin {
				if st.stopped() {
					return
				}
				n = 0
			}
			k := min(len(d), copyMin)
			copy(d[:k], s[:k])
			d, s, n = d[k:], s[k:], n+k
		}
	}
}

func newCopyPool(n int) *copyPool {
	p := &copyPool{workers: max(n, 1), tasks: make(chan copyTask), stop: make(chan struct{})}
	for i := 0; i < p.workers-1; i++ { // the caller is the last worker
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for {
				select {
				case t := <-p.tasks:
					t.run()
				case <-p.stop:
					return
				}
			}
		}()
	}
	return p
}

// close stops the workers; a copy that runs meanwhile finishes on its
// caller's goroutine.
func (p *copyPool) close() {
	close(p.stop)
	p.wg.Wait()
}

// shares cuts pieces of total bytes into about equal shares, one per
// worker, splitting large pieces and keeping small ones grouped, so a share
// costs one hand-over however many descriptors it holds. at(i, off, n) is
// called for each slice of piece i, in order; a new share starts after
// every call that filled one.
func shares(lens []int, total uint64, workers int, at func(share, piece, off, n int)) int {
	size := int(total/uint64(workers)) + 1
	share, room := 0, size
	for i, l := range lens {
		for off := 0; off < l; {
			k := min(l-off, room)
			at(share, i, off, k)
			off, room = off+k, room-k
			if room == 0 {
				share, room = share+1, size
			}
		}
	}
	if room == size {
		return share
	}
	return share + 1
}

// dispatch runs tasks on the pool and the caller.
func (p *copyPool) dispatch(tasks []copyTask) {
	if len(tasks) == 0 {
		return
	}
	tasks[0].done.Add(len(tasks))
	mine := tasks[len(tasks)-1:]
	for _, t := range tasks[:len(tasks)-1] {
		select {
		case p.tasks <- t:
		default:
			mine = append(mine, t) // the workers are busy with another transfer
		}
	}
	for _, t := range mine {
		t.run()
	}
	tasks[0].done.Wait()
}

// copyAll copies every pair, in equal shares across the workers when the
// transfer is large; a large one stops early when st says so (the caller
// then asks st why). Pairs must not overlap (MakeRequest refuses those).
func (p *copyPool) copyAll(dst, src [][]byte, total uint64, st *stopper) {
	if total < 2*copyMin {
		for i := range dst {
			copy(dst[i], src[i])
		}
		return
	}
	if p.workers == 1 {
		copyPieces(dst, src, st)
		return
	}
	lens := make([]int, len(dst))
	for i := range dst {
		lens[i] = len(dst[i])
	}
	var wg sync.WaitGroup
	tasks := make([]copyTask, p.workers)
	n := shares(lens, total, p.workers, func(sh, i, off, k int) {
		t := &tasks[sh]
		t.dst, t.src = append(t.dst, dst[i][off:off+k]), append(t.src, src[i][off:off+k])
	})
	for i := range tasks {
		tasks[i].done, tasks[i].st = &wg, st
	}
	p.dispatch(tasks[:n])
}

// pvmAll is pvmCopy in equal shares across the workers when the transfer is
// large (one core's process_vm_writev does not reach memory bandwidth), in
// calls of about copyMin bytes between which st may stop it.
func (p *copyPool) pvmAll(pid int, write bool, local [][]byte, remote []uint64, total uint64, st *stopper) error {
	if total < 2*copyMin {
		return pvmCopy(pid, write, local, remote)
	}
	if p.workers == 1 {
		return pvmBlocks(pid, write, local, remote, st)
	}
	lens := make([]int, len(local))
	for i := range local {
		lens[i] = len(local[i])
	}
	ls, rs := make([][][]byte, p.workers), make([][]uint64, p.workers)
	n := shares(lens, total, p.workers, func(sh, i, off, k int) {
		ls[sh], rs[sh] = append(ls[sh], local[i][off:off+k]), append(rs[sh], remote[i]+uint64(off))
	})
	var wg sync.WaitGroup
	var fe firstError
	tasks := make([]copyTask, n)
	for i := range tasks {
		tasks[i] = copyTask{done: &wg, fn: func() {
			if err := pvmBlocks(pid, write, ls[i], rs[i], st); err != nil {
				fe.set(err)
			}
		}}
	}
	p.dispatch(tasks)
	return fe.err
}

// pvmBlocks is pvmCopy in calls of about copyMin bytes (large pieces
// split), asking st before each call after the first whether to stop.
func pvmBlocks(pid int, write bool, local [][]byte, remote []uint64, st *stopper) error {
	var ls [][]byte
	var rs []uint64
	n, sent := 0, false
	for i, l := range local {
		addr := remote[i]
		for len(l) > 0 {
			if n == 0 && sent && st.stopped() {
				return nil
			}
			k := min(len(l), copyMin-n)
			ls, rs = append(ls, l[:k]), append(rs, addr)
			l, addr, n = l[k:], addr+uint64(k), n+k
			if n == copyMin {
				if err := pvmCopy(pid, write, ls, rs); err != nil {
					return err
				}
				ls, rs, n, sent = ls[:0], rs[:0], 0, true
			}
		}
	}
	if len(ls) == 0 {
		return nil
	}
	return pvmCopy(pid, write, ls, rs)
}

// runCopy is the local and shm backend: the initiator copies, until the
// post's deadline (checked between blocks and parts).
func (r *Request) runCopy() error {
	start := 0
	for i := range r.parts {
		if i > 0 && r.stop.stopped() {
			return r.halted()
		}
		ps := &r.parts[i]
		segs := r.segs[start:ps.end]
		if cap(r.dst) < len(segs) {
			r.dst, r.src = make([][]byte, len(segs)), make([][]byte, len(segs))
		}
		dst, src := r.dst[:len(segs)], r.src[:len(segs)]
		for k := range segs {
			s := &segs[k]
			l := s.local.mem[s.loff : s.loff+s.n]
			ro := s.raddr - s.rinfo.Base
			rm := s.rmem[ro : ro+s.n]
			if r.op == Write {
				dst[k], src[k] = rm, l
			} else {
				dst[k], src[k] = l, rm
			}
		}
		r.a.copy.copyAll(dst, src, ps.bytes, &r.stop)
		if err := r.halted(); err != nil {
			return err // no notification: the part's data is not all there
		}
		if err := r.notifyPart(i); err != nil {
			return err
		}
		start = ps.end
	}
	return nil
}

// runPVM copies with process_vm_writev/readv, one system call per 1024
// pieces (per about copyMin bytes when large), until the post's deadline.
func (r *Request) runPVM() error {
	start := 0
	for i := range r.parts {
		if i > 0 && r.stop.stopped() {
			return r.halted()
		}
		ps := &r.parts[i]
		segs := r.segs[start:ps.end]
		local, remote := make([][]byte, len(segs)), make([]uint64, len(segs))
		for k := range segs {
			s := &segs[k]
			local[k], remote[k] = s.local.mem[s.loff:s.loff+s.n], s.raddr
		}
		if err := r.a.copy.pvmAll(int(r.ra.info.Pid), r.op == Write, local, remote, ps.bytes, &r.stop); err != nil {
			return fmt.Errorf("p2p: %v to %s: %w", r.op, r.peer, err)
		}
		if err := r.halted(); err != nil {
			return err
		}
		if err := r.notifyPart(i); err != nil {
			return err
		}
		start = ps.end
	}
	return nil
}

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
	p.mu.Unlock()
	p.lockWriter()
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
				err = st.writeFrames(r.a, p, id, r, s)
			default:
				err = p.writePiece(header{op: opWrite, region: s.rinfo.ID, req: id, offset: s.raddr, length: s.n}, id, r, s)
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
	p.wmu.Unlock()
	var de deviceError
	if errors.As(err, &de) {
		// The frames written so far are whole: the connection stays; the
		// target lands them, but without a commit nobody is notified.
		if p.take(id) == r {
			r.finish(fmt.Errorf("p2p: %v to %s: staging local VRAM: %w", r.op, r.peer, de.err))
		}
		return
	}
	if err != nil {
		// A frame may be half written: the connection is unusable.
		p.fail(fmt.Errorf("%w: %s: %v", ErrRemoteDisconnect, r.peer, err), true)
	}
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

// writePiece writes WRITE frame h of piece s of post id of r. The bytes go
// through the connection's buffer, copied into it under sendMu while the
// post is in flight, never to the socket straight from the piece: a write
// to a slow peer would then read the piece after the post timed out, when
// its owner may be reusing the memory, and send that to the target. That
// costs a memory copy per byte sent. The header announced the length, so
// a post that fails midway sends zeros for the rest. The caller holds the
// writer.
func (p *peer) writePiece(h header, id uint64, r *Request, s *segment) error {
	if err := p.frameLocked(h, nil); err != nil {
		return err
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
		// The reader never writes to the socket itself: the responder
		// sends the notifications.
		for i := int(r.partsDone.Load()); i < len(r.parts) && r.parts[i].end <= r.segsDone; i++ {
			if ps := &r.parts[i]; ps.flag {
				p.queue(reply{op: opNotif, payload: nonNil(ps.notif)})
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
