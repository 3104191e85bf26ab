package p2p

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"unsafe"
)

// directAlign is the alignment O_DIRECT needs of offsets, lengths and
// memory on the file systems gccl meets (4 KiB logical blocks cover 512).
const directAlign = 4096

// FileOptions describe a FILE registration.
type FileOptions struct {
	// Offset and Length are the file's bytes the region covers; Length 0
	// means up to the file's current end.
	Offset, Length int64
	// Direct opens the file (also) with O_DIRECT: aligned blocks bypass the
	// page cache, unaligned ones go through it.
	Direct bool
	// Create creates the file if missing and makes it at least
	// Offset+Length bytes long.
	Create bool
}

// fileHandle is a registered file: a buffered descriptor, and an O_DIRECT
// one when asked for.
type fileHandle struct {
	path   string
	f      *os.File
	direct *os.File
	owns   bool
	gds    gdsFile // its cuFile registration (Config.GDS)
}

func (h *fileHandle) close() error {
	h.gds.deregister() // before its descriptor closes
	var err error
	if h.direct != nil {
		err = h.direct.Close()
	}
	if h.owns {
		err = errors.Join(err, h.f.Close())
	}
	return err
}

// RegisterFile registers a range of the file at path.
func (a *Agent) RegisterFile(path string, opts FileOptions) (*Region, error) {
	flag := os.O_RDWR
	if opts.Create {
		flag |= os.O_CREATE
	}
	f, err := os.OpenFile(path, flag, 0o600)
	if err != nil {
		return nil, fmt.Errorf("p2p: RegisterFile: %w", err)
	}
	r, err := a.registerFile(f, true, opts)
	if err != nil || r.file.f != f {
		f.Close() // failed, or a cache hit: the region keeps its own descriptor
	}
	return r, err
}

// RegisterFileFD registers a range of an open file; f stays the caller's
// (DeregisterMem does not close it) and must stay open while registered.
// Its region is not shared with later RegisterFile calls of the same range
// (they open their own descriptor), since f may be closed after it.
func (a *Agent) RegisterFileFD(f *os.File, opts FileOptions) (*Region, error) {
	return a.registerFile(f, false, opts)
}

