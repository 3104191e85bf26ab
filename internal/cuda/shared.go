package cuda

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Shared is one user's reference to the CUDA state that every user in the
// process shares: the driver, loaded once; each device's primary context,
// retained once; values kept per context (Value); and the peers'
// allocations opened into a context through CUDA IPC (Import), each opened
// once however many users import it. Each user (a p2p agent, a gpu
// Device and its engine) opens its own Shared and closes it when done: a
// context is released, and the driver closed, when the last reference
// that used it closes, after which the next OpenShared loads the driver
// again (GCCL_CUDA_LIBRARY is read then).
//
// The driver synchronizes the device when an IPC mapping is closed, so a
// user whose streams wait for something only the host can do (a stream
// held until a collective completes on every rank) defers the closes of
// the context meanwhile (DeferCloses): an Import closed then is unmapped
// when the last deferral ends.
//
// A Shared is safe for concurrent use.
type Shared struct {
	mu      sync.Mutex
	closed  bool
	ctxs    map[int]*sharedCtx   // the contexts this reference retained
	imports map[*Import]struct{} // imports open through this reference
}

// proc is the process's shared state. Lock order: Shared.mu, then a
// context's ipcMu, then proc.mu; no driver call that may wait for the
// device runs under proc.mu.
var proc struct {
	mu    sync.Mutex
	refs  int // open Shared references
	drv   *Driver
	count int
	bus   map[int]string
	ctxs  map[int]*sharedCtx
}

// sharedCtx is a device's primary context and what is kept with it.
type sharedCtx struct {
	ordinal int
	ctx     *Context
	refs    int // Shared references holding it (proc.mu)
	values  map[any]any

	// ipcMu orders the context's IPC opens and closes, and the start of
	// a deferral, so that a handle is never opened while its last mapping
	// is being closed, and no deferral begins during a close.
	ipcMu     sync.Mutex
	imports   map[IPCHandle]*importEntry // proc.mu
	deferring int                        // open deferrals (proc.mu)
	deferred  []DevicePtr                // closes left for the last deferral's end (proc.mu)
}

type importEntry struct {
	h    IPCHandle
	base DevicePtr
	size int
	refs int
}

// OpenShared returns a reference to the process's driver, loading it (as
// Load does) if no reference is open. Its error is Load's, or the
// driver's device count's.
func OpenShared() (*Shared, error) {
	proc.mu.Lock()
	defer proc.mu.Unlock()
	if proc.drv == nil {
		d, err := Load()
		if err != nil {
			return nil, err
		}
		n, err := d.DeviceCount()
		if err != nil {
			d.Close()
			return nil, err
		}
		proc.drv, proc.count = d, n
		proc.bus, proc.ctxs = map[int]string{}, map[int]*sharedCtx{}
	}
	proc.refs++
	return &Shared{ctxs: map[int]*sharedCtx{}, imports: map[*Import]struct{}{}}, nil
}

// Driver is the process's driver, valid until the reference closes (nil
// once the last one has).
func (s *Shared) Driver() *Driver {
	proc.mu.Lock()
	defer proc.mu.Unlock()
	return proc.drv
}

// DeviceCount is the number of devices the driver saw when it loaded.
func (s *Shared) DeviceCount() int {
	proc.mu.Lock()
	defer proc.mu.Unlock()
	return proc.count
}

// PCIBusID is device ordinal's PCI address (Driver.PCIBusID), asked once.
func (s *Shared) PCIBusID(ordinal int) (string, error) {
	if err := s.check(); err != nil {
		return "", err
	}
	proc.mu.Lock()
	defer proc.mu.Unlock()
	if id, ok := proc.bus[ordinal]; ok {
		return id, nil
	}
	id, err := proc.drv.PCIBusID(ordinal)
	if err == nil {
		proc.bus[ordinal] = id
	}
	return id, err
}

// DeviceOfBus is the ordinal of the device with PCI bus id bus, or -1
// (another process may see the devices under other ordinals:
// CUDA_VISIBLE_DEVICES).
func (s *Shared) DeviceOfBus(bus string) int {
	if bus == "" {
		return -1
	}
	for i := 0; i < s.DeviceCount(); i++ {
		if id, err := s.PCIBusID(i); err == nil && id == bus {
			return i
		}
	}
	return -1
}

