package p2p

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"unsafe"

	"github.com/gccl/gccl/internal/cuda"
	"github.com/gccl/gccl/internal/cufile"
)

// bounceSize is the size of each of a CUDA slot's two pinned bounce
// buffers: tcp and file transfers with a VRAM end are staged through them
// in chunks of this size, the copy of one chunk overlapping the socket or
// file work on the other.
const bounceSize = 4 << 20

// gpuState is an agent's CUDA driver, loaded on first use (RegisterVRAM, a
// peer's VRAM regions on this host, a transfer with a VRAM end): one driver,
// one primary context per device, and a pool of streams with their events
// and bounce buffers. Close releases it all.
type gpuState struct {
	log *slog.Logger

	mu     sync.Mutex
	loaded bool
	closed bool
	drv    *cuda.Driver
	err    error // why there is no driver (wraps ErrNotSupported)
	count  int
	ctxs   map[int]*cuda.Context
	idle   map[int][]*cudaSlot
	slots  []*cudaSlot
	pins   map[uintptr]hostPin
	warned bool
	// cuFile (Config.GDS), loaded on first use: the library or why not.
	gds       *cufile.Library
	gdsErr    error
	gdsLoaded bool
}

// cudaSlot is a stream of one device, two events to wait on its work and,
// made on first use, two pinned bounce buffers. A transfer takes a slot for
// its duration, so transfers on different lanes do not wait for each other.
type cudaSlot struct {
	dev    int
	ctx    *cuda.Context
	stream cuda.Stream
	ev     [2]cuda.Event
	buf    [2][]byte // aligned for O_DIRECT
	raw    [2][]byte // as AllocHost returned them
}

// hostPin is host memory this agent registered with the driver.
type hostPin struct {
	ctx *cuda.Context
	b   []byte
	ok  bool // false: registration failed (copies stay pageable); nothing to undo
}

// driverLocked loads the driver once; the caller holds g.mu.
func (g *gpuState) driverLocked() error {
	if g.closed {
		return ErrClosed
	}
	if g.loaded {
		return g.err
	}
	g.loaded = true
	d, err := cuda.Load()
	if err == nil {
		g.count, err = d.DeviceCount()
		if err != nil {
			d.Close()
		}
	}
	if err != nil {
		g.err = fmt.Errorf("%w: no usable CUDA driver: %w", ErrNotSupported, err)
		return g.err
	}
	if g.count == 0 {
		d.Close()
		g.err = fmt.Errorf("%w: the CUDA driver sees no device", ErrNotSupported)
		return g.err
	}
	g.drv = d
	g.ctxs, g.idle, g.pins = map[int]*cuda.Context{}, map[int][]*cudaSlot{}, map[uintptr]hostPin{}
	g.log.Info("p2p loaded the CUDA driver", "version", d.Version(), "devices", g.count)
	return nil
}

// available loads the driver and reports why it cannot be used, if so.
func (g *gpuState) available() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.driverLocked()
}

func (g *gpuState) contextLocked(dev int) (*cuda.Context, error) {
	if err := g.driverLocked(); err != nil {
		return nil, err
	}
	if dev < 0 || dev >= g.count {
		return nil, fmt.Errorf("p2p: CUDA device %d does not exist (this process sees %d)", dev, g.count)
	}
	if c := g.ctxs[dev]; c != nil {
		return c, nil
	}
	c, err := g.drv.Retain(dev)
	if err != nil {
		return nil, fmt.Errorf("p2p: CUDA device %d: %w", dev, err)
	}
	g.ctxs[dev] = c
	return c, nil
}

// context returns device dev's primary context, loading the driver first.
func (g *gpuState) context(dev int) (*cuda.Context, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.contextLocked(dev)
}

// busID is device dev's PCI bus id ("" if the driver cannot say).
func (g *gpuState) busID(dev int) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.drv == nil {
		return ""
	}
	s, _ := g.drv.PCIBusID(dev)
	return s
}