func (a *Agent) registerFile(f *os.File, owns bool, opts FileOptions) (*Region, error) {
	if opts.Offset < 0 || opts.Length < 0 || opts.Offset+opts.Length < opts.Offset {
		return nil, fmt.Errorf("p2p: file range [%d, +%d)", opts.Offset, opts.Length)
	}
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("p2p: RegisterFile: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("p2p: RegisterFile: %s is not a regular file", f.Name())
	}
	if opts.Length == 0 {
		opts.Length = st.Size() - opts.Offset
		if opts.Length <= 0 {
			return nil, fmt.Errorf("p2p: RegisterFile: %s has no bytes after offset %d (give a Length)", f.Name(), opts.Offset)
		}
	}
	if opts.Create && st.Size() < opts.Offset+opts.Length {
		if err := f.Truncate(opts.Offset + opts.Length); err != nil {
			return nil, fmt.Errorf("p2p: RegisterFile: sizing %s: %w", f.Name(), err)
		}
	}
	key := regionKey{typ: FILE, base: uint64(opts.Offset), len: uint64(opts.Length), file: fileIdentity(f, st)}
	a.mu.Lock()
	// Only regions whose descriptor the agent owns are in the cache: one
	// made from a caller's descriptor would break when its caller
	// deregisters and closes it while another registration still uses it.
	if r, ok := a.cache[key]; ok && r.file.direct != nil == opts.Direct {
		r.refs++
		a.mu.Unlock()
		return r, nil
	}
	a.mu.Unlock()
	h := &fileHandle{path: key.file, f: f, owns: owns}
	if opts.Direct {
		if h.direct, err = openDirect(f); err != nil {
			return nil, fmt.Errorf("p2p: RegisterFile: O_DIRECT on %s: %w", f.Name(), err)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		h.close()
		return nil, ErrClosed
	}
	info := regionInfo{Type: FILE, Base: uint64(opts.Offset), Len: uint64(opts.Length)}
	if opts.Direct {
		info.Flags = regionDirect
	}
	info.ID = a.nextRegion
	a.nextRegion++
	r := &Region{a: a, info: info, refs: 1, file: h}
	a.regions[info.ID] = r
	a.local.add(info)
	if owns {
		a.cache[key] = r
	}
	a.gen++
	return r, nil
}

// filePool runs file blocks, FileQueueDepth at once: on Linux through
// io_uring (uringFiles: one submission per batch, completions reaped by the
// caller), elsewhere, or where io_uring is disabled or refused, on
// queue-depth goroutines, each with its own aligned bounce buffer for
// O_DIRECT blocks whose memory is not aligned.
type filePool struct {
	depth, block int
	ring         *uringFiles // nil: the goroutines
	engine       string      // what runs the blocks, for the agent's INFO line
	once         sync.Once
	tasks        chan fileTask
	wg           sync.WaitGroup
	bufs         sync.Pool // block-sized buffers for data that arrives over tcp
}

// fileTask is one worker's stripe of a transfer: consecutive blocks, done
// in order, as one fio job streams its part of a file.
type fileTask struct {
	h     *fileHandle
	write bool
	mems  [][]byte
	offs  []int64
	st    *stopper
	done  *sync.WaitGroup
	err   *firstError
}

type firstError struct {
	mu  sync.Mutex
	err error
}

func (e *firstError) set(err error) {
	e.mu.Lock()
	if e.err == nil {
		e.err = err
	}
	e.mu.Unlock()
}

// newFilePool makes the pool; useURing asks for io_uring where the kernel
// allows it (Config.DisableIOURing, GCCL_P2P_IOURING_DISABLE=1 say no).
func newFilePool(depth, block int, useURing bool) *filePool {
	p := &filePool{depth: depth, block: block, engine: "goroutines (io_uring disabled by configuration)"}
	p.bufs.New = func() any { b := make([]byte, block); return &b }
	if useURing {
		var err error
		if p.ring, err = newURingFiles(depth, block); err != nil {
			p.engine = "goroutines (" + err.Error() + ")"
		} else {
			p.engine = "io_uring"
		}
	}
	return p
}

func (p *filePool) start() {
	p.tasks = make(chan fileTask, p.depth)
	for i := 0; i < p.depth; i++ {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			bounce := alignedBuffer(p.block)
			for t := range p.tasks {
				for i, mem := range t.mems {
					if t.st.stopped() { // a clock read per block: nothing beside its I/O
						break
					}
					if err := t.h.blockIO(t.write, mem, t.offs[i], bounce); err != nil {
						t.err.set(err)
						break
					}
				}
				t.done.Done()
			}
		}()
	}
}

func (p *filePool) close() {
	if p.ring != nil {
		p.ring.close()
	}
	p.once.Do(func() {}) // no start after close
	if p.tasks != nil {
		close(p.tasks)
		p.wg.Wait()
	}
}

// run does mem <-> file [off, off+len(mem)) for every piece: cut in blocks,
// the blocks dealt in depth contiguous stripes, one per worker. The workers
// skip the blocks left once st says stop (the caller asks st why); a block
// whose system call has started runs to its end, so a hung disk delays
// the stop until the call returns.
func (p *filePool) run(h *fileHandle, write bool, mems [][]byte, offs []int64, st *stopper) error {
	if p.ring != nil && p.fitsQueue(mems) {
		if ok, err := p.ring.run(h, write, mems, offs, st); ok {
			return err
		}
		// No ring could be set up now (memory, descriptors): goroutines.
	}
	p.once.Do(p.start)
	var blocks [][]byte
	var boffs []int64
	for i, mem := range mems {
		off := offs[i]
		for len(mem) > 0 {
			k := min(len(mem), p.block)
			blocks, boffs = append(blocks, mem[:k]), append(boffs, off)
			mem, off = mem[k:], off+int64(k)
		}
	}
	var wg sync.WaitGroup
	var fe firstError
	stripes := min(p.depth, len(blocks))
	for s := 0; s < stripes; s++ {
		lo, hi := s*len(blocks)/stripes, (s+1)*len(blocks)/stripes
		wg.Add(1)
		p.tasks <- fileTask{h: h, write: write, mems: blocks[lo:hi], offs: boffs[lo:hi], st: st, done: &wg, err: &fe}
	}
	wg.Wait()
	return fe.err
}

