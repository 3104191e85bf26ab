//go:build linux && cgo

package engine_test

import (
	"testing"
	"time"

	"github.com/gccl/gccl/gpu/internal/engine"
	"github.com/gccl/gccl/internal/cuda"
	"github.com/gccl/gccl/internal/cuda/cudatest"
	"github.com/gccl/gccl/internal/cuda/devtest"
)

// A hold keeps the stream's later work waiting until it is released; its
// Ready sees the work queued before it.
func TestHoldOrdersStream(t *testing.T) {
	ctx, e := openEngine(t)
	s := stream(t, ctx)
	ev, err := ctx.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.DestroyEvent(ev)
	p := alloc(t, ctx, 64)
	if err := ctx.MemsetAsync(p, 1, 64, s); err != nil {
		t.Fatal(err)
	}
	h, err := e.Hold(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctx.MemsetAsync(p, 2, 64, s); err != nil {
		t.Fatal(err)
	}
	if err := ctx.RecordEvent(ev, s); err != nil {
		t.Fatal(err)
	}
	if err := h.Ready(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 64)
	if err := e.CopyToHost(got, uintptr(p)); err != nil || got[0] != 1 || got[63] != 1 {
		t.Fatalf("after Ready, before Release: %v, %v; want the first memset's 1s", got[:4], err)
	}
	if done, err := ctx.EventDone(ev); done || err != nil {
		t.Fatalf("the stream ran past an unreleased hold: %v, %v", done, err)
	}
	h.Release()
	h.Release() // a second release does nothing
	if err := ctx.SyncEvent(ev); err != nil {
		t.Fatal(err)
	}
	if err := e.CopyToHost(got, uintptr(p)); err != nil || got[0] != 2 {
		t.Fatalf("after Release: %v, %v; want 2s", got[:4], err)
	}
}

// Holds reuse their words once the stream is past them: far more holds
// than there are words, one after another, all work.
func TestHoldsReuseWords(t *testing.T) {
	ctx, e := openEngine(t)
	s := stream(t, ctx)
	for i := range 3000 {
		h, err := e.Hold(s)
		if err != nil {
			t.Fatalf("hold %d: %v", i, err)
		}
		if err := h.Ready(); err != nil {
			t.Fatal(err)
		}
		h.Release()
	}
	if err := ctx.SyncStream(s); err != nil {
		t.Fatal(err)
	}
}

// Closing the engine releases the holds still outstanding: no stream is
// left waiting, and a later Release does nothing.
func TestCloseReleasesHolds(t *testing.T) {
	ctx, e := openEngine(t)
	s := stream(t, ctx)
	h, err := e.Hold(s)
	if err != nil {
		t.Fatal(err)
	}
	p := alloc(t, ctx, 16)
	if err := ctx.MemsetAsync(p, 5, 16, s); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ctx.SyncStream(s); err != nil {
		t.Fatal(err)
	}
	h.Release()
	if _, err := e.Hold(s); err == nil {
		t.Error("Hold on a closed engine succeeded")
	}
	got := make([]byte, 16)
	if err := ctx.CopyFromDevice(got, p); err != nil || got[0] != 5 {
		t.Fatalf("%v, %v", got[:4], err)
	}
}

func stream(t *testing.T, ctx *cuda.Context) cuda.Stream {
	t.Helper()
	s, err := ctx.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.DestroyStream(s) })
	return s
}

// An engine made on a context while another engine's holds come and go is
// registered complete: the release of the context's last hold may visit it
// at once, from another goroutine. (Run with -race: it
// reported the engine's half-set state; without the detector it could
// panic on it.)
func TestEngineJoinsWhileHoldsRelease(t *testing.T) {
	cudatest.Driver(t)
	sh := devtest.Shared(t)
	ctx, err := sh.Context(0)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.NewEngine(sh, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	s := stream(t, ctx)
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			h, err := e.Hold(s)
			if err != nil {
				done <- err
				return
			}
			h.Release()
		}
	}()
	for range 200 {
		other, err := engine.NewEngine(sh, 0, "")
		if err != nil {
			t.Fatal(err)
		}
		other.Close()
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Memory freed while a hold is active is freed at the hold's release, not
// at once: freeing synchronizes the device, which would wait for the held
// stream, and the driver holds the process's other calls meanwhile.
func TestFreeWaitsForTheLastHold(t *testing.T) {
	ctx, e := openEngine(t)
	s := stream(t, ctx)
	h, err := e.Hold(s)
	if err != nil {
		t.Fatal(err)
	}
	p, err := ctx.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Free(p); err != nil {
		t.Fatal(err)
	}
	if n := engine.DeferredFrees(e); n != 1 {
		t.Fatalf("%d frees deferred while a stream is held, want 1", n)
	}
	h.Release() // frees it, on another goroutine
	for start := time.Now(); engine.DeferredFrees(e) != 0; time.Sleep(time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("%d frees still deferred 10 s after the release, want 0", engine.DeferredFrees(e))
		}
	}
	q, err := ctx.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Free(q); err != nil || engine.DeferredFrees(e) != 0 {
		t.Fatalf("Free with no hold: %v, %d deferred; want it freed at once", err, engine.DeferredFrees(e))
	}
}

// Memory one engine freed while another's call held a stream is still
// freed at the release after the freeing engine closed.
func TestDeferredFreeOutlivesItsEngine(t *testing.T) {
	ctx, e1 := openEngine(t)
	sh2 := devtest.Shared(t) // another user's reference
	bus, _ := sh2.PCIBusID(0)
	e2, err := engine.NewEngine(sh2, 0, bus)
	if err != nil {
		t.Fatal(err)
	}
	h, err := e1.Hold(stream(t, ctx))
	if err != nil {
		t.Fatal(err)
	}
	p, err := ctx.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	if err := e2.Free(p); err != nil || engine.DeferredFrees(e1) != 1 {
		t.Fatalf("Free while a stream is held: %v, %d deferred; want 1", err, engine.DeferredFrees(e1))
	}
	if err := e2.Close(); err != nil {
		t.Fatal(err)
	}
	h.Release()
	for start := time.Now(); engine.DeferredFrees(e1) != 0; time.Sleep(time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatal("the free left by a closed engine was never done")
		}
	}
}