func (s *Shared) check() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	return nil
}

// Context returns device ordinal's primary context, retained for the
// process by its first user and released when the last reference that
// asked for it closes.
func (s *Shared) Context(ordinal int) (*Context, error) {
	sc, err := s.context(ordinal)
	if err != nil {
		return nil, err
	}
	return sc.ctx, nil
}

func (s *Shared) context(ordinal int) (*sharedCtx, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if sc := s.ctxs[ordinal]; sc != nil {
		return sc, nil
	}
	proc.mu.Lock()
	defer proc.mu.Unlock()
	sc := proc.ctxs[ordinal]
	if sc == nil {
		if ordinal < 0 || ordinal >= proc.count {
			return nil, fmt.Errorf("cuda: device %d does not exist (this process sees %d)", ordinal, proc.count)
		}
		ctx, err := proc.drv.Retain(ordinal)
		if err != nil {
			return nil, err
		}
		sc = &sharedCtx{ordinal: ordinal, ctx: ctx, values: map[any]any{}, imports: map[IPCHandle]*importEntry{}}
		proc.ctxs[ordinal] = sc
	}
	sc.refs++
	s.ctxs[ordinal] = sc
	return sc, nil
}

// Value returns the value kept under key with device ordinal's context,
// made by init on first use: state that every user of the context shares
// (loaded modules, counts of held streams). It lives until the context is
// released. init runs under the cache's lock and must not call into it.
func (s *Shared) Value(ordinal int, key any, init func() any) (any, error) {
	sc, err := s.context(ordinal)
	if err != nil {
		return nil, err
	}
	proc.mu.Lock()
	defer proc.mu.Unlock()
	v, ok := sc.values[key]
	if !ok {
		v = init()
		sc.values[key] = v
	}
	return v, nil
}

// Import is a user's reference to a peer's allocation opened into a
// context through its IPC handle (cuIpcOpenMemHandle).
type Import struct {
	s      *Shared
	sc     *sharedCtx
	e      *importEntry
	closed atomic.Bool
}

// Base is the allocation's first device address in this process.
func (i *Import) Base() DevicePtr { return i.e.base }

// Size is the allocation's size in bytes.
func (i *Import) Size() int { return i.e.size }

// Ordinal is the device whose context opened it.
func (i *Import) Ordinal() int { return i.sc.ordinal }

// Context is the context that opened it.
func (i *Import) Context() *Context { return i.sc.ctx }

// Import maps the allocation behind another process's handle h into device
// ordinal's context, or takes another reference to it if a user in this
// process has it open there. The driver refuses handles of this process.
func (s *Shared) Import(ordinal int, h IPCHandle) (*Import, error) {
	sc, err := s.context(ordinal)
	if err != nil {
		return nil, err
	}
	sc.ipcMu.Lock()
	proc.mu.Lock()
	e := sc.imports[h]
	if e != nil {
		e.refs++
	}
	proc.mu.Unlock()
	if e == nil {
		base, err := sc.ctx.OpenIPC(h)
		if err != nil {
			sc.ipcMu.Unlock()
			return nil, err
		}
		_, size, err := sc.ctx.AddressRange(base)
		if err != nil {
			sc.ctx.CloseIPC(base)
			sc.ipcMu.Unlock()
			return nil, err
		}
		e = &importEntry{h: h, base: base, size: size, refs: 1}
		proc.mu.Lock()
		sc.imports[h] = e
		proc.mu.Unlock()
	}
	sc.ipcMu.Unlock()
	imp := &Import{s: s, sc: sc, e: e}
	s.mu.Lock()
	if s.closed { // closed meanwhile: its Close did not see this one
		s.mu.Unlock()
		imp.drop()
		return nil, ErrClosed
	}
	s.imports[imp] = struct{}{}
	s.mu.Unlock()
	return imp, nil
}