// deviceOfBus is the ordinal of the local device with PCI bus id bus, or
// -1 (another process may see devices under other ordinals:
// CUDA_VISIBLE_DEVICES).
func (g *gpuState) deviceOfBus(bus string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.drv == nil || bus == "" {
		return -1
	}
	for i := 0; i < g.count; i++ {
		if s, err := g.drv.PCIBusID(i); err == nil && s == bus {
			return i
		}
	}
	return -1
}

// slot takes an idle slot of device dev, or makes one.
func (g *gpuState) slot(dev int) (*cudaSlot, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ctx, err := g.contextLocked(dev)
	if err != nil {
		return nil, err
	}
	if l := g.idle[dev]; len(l) > 0 {
		s := l[len(l)-1]
		g.idle[dev] = l[:len(l)-1]
		return s, nil
	}
	s := &cudaSlot{dev: dev, ctx: ctx}
	if s.stream, err = ctx.NewStream(); err != nil {
		return nil, fmt.Errorf("p2p: CUDA stream on device %d: %w", dev, err)
	}
	for i := range s.ev {
		if s.ev[i], err = ctx.NewEvent(); err != nil {
			s.destroy()
			return nil, fmt.Errorf("p2p: CUDA event on device %d: %w", dev, err)
		}
	}
	g.slots = append(g.slots, s)
	return s, nil
}

// put returns a slot whose work is done.
func (g *gpuState) put(s *cudaSlot) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return
	}
	g.idle[s.dev] = append(g.idle[s.dev], s)
}

func (s *cudaSlot) destroy() {
	for i := range s.raw {
		if s.raw[i] != nil {
			s.ctx.FreeHost(s.raw[i])
		}
	}
	for _, e := range s.ev {
		if e != 0 {
			s.ctx.DestroyEvent(e)
		}
	}
	if s.stream != 0 {
		s.ctx.DestroyStream(s.stream)
	}
}

// bounces returns the slot's pinned bounce buffers, allocating them once.
func (s *cudaSlot) bounces() ([2][]byte, error) {
	for i := range s.buf {
		if s.buf[i] != nil {
			continue
		}
		raw, err := s.ctx.AllocHost(bounceSize + directAlign)
		if err != nil {
			return s.buf, fmt.Errorf("p2p: pinned bounce buffer: %w", err)
		}
		skip := (directAlign - int(uintptr(unsafe.Pointer(&raw[0]))%directAlign)) % directAlign
		s.raw[i], s.buf[i] = raw, raw[skip:skip+bounceSize:skip+bounceSize]
	}
	return s.buf, nil
}

// wait waits for event i of the slot: a query first (the work is often
// done), then the driver's own wait (cuEventSynchronize, with the context's
// scheduling policy), on the calling goroutine.
func (s *cudaSlot) wait(i int) error {
	if done, err := s.ctx.EventDone(s.ev[i]); err != nil || done {
		return err
	}
	return s.ctx.SyncEvent(s.ev[i])
}

// fence records event 0 after the work queued so far and waits for it.
func (s *cudaSlot) fence() error {
	if err := s.ctx.RecordEvent(s.ev[0], s.stream); err != nil {
		return err
	}
	return s.wait(0)
}

// cend is one end of a CUDA copy: host memory or a device address.
type cend struct {
	host []byte
	dev  cuda.DevicePtr
}

// copy queues n bytes from src to dst on the slot's stream.
func (s *cudaSlot) copy(dst, src cend, n int) error {
	switch {
	case dst.host == nil && src.host == nil:
		return s.ctx.CopyAsync(dst.dev, src.dev, n, s.stream)
	case dst.host == nil:
		return s.ctx.CopyToDeviceAsync(dst.dev, src.host[:n], s.stream)
	case src.host == nil:
		return s.ctx.CopyFromDeviceAsync(dst.host[:n], src.dev, s.stream)
	}
	copy(dst.host[:n], src.host[:n])
	return nil
}

