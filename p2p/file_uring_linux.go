package p2p

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/gccl/gccl/internal/uring"
)

// uringStopTick is how often a run waiting on its completions looks at
// its stopper, to cancel what is still queued once it says stop.
const uringStopTick = 10 * time.Millisecond

// cancelUD marks the completion of a cancel entry (slots are 0..depth-1).
const cancelUD = ^uint64(0)

// minURingChunk is the smallest piece a request is split into to fill the
// queue: below it, per-I/O costs outweigh the parallelism.
const minURingChunk = 64 << 10

// uringFiles is the io_uring file engine. A run takes an idle ring (or
// sets one up), keeps up to depth blocks in flight on it, hands each batch
// to the kernel in one io_uring_enter and reaps the completions in the
// calling goroutine: no goroutine per I/O, no channel hop.
type uringFiles struct {
	depth, block int
	mu           sync.Mutex
	idle         []*uringRing
	closed       bool
}

// uringRing is a ring with its per-slot state; one run owns it at a time.
// Slot i streams stripe i of a run's blocks, in order, as the goroutine
// pool's worker i does: contiguous streams beat interleaved blocks on the
// writes measured here.
type uringRing struct {
	ring   *uring.Ring
	slots  []uringSlot
	stripe []stripeCursor // per slot
	ready  []int          // slots whose stripe may have a next block
	bounce [][]byte       // per slot, aligned, made when first needed
}

// stripeCursor walks one stripe: its next block is mems[mi][pos:], cut at
// the chunk size, and left blocks remain.
type stripeCursor struct{ mi, pos, left int }

func (c *stripeCursor) next(mems [][]byte, offs []int64, chunk int) ([]byte, int64) {
	for len(mems[c.mi]) == 0 {
		c.mi++
	}
	m := mems[c.mi]
	k := min(chunk, len(m)-c.pos)
	mem, off := m[c.pos:c.pos+k], offs[c.mi]+int64(c.pos)
	if c.pos += k; c.pos == len(m) {
		c.mi, c.pos = c.mi+1, 0
	}
	c.left--
	return mem, off
}

// deal cuts the blocks of mems in chunks and deals them in up to
// len(slots) contiguous stripes; it returns the number of blocks.
func (u *uringRing) deal(mems [][]byte, chunk int) int {
	n := 0
	for _, m := range mems {
		n += (len(m) + chunk - 1) / chunk
	}
	stripes := min(len(u.slots), n)
	u.ready = u.ready[:0]
	for s := stripes - 1; s >= 0; s-- {
		u.ready = append(u.ready, s)
	}
	s, b := 0, 0 // the next stripe to start, the block index at (mi, pos)
	for mi := 0; mi < len(mems) && s < stripes; mi++ {
		for pos := 0; pos < len(mems[mi]) && s < stripes; pos += chunk {
			if b == s*n/stripes {
				u.stripe[s] = stripeCursor{mi: mi, pos: pos, left: (s+1)*n/stripes - b}
				s++
			}
			b++
		}
	}
	return n
}

// uringSlot is one block in flight.
type uringSlot struct {
	mem     []byte // the caller's bytes
	buf     []byte // what the kernel moves: mem, or the slot's bounce buffer
	off     int64
	done    int  // bytes of buf already moved (a short transfer goes on)
	direct  bool // through the O_DIRECT descriptor
	bounced bool
}

func newURingFiles(depth, block int) (*uringFiles, error) {
	if err := uring.Available(); err != nil {
		return nil, err
	}
	return &uringFiles{depth: depth, block: block}, nil
}

func (e *uringFiles) get() (*uringRing, error) {
	e.mu.Lock()
	if n := len(e.idle); n > 0 {
		u := e.idle[n-1]
		e.idle = e.idle[:n-1]
		e.mu.Unlock()
		return u, nil
	}
	e.mu.Unlock()
	r, err := uring.New(uint32(e.depth + 1)) // + a cancel entry
	if err != nil {
		return nil, err
	}
	return &uringRing{ring: r, slots: make([]uringSlot, e.depth), stripe: make([]stripeCursor, e.depth),
		ready: make([]int, 0, e.depth), bounce: make([][]byte, e.depth)}, nil
}

func (e *uringFiles) put(u *uringRing) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		u.ring.Close()
		return
	}
	e.idle = append(e.idle, u)
}

func (e *uringFiles) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	for _, u := range e.idle {
		u.ring.Close()
	}
	e.idle = nil
}

// chunk is the size requests are cut into: the block size, or less when a
// request has fewer blocks than the queue holds, so that one large I/O is
// still spread across the queue (aligned, so O_DIRECT still applies).
func (e *uringFiles) chunk(mems [][]byte) int {
	total := 0
	for _, m := range mems {
		total += len(m)
	}
	if total >= e.depth*e.block {
		return e.block
	}
	c := (total/e.depth + directAlign - 1) / directAlign * directAlign
	return min(e.block, max(c, minURingChunk))
}