// fitsQueue says whether a run is at most one queue of blocks
// (FileQueueDepth x FileBlockSize bytes): io_uring takes those, in one
// submission with one wake-up. Longer streams go to the workers' stripes:
// measured here (2026-11-28, loaded 2-vCPU VM), 64 KiB O_DIRECT writes
// streamed at queue depth 4 ran at 0.2-0.8 GB/s through io_uring against
// 0.35-1.8 GB/s from 4 pwrite threads (internal/uring had the same gap
// without the agent), and reads at par; docs/P2P.md has the figures.
func (p *filePool) fitsQueue(mems [][]byte) bool {
	n := 0
	for _, m := range mems {
		if n += len(m); n > p.depth*p.block {
			return false
		}
	}
	return true
}

// blockIO reads or writes one block: through the O_DIRECT descriptor when
// the file range is aligned (with the bounce buffer if the memory is not),
// through the page cache otherwise.
func (h *fileHandle) blockIO(write bool, mem []byte, off int64, bounce []byte) error {
	if h.direct != nil && off%directAlign == 0 && len(mem)%directAlign == 0 {
		buf := mem
		if !aligned(mem) {
			buf = bounce[:len(mem)]
			if write {
				copy(buf, mem)
			}
		}
		if err := fullIO(h.direct, write, buf, off); err != nil {
			return err
		}
		if !write && !aligned(mem) {
			copy(mem, buf)
		}
		return nil
	}
	return fullIO(h.f, write, mem, off)
}

func fullIO(f *os.File, write bool, b []byte, off int64) error {
	var err error
	if write {
		_, err = f.WriteAt(b, off)
	} else {
		var n int
		n, err = f.ReadAt(b, off)
		if err == io.EOF && n < len(b) {
			err = fmt.Errorf("p2p: reading %s at %d: %d of %d bytes before the end of the file: %w", f.Name(), off, n, len(b), io.ErrUnexpectedEOF)
		}
	}
	if err != nil {
		return fmt.Errorf("p2p: file I/O: %w", err)
	}
	return nil
}

func aligned(b []byte) bool {
	return len(b) == 0 || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%directAlign == 0
}

// alignedBuffer returns n bytes aligned for O_DIRECT (Go's heap does not
// move objects, so the alignment lasts).
func alignedBuffer(n int) []byte {
	b := make([]byte, n+directAlign)
	skip := (directAlign - int(uintptr(unsafe.Pointer(&b[0]))%directAlign)) % directAlign
	return b[skip : skip+n : skip+n]
}

// writeFrom lands n bytes that arrive over a connection in the file at off
// (a peer's WRITE to this agent's file). A write the file refuses is
// fileErr, and the rest of the data is drained so the connection stays in
// step; err is the connection's.
func (h *fileHandle) writeFrom(r io.Reader, off, n int64, p *filePool) (fileErr, err error) {
	bp := p.bufs.Get().(*[]byte)
	defer p.bufs.Put(bp)
	buf := *bp
	for n > 0 {
		k := min(n, int64(len(buf)))
		if _, err := io.ReadFull(r, buf[:k]); err != nil {
			return fileErr, err
		}
		if fileErr == nil {
			fileErr = fullIO(h.f, true, buf[:k], off)
		}
		off, n = off+k, n-k
	}
	return fileErr, nil
}

// holds checks that the file has the n bytes at off, before a peer's READ
// of them is answered.
func (h *fileHandle) holds(off, n int64) error {
	st, err := h.f.Stat()
	if err != nil {
		return fmt.Errorf("p2p: file I/O: %w", err)
	}
	if st.Size() < off+n {
		return fmt.Errorf("p2p: reading %s at %d: %d bytes asked, the file ends at %d: %w", h.f.Name(), off, n, st.Size(), io.ErrUnexpectedEOF)
	}
	return nil
}

// readTo sends n bytes of the file from off to w (a peer's READ).
func (h *fileHandle) readTo(w io.Writer, off, n int64, p *filePool) error {
	bp := p.bufs.Get().(*[]byte)
	defer p.bufs.Put(bp)
	buf := *bp
	for n > 0 {
		k := min(n, int64(len(buf)))
		if err := fullIO(h.f, false, buf[:k], off); err != nil {
			// The header is sent and the data cannot follow: the
			// connection goes (holds refused reads past the end before).
			return err
		}
		if _, err := w.Write(buf[:k]); err != nil {
			return err
		}
		off, n = off+k, n-k
	}
	return nil
}
