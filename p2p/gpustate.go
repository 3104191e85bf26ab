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

// gpuState is an agent's use of CUDA, started on first use (RegisterVRAM, a
// peer's VRAM regions on this host, a transfer with a VRAM end): its
// reference to the process's driver, primary contexts and CUDA IPC
// mappings (cuda.Shared, which other agents and package gpu share), its
// pool of streams with their events and bounce buffers, and the host memory
// it pinned. Close releases it all.
type gpuState struct {
	log *slog.Logger

	mu     sync.Mutex
	loaded bool
	closed bool
	sh     *cuda.Shared
	err    error // why there is no driver (wraps ErrNotSupported)
	count  int
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
	sh, err := cuda.OpenShared()
	if err != nil {
		g.err = fmt.Errorf("%w: no usable CUDA driver: %w", ErrNotSupported, err)
		return g.err
	}
	if g.count = sh.DeviceCount(); g.count == 0 {
		sh.Close()
		g.err = fmt.Errorf("%w: the CUDA driver sees no device", ErrNotSupported)
		return g.err
	}
	g.sh = sh
	g.idle, g.pins = map[int][]*cudaSlot{}, map[uintptr]hostPin{}
	g.log.Info("p2p loaded the CUDA driver", "version", sh.Driver().Version(), "devices", g.count)
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
	c, err := g.sh.Context(dev)
	if err != nil {
		return nil, fmt.Errorf("p2p: CUDA device %d: %w", dev, err)
	}
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
	if g.sh == nil {
		return ""
	}
	s, _ := g.sh.PCIBusID(dev)
	return s
}

// deviceOfBus is the ordinal of the local device with PCI bus id bus, or
// -1 (another process may see devices under other ordinals:
// CUDA_VISIBLE_DEVICES).
func (g *gpuState) deviceOfBus(bus string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.sh == nil {
		return -1
	}
	return g.sh.DeviceOfBus(bus)
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

// ipcMapping is a peer's device allocation opened here
// (cuIpcOpenMemHandle), shared with the process's other users of it.
type ipcMapping = cuda.Import

// openIPC opens a peer's allocation on device dev.
func (g *gpuState) openIPC(h [ipcHandleLen]byte, dev int) (*ipcMapping, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, err := g.contextLocked(dev); err != nil {
		return nil, err
	}
	return g.sh.Import(dev, cuda.IPCHandle(h))
}

// closeIPC unmaps what openIPC opened (once no other user in the process
// has it open); after close there is nothing left to unmap.
func (g *gpuState) closeIPC(m *ipcMapping) {
	if err := m.Close(); err != nil {
		g.log.Warn("p2p cannot close a peer's CUDA IPC mapping", "err", err)
	}
}

// close releases the streams, events, bounce buffers and pins, and its
// reference to the driver and contexts. The agent's transfers must be over.
func (g *gpuState) close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	if g.sh == nil {
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
	g.pins, g.slots, g.idle = nil, nil, nil
	// The contexts, the driver and what is still mapped through this
	// reference go once no other user in the process holds them.
	return errors.Join(err, g.sh.Close())
}