// run does mem <-> file for every piece as filePool.run does. ok false
// means no ring could be set up, and nothing was done.
func (e *uringFiles) run(h *fileHandle, write bool, mems [][]byte, offs []int64, st *stopper) (ok bool, err error) {
	u, err := e.get()
	if err != nil {
		return false, nil
	}
	healthy, err := u.run(h, write, mems, offs, st, e.chunk(mems))
	if healthy {
		e.put(u)
	}
	// A ring whose io_uring_enter failed with blocks in flight is left
	// as it is: closing it could free what the kernel still writes to.
	return true, err
}

func (u *uringRing) run(h *fileHandle, write bool, mems [][]byte, offs []int64, st *stopper, chunk int) (healthy bool, err error) {
	var firstErr error
	inflight, stopping := 0, false
	unqueued := u.deal(mems, chunk)
	for {
		for firstErr == nil && !stopping && len(u.ready) > 0 {
			i := u.ready[len(u.ready)-1]
			if u.stripe[i].left == 0 {
				u.ready = u.ready[:len(u.ready)-1]
				continue
			}
			if st.stopped() { // a clock read per block, as the goroutine pool
				stopping = true
				break
			}
			u.ready = u.ready[:len(u.ready)-1]
			mem, off := u.stripe[i].next(mems, offs, chunk)
			unqueued--
			k := len(mem)
			s := &u.slots[i]
			*s = uringSlot{mem: mem, buf: mem, off: off}
			s.direct = h.direct != nil && off%directAlign == 0 && k%directAlign == 0
			if s.direct && !aligned(mem) {
				if u.bounce[i] == nil || len(u.bounce[i]) < k {
					u.bounce[i] = alignedBuffer(max(k, chunk))
				}
				s.buf, s.bounced = u.bounce[i][:k], true
				if write {
					copy(s.buf, mem)
				}
			}
			if !u.prep(h, write, i) {
				return false, errors.New("p2p: io_uring submission queue full") // cannot happen: depth+1 entries
			}
			inflight++
		}
		if inflight == 0 {
			return true, firstErr
		}
		var tick time.Duration
		if st != nil && !stopping {
			tick = uringStopTick
		}
		// One wake-up for the whole batch once nothing is left to queue
		// (libaio's io_getevents(min_nr) as NIXL uses it); while blocks
		// remain, a quarter of the queue frees before refilling it.
		wait := inflight
		if firstErr == nil && !stopping && unqueued > 0 {
			wait = min(inflight, max(1, len(u.slots)/4))
		}
		if _, err := u.ring.Submit(wait, tick); err != nil {
			return false, fmt.Errorf("p2p: file I/O: %w", err)
		}
		for c, ok := u.ring.Completion(); ok; c, ok = u.ring.Completion() {
			if c.UserData == cancelUD {
				continue
			}
			i := int(c.UserData)
			s := &u.slots[i]
			switch {
			case c.Res < 0:
				if firstErr == nil && !(stopping && c.Res == -int32(syscall.ECANCELED)) {
					firstErr = fmt.Errorf("p2p: file I/O on %s at %d: %w", h.f.Name(), s.off+int64(s.done), syscall.Errno(-c.Res))
				}
			case c.Res == 0:
				if firstErr == nil && !stopping {
					firstErr = shortErr(h, write, s)
				}
			default:
				s.done += int(c.Res)
				if s.done < len(s.buf) && firstErr == nil && !stopping {
					// A short transfer: the rest through the page cache
					// (its offset may no longer suit O_DIRECT), from or
					// into the caller's memory.
					if s.bounced && !write {
						copy(s.mem[:s.done], s.buf[:s.done])
					}
					s.buf, s.bounced, s.direct = s.mem, false, false
					u.prep(h, write, i)
					continue
				}
				if s.done == len(s.buf) && s.bounced && !write {
					copy(s.mem, s.buf)
				}
			}
			inflight--
			u.ready = append(u.ready, i)
		}
		if !stopping && inflight > 0 && st.stopped() {
			// Queued blocks end now (-ECANCELED); those on the device run
			// to their end, and the run waits for them before returning,
			// since the kernel holds their memory until then.
			stopping = true
			u.ring.PrepCancelAll(cancelUD)
		}
	}
}

func (u *uringRing) prep(h *fileHandle, write bool, i int) bool {
	s := &u.slots[i]
	fd := int(h.f.Fd())
	if s.direct {
		fd = int(h.direct.Fd())
	}
	b, off := s.buf[s.done:], s.off+int64(s.done)
	if write {
		return u.ring.PrepWrite(fd, b, off, uint64(i))
	}
	return u.ring.PrepRead(fd, b, off, uint64(i))
}

func shortErr(h *fileHandle, write bool, s *uringSlot) error {
	if write {
		return fmt.Errorf("p2p: file I/O: writing %s at %d: %w", h.f.Name(), s.off+int64(s.done), io.ErrShortWrite)
	}
	return fmt.Errorf("p2p: reading %s at %d: %d of %d bytes before the end of the file: %w", h.f.Name(), s.off, s.done, len(s.mem), io.ErrUnexpectedEOF)
}