// fromDevice copies n bytes at src to the host through the bounce buffers
// and hands each chunk to out once it is there; the copy of the next chunk
// runs while out works on this one.
func (s *cudaSlot) fromDevice(src cuda.DevicePtr, n uint64, out func(off uint64, chunk []byte) error) error {
	if n == 0 {
		return nil
	}
	bufs, err := s.bounces()
	if err != nil {
		return err
	}
	queue := func(i int, off uint64) error {
		k := min(n-off, bounceSize)
		if err := s.ctx.CopyFromDeviceAsync(bufs[i%2][:k], src+cuda.DevicePtr(off), s.stream); err != nil {
			return err
		}
		return s.ctx.RecordEvent(s.ev[i%2], s.stream)
	}
	if err := queue(0, 0); err != nil {
		return err
	}
	for i, off := 0, uint64(0); off < n; i++ {
		k := min(n-off, bounceSize)
		if next := off + k; next < n {
			if err := queue(i+1, next); err != nil {
				s.wait(i % 2)
				return err
			}
		}
		if err := s.wait(i % 2); err != nil {
			return err
		}
		if err := out(off, bufs[i%2][:k]); err != nil {
			s.ctx.SyncStream(s.stream) // the next chunk's copy may still write its buffer
			return err
		}
		off += k
	}
	return nil
}

// toDevice fills bounce chunks with fill and copies them to n bytes at dst;
// the copy of one chunk runs while fill works on the next. A failed copy
// does not stop the filling (a connection's data must still be read to
// stay in step): devErr is the device's error, fillErr fill's.
func (s *cudaSlot) toDevice(dst cuda.DevicePtr, n uint64, fill func(off uint64, buf []byte) error) (devErr, fillErr error) {
	if n == 0 {
		return nil, nil
	}
	bufs, err := s.bounces()
	if err != nil {
		devErr = err
		var scratch [64 << 10]byte
		for off := uint64(0); off < n && fillErr == nil; {
			k := min(n-off, uint64(len(scratch)))
			fillErr = fill(off, scratch[:k])
			off += k
		}
		return devErr, fillErr
	}
	for i, off := 0, uint64(0); off < n; i++ {
		b := i % 2
		if i >= 2 && devErr == nil {
			devErr = s.wait(b) // the buffer's previous copy
		}
		k := min(n-off, bounceSize)
		if fillErr = fill(off, bufs[b][:k]); fillErr != nil {
			break
		}
		if devErr == nil {
			devErr = s.ctx.CopyToDeviceAsync(dst+cuda.DevicePtr(off), bufs[b][:k], s.stream)
		}
		if devErr == nil {
			devErr = s.ctx.RecordEvent(s.ev[b], s.stream)
		}
		off += k
	}
	if err := s.ctx.SyncStream(s.stream); devErr == nil {
		devErr = err
	}
	return devErr, fillErr
}

// pin registers host memory b with the driver once (cuMemHostRegister,
// portable), so that copies between it and VRAM run by DMA at full speed
// and asynchronously. A failure is logged once and leaves the copies
// pageable (correct, slower).
func (g *gpuState) pin(b []byte, dev int) {
	if len(b) == 0 {
		return
	}
	key := uintptr(unsafe.Pointer(&b[0]))
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.pins[key]; ok {
		return
	}
	ctx, err := g.contextLocked(dev)
	if err != nil {
		return
	}
	err = ctx.HostRegister(b)
	g.pins[key] = hostPin{ctx: ctx, b: b, ok: err == nil}
	if err != nil && !g.warned {
		g.warned = true
		g.log.Warn("p2p cannot pin host memory for VRAM transfers; they use pageable copies (slower)", "bytes", len(b), "err", err)
	}
}

// unpin undoes pin (nothing if b was not pinned here). It must run before
// b's memory is unmapped or freed.
func (g *gpuState) unpin(b []byte) {
	if len(b) == 0 {
		return
	}
	key := uintptr(unsafe.Pointer(&b[0]))
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := g.pins[key]
	if !ok {
		return
	}
	delete(g.pins, key)
	if p.ok {
		p.ctx.HostUnregister(p.b)
	}
}