// Close drops the reference; the last one unmaps the allocation, or, while
// the context's closes are deferred, leaves that for the end of the last
// deferral. Calls after the first do nothing.
func (i *Import) Close() error {
	i.s.mu.Lock()
	delete(i.s.imports, i)
	i.s.mu.Unlock()
	return i.drop()
}

func (i *Import) drop() error {
	if i.closed.Swap(true) {
		return nil
	}
	sc := i.sc
	sc.ipcMu.Lock()
	defer sc.ipcMu.Unlock()
	proc.mu.Lock()
	i.e.refs--
	if i.e.refs > 0 {
		proc.mu.Unlock()
		return nil
	}
	delete(sc.imports, i.e.h)
	if sc.deferring > 0 {
		sc.deferred = append(sc.deferred, i.e.base)
		proc.mu.Unlock()
		return nil
	}
	proc.mu.Unlock()
	return sc.ctx.CloseIPC(i.e.base)
}

// DeferCloses leaves the unmapping of the context's imports closed from now
// on until end is called (once per DeferCloses; later calls do nothing).
// It waits for a close under way to finish first. The mappings deferred
// are closed by the end of the last deferral of the context.
func (s *Shared) DeferCloses(ordinal int) (end func() error, err error) {
	sc, err := s.beginDeferral(ordinal)
	if err != nil {
		return nil, err
	}
	var once sync.Once
	return func() error {
		var err error
		once.Do(func() { err = sc.endDeferral() })
		return err
	}, nil
}

// BeginDeferral is DeferCloses without the closure, for hot paths (it
// allocates nothing): each BeginDeferral that succeeded must be ended by
// exactly one EndDeferral of the same device.
func (s *Shared) BeginDeferral(ordinal int) error {
	_, err := s.beginDeferral(ordinal)
	return err
}

// EndDeferral ends a deferral begun by BeginDeferral.
func (s *Shared) EndDeferral(ordinal int) error {
	sc, err := s.context(ordinal)
	if err != nil {
		return err
	}
	return sc.endDeferral()
}

func (s *Shared) beginDeferral(ordinal int) (*sharedCtx, error) {
	sc, err := s.context(ordinal)
	if err != nil {
		return nil, err
	}
	sc.ipcMu.Lock()
	proc.mu.Lock()
	sc.deferring++
	proc.mu.Unlock()
	sc.ipcMu.Unlock()
	return sc, nil
}

func (sc *sharedCtx) endDeferral() error {
	sc.ipcMu.Lock()
	defer sc.ipcMu.Unlock()
	proc.mu.Lock()
	sc.deferring--
	var ps []DevicePtr
	if sc.deferring == 0 {
		ps, sc.deferred = sc.deferred, nil
	}
	proc.mu.Unlock()
	var err error
	for _, p := range ps {
		err = errors.Join(err, sc.ctx.CloseIPC(p))
	}
	return err
}

// Close closes the imports still open through the reference, releases the
// contexts it retained that no other reference holds, and, if it was the
// last reference, closes the driver. Calls after the first do nothing.
func (s *Shared) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	imports, ctxs := s.imports, s.ctxs
	s.imports, s.ctxs = nil, nil
	s.mu.Unlock()
	var err error
	for imp := range imports {
		err = errors.Join(err, imp.drop())
	}
	proc.mu.Lock()
	var last []*sharedCtx
	for ord, sc := range ctxs {
		if sc.refs--; sc.refs == 0 {
			delete(proc.ctxs, ord)
			last = append(last, sc)
		}
	}
	proc.mu.Unlock()
	// No user is left on these contexts: nothing imports or defers there
	// any more. What a deferral left open is closed with the context,
	// before the driver (proc.refs still counts this reference).
	for _, sc := range last {
		for _, p := range sc.deferred {
			err = errors.Join(err, sc.ctx.CloseIPC(p))
		}
		err = errors.Join(err, sc.ctx.Release())
	}
	proc.mu.Lock()
	defer proc.mu.Unlock()
	if proc.refs--; proc.refs == 0 {
		err = errors.Join(err, proc.drv.Close())
		proc.drv, proc.bus, proc.ctxs = nil, nil, nil
	}
	return err
}
