package engine

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/gccl/gccl/device"
	"github.com/gccl/gccl/internal/cuda"
	"github.com/gccl/gccl/internal/errs"
	"github.com/gccl/gccl/internal/reduce"
)

// Stream holds order a collective on a caller's CUDA stream, as NCCL's
// kernel on that stream does: when the call is issued, the engine records
// an event on the stream (the work the call's inputs depend on) and queues
// a wait there for a word of mapped host memory; the host writes the word
// once the call is complete on every rank, and only then does the stream's
// later work run. The hold never occupies the GPU, and a failed or aborted
// call releases it too, so a stream is never left waiting. As with NCCL,
// freeing device memory (which synchronizes the device) while a call holds
// a stream waits for the call.

// holdSlots is how many holds may be outstanding, or released but not yet
// passed by their streams, per engine; one more waits for the oldest.
const holdSlots = 1024

// holdState is an engine's words and events for holds.
type holdState struct {
	mu       sync.Mutex
	words    []byte // holdSlots 4-byte words of mapped pinned memory
	dev      cuda.DevicePtr
	free     []int
	retiring []*Hold // released, the stream perhaps not yet past the wait
	events   []cuda.Event
	active   int32 // this engine's holds not yet released, counted in ctxState
	// deferring says, per slot, that the slot's hold deferred the
	// context's IPC closes (cuda.Shared.BeginDeferral), to end at its
	// release.
	deferring []bool
}

// ctxState is what the engines of the process on one CUDA context share,
// kept with the context in the process's CUDA state (cuda.Shared.Value):
// ranks of one process on one GPU have an engine each on its one primary
// context, and what synchronizes the device (closing a mapping,
// cuCtxSynchronize, loading kernels) waits for a stream any of them holds,
// which waits for a call that may need the synchronizing rank. So they
// count their holds together, and load the kernels once, for all of them.
type ctxState struct {
	active  atomic.Int32 // the holds not yet released
	mu      sync.Mutex   // guards engines
	engines []*Engine    // the engines on the context
	kernels ctxKernels
	// A hold begins (active rises) only under syncMu, and memory is freed
	// only under it with no hold active, else left in freeing for the
	// release of the last hold: freeing synchronizes the device, and the
	// driver makes the process's other calls on the context wait for it,
	// so a rank freeing while another's call holds a stream would stop
	// that call short of its release.
	syncMu   sync.Mutex
	freeing  []deferredFree
	deferred atomic.Int32 // len(freeing), read without syncMu
}

// deferredFree is memory to free, and the context to free it with.
type deferredFree struct {
	ctx *cuda.Context
	p   cuda.DevicePtr
}

// ctxKernels are the reduction kernels loaded on a context
// (Engine.loadKernels).
type ctxKernels struct {
	mu    sync.Mutex
	mods  map[reduce.DType]module
	funcs map[kernelKey]cuda.Function
}

// ctxStateKey keys the engines' ctxState among the context's values.
type ctxStateKey struct{}

// joinContext sets e.shared to the state of e's context and registers e
// there.
func joinContext(e *Engine) error {
	v, err := e.sh.Value(e.ordinal, ctxStateKey{}, func() any {
		return &ctxState{kernels: ctxKernels{mods: map[reduce.DType]module{}, funcs: map[kernelKey]cuda.Function{}}}
	})
	if err != nil {
		return err
	}
	c := v.(*ctxState)
	// Set before e is visible to the others' releases (done), which read it.
	e.shared = c
	c.mu.Lock()
	c.engines = append(c.engines, e)
	c.mu.Unlock()
	return nil
}

// leaveContext unregisters a closing engine, and says whether it was the
// context's last.
func leaveContext(e *Engine) (last bool) {
	c := e.shared
	c.mu.Lock()
	defer c.mu.Unlock()
	if i := slices.Index(c.engines, e); i >= 0 {
		c.engines = slices.Delete(c.engines, i, i+1)
	}
	return len(c.engines) == 0
}