// ipcMapping is a peer's device allocation opened here (cuIpcOpenMemHandle).
type ipcMapping struct {
	base cuda.DevicePtr
	size int
	dev  int // the local device whose context opened it
	ctx  *cuda.Context
}

// openIPC opens a peer's allocation on device dev.
func (g *gpuState) openIPC(h [ipcHandleLen]byte, dev int) (*ipcMapping, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ctx, err := g.contextLocked(dev)
	if err != nil {
		return nil, err
	}
	base, err := ctx.OpenIPC(cuda.IPCHandle(h))
	if err != nil {
		return nil, err
	}
	_, size, err := ctx.AddressRange(base)
	if err != nil {
		ctx.CloseIPC(base)
		return nil, err
	}
	return &ipcMapping{base: base, size: size, dev: dev, ctx: ctx}, nil
}

// closeIPC unmaps what openIPC opened.
func (g *gpuState) closeIPC(m *ipcMapping) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return
	}
	if err := m.ctx.CloseIPC(m.base); err != nil {
		g.log.Warn("p2p cannot close a peer's CUDA IPC mapping", "err", err)
	}
}

// close releases the streams, events, bounce buffers, pins and contexts
// and closes the driver. The agent's transfers must be over.
func (g *gpuState) close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	if g.drv == nil {
		return nil
	}
	for _, p := range g.pins {
		if p.ok {
			p.ctx.HostUnregister(p.b)
		}
	}
	for _, s := range g.slots {
		s.destroy()
	}
	var err error
	if g.gds != nil {
		err = g.gds.Close() // the file regions deregistered theirs
	}
	for _, c := range g.ctxs {
		err = errors.Join(err, c.Release())
	}
	g.pins, g.slots, g.idle, g.ctxs = nil, nil, nil, nil
	return errors.Join(err, g.drv.Close())
}

// vramMem is a VRAM region's memory in this process.
type vramMem struct {
	dev int
	ctx *cuda.Context
}

