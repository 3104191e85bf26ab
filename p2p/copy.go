package p2p

import (
	"runtime"
	"sync"
)

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