// done counts n holds on the context released; after the last, the
// memory freed meanwhile is freed.
func (c *ctxState) done(n int32) {
	if n == 0 || c.active.Add(-n) != 0 {
		return
	}
	if c.deferred.Load() > 0 {
		// Not here: a free in progress holds syncMu until the device is
		// idle, and this release may be what it waits for.
		go c.freeDeferred()
	}
}

// free frees device memory of the context, or leaves it for the release of
// the last hold (syncMu).
func (c *ctxState) free(ctx *cuda.Context, p cuda.DevicePtr) error {
	c.syncMu.Lock()
	defer c.syncMu.Unlock()
	if c.active.Load() > 0 {
		c.freeing = append(c.freeing, deferredFree{ctx, p})
		c.deferred.Store(int32(len(c.freeing)))
		if c.active.Load() > 0 {
			return nil // the last release, to come, sees deferred and frees it
		}
		// The last hold was released since, perhaps before deferred was
		// stored; no hold can begin while syncMu is held.
		c.freeDeferredLocked()
		return nil
	}
	return ctx.Free(p)
}

// freeDeferred frees the memory left while holds were active, unless a
// hold began since.
func (c *ctxState) freeDeferred() {
	c.syncMu.Lock()
	defer c.syncMu.Unlock()
	if c.active.Load() > 0 {
		return
	}
	c.freeDeferredLocked()
}

func (c *ctxState) freeDeferredLocked() {
	for _, f := range c.freeing {
		f.ctx.Free(f.p)
	}
	c.freeing = nil
	c.deferred.Store(0)
}

// Hold is a call's claim on a stream (device.Hold).
type Hold struct {
	e         *Engine
	slot      int
	in, after cuda.Event // recorded before and after the wait
	released  atomic.Bool
}

var _ device.Hold = (*Hold)(nil)

// Hold makes work queued on stream s from now on wait until the returned
// Hold is released; its Ready waits for the work queued before.
func (e *Engine) Hold(s cuda.Stream) (*Hold, error) {
	h := &e.holds
	h.mu.Lock()
	defer h.mu.Unlock()
	if e.isClosed() {
		return nil, errClosed
	}
	if h.words == nil {
		words, dev, err := e.ctx.AllocHostMapped(4 * holdSlots)
		if err != nil {
			return nil, fmt.Errorf("engine: memory for stream holds: %w", err)
		}
		h.words, h.dev = words, dev
		h.deferring = make([]bool, holdSlots)
		h.free = make([]int, holdSlots)
		for i := range h.free {
			h.free[i] = holdSlots - 1 - i
		}
	}
	if err := h.reclaimLocked(e, len(h.free) == 0); err != nil {
		return nil, err
	}
	// Counted, and the context's IPC closes deferred, before the wait is
	// queued: a mapping closed from now on would synchronize the device
	// behind it (by this process's engines and p2p agents alike).
	if err := e.sh.BeginDeferral(e.ordinal); err != nil {
		return nil, fmt.Errorf("engine: holding a stream: %w", err)
	}
	e.shared.syncMu.Lock()
	e.shared.active.Add(1)
	e.shared.syncMu.Unlock()
	hd := &Hold{e: e, slot: h.free[len(h.free)-1]}
	h.free = h.free[:len(h.free)-1]
	h.deferring[hd.slot] = true
	atomic.StoreUint32(h.word(hd.slot), 0)
	err := h.eventLocked(e, &hd.in)
	if err == nil {
		err = h.eventLocked(e, &hd.after)
	}
	if err == nil {
		err = e.ctx.RecordEvent(hd.in, s)
	}
	waiting := false
	if err == nil {
		err = e.ctx.WaitValue32(s, h.dev+cuda.DevicePtr(4*hd.slot), 1, cuda.WaitEQ)
		waiting = err == nil
	}
	if err == nil {
		err = e.ctx.RecordEvent(hd.after, s)
	}
	if err != nil {
		atomic.StoreUint32(h.word(hd.slot), 1)
		for _, ev := range []cuda.Event{hd.in, hd.after} {
			if ev != 0 {
				h.events = append(h.events, ev)
			}
		}
		if !waiting {
			h.free = append(h.free, hd.slot)
		} // else the stream waits for the word, and nothing says when it is past: the slot is lost
		h.deferring[hd.slot] = false
		e.shared.done(1)
		e.sh.EndDeferral(e.ordinal)
		return nil, fmt.Errorf("engine: holding a stream: %w", err)
	}
	h.active++
	return hd, nil
}