// RegisterVRAM registers n bytes of device memory at devPtr on CUDA device
// ordinal device (memory from cuMemAlloc, in this process, e.g. a
// framework's KV cache). The range must lie inside one allocation. Peers
// on this host open the allocation's CUDA IPC handle from the metadata and
// copy to and from it on the GPU (cudaipc); other peers go through this
// agent (tcp, staged through pinned host buffers). Descriptors of the
// region have Addr = device address and DevID = device. Registering a
// range a VRAM region of the same device holds is a cache hit, as for
// RegisterMem. Without a CUDA driver (or without cgo) it returns an error
// wrapping ErrNotSupported that says why.
func (a *Agent) RegisterVRAM(devPtr uint64, n uint64, device int) (*Region, error) {
	if n == 0 {
		return nil, errors.New("p2p: RegisterVRAM of 0 bytes")
	}
	if devPtr == 0 || devPtr+n < devPtr {
		return nil, fmt.Errorf("p2p: RegisterVRAM: [%#x, +%d) is not a device range", devPtr, n)
	}
	if device < 0 || device >= maxDevices {
		return nil, fmt.Errorf("p2p: RegisterVRAM: device %d does not exist", device)
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil, ErrClosed
	}
	if r, ok := a.cache[regionKey{typ: VRAM, base: devPtr, len: n}]; ok && r.vram != nil && r.vram.dev == device {
		r.refs++
		a.mu.Unlock()
		return r, nil
	}
	if info, err := a.local.find(VRAM, devPtr, n, uint32(device)); err == nil {
		r := a.regions[info.ID]
		r.refs++
		a.mu.Unlock()
		return r, nil
	}
	a.mu.Unlock()
	ctx, err := a.gpu.context(device)
	if err != nil {
		return nil, fmt.Errorf("p2p: RegisterVRAM (device %d): %w", device, err)
	}
	mem, err := ctx.PointerInfo(cuda.DevicePtr(devPtr))
	if err != nil {
		return nil, fmt.Errorf("p2p: RegisterVRAM: %#x is not device memory allocated in this process: %w", devPtr, err)
	}
	if err := mem.CheckRange(cuda.DevicePtr(devPtr), n, device); errors.Is(err, cuda.ErrOutsideAllocation) {
		return nil, fmt.Errorf("p2p: RegisterVRAM: %w: %v", ErrOutOfBounds, err)
	} else if err != nil {
		return nil, fmt.Errorf("p2p: RegisterVRAM: %v", err)
	}
	base := mem.Base
	info := regionInfo{Type: VRAM, Base: devPtr, Len: n, Dev: uint32(device), Bus: a.gpu.busID(device), IPCOff: devPtr - uint64(base)}
	if h, err := ctx.IPCHandle(base); err == nil {
		info.IPC, info.Flags = h, regionIPC
	} else {
		a.log.Warn("p2p: no CUDA IPC handle for a VRAM region; peers on this host reach it over tcp", "device", device, "err", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, ErrClosed
	}
	r := a.addRegionLocked(info)
	r.vram = &vramMem{dev: device, ctx: ctx}
	a.log.Debug("registered VRAM", "id", r.info.ID, "device", device, "bus", info.Bus, "bytes", n, "ipc", info.Flags&regionIPC != 0)
	return r, nil
}

// Device is a VRAM region's CUDA device ordinal (-1 for DRAM and FILE).
func (r *Region) Device() int {
	if r.info.Type != VRAM {
		return -1
	}
	return int(r.info.Dev)
}

// localEnd is the initiator's end of segment s.
func (s *segment) localEnd() cend {
	if s.local.vram != nil {
		return cend{dev: cuda.DevicePtr(s.local.info.Base + s.loff)}
	}
	return cend{host: s.local.mem[s.loff : s.loff+s.n]}
}

// remoteEnd is the target's end of segment s, as seen here: this agent's
// region, a peer's shared segment or a peer's VRAM opened through IPC.
func (s *segment) remoteEnd() cend {
	ro := s.raddr - s.rinfo.Base
	if s.rinfo.Type == VRAM {
		return cend{dev: cuda.DevicePtr(s.rdev + ro)}
	}
	return cend{host: s.rmem[ro : ro+s.n]}
}

// cudaDev is the device whose stream copies segment s: the local VRAM's,
// else the remote VRAM's here.
func (s *segment) cudaDev() int {
	if s.local.vram != nil {
		return s.local.vram.dev
	}
	return s.rctxDev
}

// usesCUDA reports whether a request's copies go through the driver: a
// VRAM end on a backend where the initiator copies itself.
func (r *Request) usesCUDA() bool {
	switch r.backend {
	case BackendLocal, BackendSHM, BackendCUDAIPC:
		return r.local.typ == VRAM || r.remote.typ == VRAM
	}
	return false
}

// prepareCUDA loads what a request's CUDA copies need once, at
// MakeRequest: the driver, and pinned host memory for its DRAM ends.
func (r *Request) prepareCUDA() error {
	if err := r.a.gpu.available(); err != nil {
		return fmt.Errorf("p2p: %v of VRAM: %w", r.op, err)
	}
	for i := range r.segs {
		s := &r.segs[i]
		dev := s.cudaDev()
		if s.local.vram == nil {
			s.local.pinHost(dev)
		}
		switch {
		case s.rreg != nil && s.rreg.vram == nil:
			s.rreg.pinHost(dev)
		case !r.self && s.rinfo.Type == DRAM && r.ra != nil:
			r.ra.pinMapped(s.rinfo.ID, dev)
		}
	}
	return nil
}

// pinHost pins a DRAM region for CUDA copies, once; deregistration unpins.
func (r *Region) pinHost(dev int) {
	if r.mem != nil && r.pinned.CompareAndSwap(false, true) {
		r.a.gpu.pin(r.mem, dev)
	}
}

// runCUDA is the local, shm and cudaipc backends when an end is VRAM: every
// piece of a part is queued on a stream (one per device), then one event
// per stream is waited for before the part's notification.
func (r *Request) runCUDA() error {
	var slots []*cudaSlot
	defer func() {
		for _, s := range slots {
			r.a.gpu.put(s)
		}
	}()
	slotFor := func(dev int) (*cudaSlot, error) {
		for _, s := range slots {
			if s.dev == dev {
				return s, nil
			}
		}
		s, err := r.a.gpu.slot(dev)
		if err != nil {
			return nil, err
		}
		slots = append(slots, s)
		return s, nil
	}
	start := 0
	for i := range r.parts {
		ps := &r.parts[i]
		var err error
		for k := start; k < ps.end && err == nil; k++ {
			// Before each piece, not within one: a copy queued runs to its
			// end, and the fence below waits for it before any report.
			if (i > 0 || k > 0) && r.stop.stopped() {
				err = r.halted()
				break
			}
			s := &r.segs[k]
			var sl *cudaSlot
			if sl, err = slotFor(s.cudaDev()); err != nil {
				break
			}
			l, rm := s.localEnd(), s.remoteEnd()
			if r.op == Write {
				err = sl.copy(rm, l, int(s.n))
			} else {
				err = sl.copy(l, rm, int(s.n))
			}
		}
		for _, sl := range slots {
			if e := sl.fence(); err == nil {
				err = e
			}
		}
		if errors.Is(err, ErrTimeout) || errors.Is(err, ErrClosed) {
			return err
		}
		if err != nil {
			return fmt.Errorf("p2p: %v to %s: CUDA copy: %w", r.op, r.peer, err)
		}
		if err := r.notifyPart(i); err != nil {
			return err
		}
		start = ps.end
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
func (st *stager) writeFrames(a *Agent, p *peer, id uint64, r *Request, s *segment) error {
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
		off += k
	}
	return nil
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
			}
			p.landMu.Unlock()
		}
		off += k
	}
	return live && devErr == nil, devErr, nil
}

