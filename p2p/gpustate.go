package p2p

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"unsafe"

	"github.com/gccl/gccl/internal/cuda"
	"github.com/gccl/gccl/internal/cufile"
)

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