// Ready waits until the work queued on the stream before the hold is
// complete: the call's inputs are final, and its outputs no longer read.
func (hd *Hold) Ready() error { return hd.e.ctx.SyncEvent(hd.in) }

// Release lets the stream run past the hold. Calls after the first do
// nothing.
func (hd *Hold) Release() {
	if hd.released.Swap(true) {
		return
	}
	h := &hd.e.holds
	h.mu.Lock()
	counted := h.words != nil // else the engine closed, released every hold and uncounted them
	deferring := false
	if counted {
		atomic.StoreUint32(h.word(hd.slot), 1)
		h.retiring = append(h.retiring, hd)
		h.active--
		deferring, h.deferring[hd.slot] = h.deferring[hd.slot], false
	}
	h.mu.Unlock()
	if counted {
		hd.e.shared.done(1)
		if deferring {
			hd.e.sh.EndDeferral(hd.e.ordinal)
		}
	}
}

func (h *holdState) word(slot int) *uint32 {
	return (*uint32)(unsafe.Pointer(&h.words[4*slot]))
}

// eventLocked takes an event from the pool, or makes one.
func (h *holdState) eventLocked(e *Engine, ev *cuda.Event) error {
	if n := len(h.events); n > 0 {
		*ev, h.events = h.events[n-1], h.events[:n-1]
		return nil
	}
	var err error
	*ev, err = e.ctx.NewEvent()
	return err
}

// reclaimLocked frees the slots and events of released holds whose streams
// are past their waits; with wait, it first waits for the oldest one.
func (h *holdState) reclaimLocked(e *Engine, wait bool) error {
	if wait {
		if len(h.retiring) == 0 {
			return fmt.Errorf("engine: %d calls hold streams at once: %w", holdSlots, errs.ErrInvalidArgument)
		}
		if err := e.ctx.SyncEvent(h.retiring[0].after); err != nil {
			return err
		}
	}
	kept := h.retiring[:0]
	for _, hd := range h.retiring {
		done, err := e.ctx.EventDone(hd.after)
		if err != nil {
			return err
		}
		if !done {
			kept = append(kept, hd)
			continue
		}
		h.free = append(h.free, hd.slot)
		h.events = append(h.events, hd.in, hd.after)
	}
	clear(h.retiring[len(kept):])
	h.retiring = kept
	return nil
}

// closeLocked releases every hold, waits for the streams to pass them and
// frees the words and events. It returns how many holds were not yet
// released, for the caller to uncount (ctxState.done) once unlocked, and
// how many deferrals of IPC closes they took, to end after that.
func (h *holdState) closeLocked(e *Engine) (int32, int, error) {
	if h.words == nil {
		return 0, 0, nil
	}
	for i := 0; i < holdSlots; i++ {
		atomic.StoreUint32(h.word(i), 1)
	}
	deferrals := 0
	for _, d := range h.deferring {
		if d {
			deferrals++
		}
	}
	var err error
	for _, hd := range h.retiring {
		if serr := e.ctx.SyncEvent(hd.after); err == nil {
			err = serr
		}
		h.events = append(h.events, hd.in, hd.after)
	}
	for _, ev := range h.events {
		e.ctx.DestroyEvent(ev)
	}
	if ferr := e.ctx.FreeHost(h.words); err == nil {
		err = ferr
	}
	h.words, h.dev, h.free, h.retiring, h.events, h.deferring = nil, 0, nil, nil, nil, nil
	n := h.active
	h.active = 0
	return n, deferrals, err
}