// toDeviceFrom lands n bytes read from rd at device address dst of device
// dev through pinned buffers (a tcp WRITE into a VRAM region, or a READ's
// data for local VRAM). All n bytes are read even when the device fails
// (devErr), so the connection stays in step; err is rd's.
func (g *gpuState) toDeviceFrom(rd io.Reader, dev int, dst, n uint64) (devErr, err error) {
	sl, devErr := g.slot(dev)
	if devErr != nil {
		_, err = io.CopyN(io.Discard, rd, int64(n))
		return devErr, err
	}
	defer g.put(sl)
	return sl.toDevice(cuda.DevicePtr(dst), n, func(_ uint64, buf []byte) error {
		_, err := io.ReadFull(rd, buf)
		return err
	})
}

// fileVRAM moves segment s between local VRAM and this agent's file
// through the slot's pinned buffers, in bounceSize chunks: the file I/O of
// one chunk (on the file pool, FileQueueDepth blocks at once) overlaps the
// device copy of the next.
func (r *Request) fileVRAM(s *segment) error {
	if r.a.cfg.GDS {
		if done, err := r.gdsVRAM(s); done {
			return err
		}
	}
	sl, err := r.a.gpu.slot(s.local.vram.dev)
	if err != nil {
		return fmt.Errorf("p2p: %v of VRAM and a file: %w", r.op, err)
	}
	defer r.a.gpu.put(sl)
	ptr, h := cuda.DevicePtr(s.local.info.Base+s.loff), s.rreg.file
	// run stops at the post's deadline between file blocks; halted then
	// ends the chunks. Both copy loops wait for their device copies
	// before returning.
	if r.op == Write {
		return sl.fromDevice(ptr, s.n, func(off uint64, chunk []byte) error {
			if err := r.a.files.run(h, true, [][]byte{chunk}, []int64{int64(s.raddr + off)}, &r.stop); err != nil {
				return err
			}
			return r.halted()
		})
	}
	devErr, err := sl.toDevice(ptr, s.n, func(off uint64, buf []byte) error {
		if err := r.a.files.run(h, false, [][]byte{buf}, []int64{int64(s.raddr + off)}, &r.stop); err != nil {
			return err
		}
		return r.halted()
	})
	if err != nil {
		return err
	}
	return devErr
}
