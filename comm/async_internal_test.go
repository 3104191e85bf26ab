package comm

import (
	"context"
	"runtime"
	"testing"
	"unsafe"
)

// A Request's done channel is made on demand: made by Done while the
// request completes, it must be closed exactly once (a double close
// panics), and a Done made after completion must be closed already.
func TestRequestDoneRacesCompletion(t *testing.T) {
	for i := 0; i < 20000; i++ {
		r := &Request{}
		go func() {
			runtime.Gosched()
			r.complete(nil)
		}()
		<-r.Done()
		if r.Err() != nil || !r.finished.Load() {
			t.Fatal("Done closed before the request completed")
		}
	}
	r := &Request{}
	r.complete(nil)
	select {
	case <-r.Done():
	default:
		t.Fatal("Done of a completed request is open")
	}
}

// TestRequestFitsItsSizeClass: every async call allocates a Request, and
// the bytes allocated set how often the garbage collector runs beside the
// ranks. The call itself waits in the queue's ring, not in the Request; a
// field that pushes the Request past 48 bytes (the size class it fills)
// should be a deliberate choice.
func TestRequestFitsItsSizeClass(t *testing.T) {
	if sz := unsafe.Sizeof(Request{}); sz > 48 {
		t.Fatalf("Request is %d bytes, past the 48-byte size class", sz)
	}
}

// A slot of the ring is cleared once its call ran: it would otherwise keep
// the caller's buffers and the Request reachable until the ring came
// round again.
func TestAsyncQueueClearsRunSlots(t *testing.T) {
	cs, err := InitLocal(1, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := cs[0]
	defer c.Close()
	x := []float32{1, 2}
	var last *Request
	for range 10 {
		last = c.AllReduceAsync(Host(x), Host(x), Sum)
	}
	if err := last.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range c.async.ring {
		if q := &c.async.ring[i]; q.r != nil || q.cl.in.b != nil || q.cl.out.b != nil {
			t.Fatalf("slot %d still holds its call after it ran", i)
		}
	}
	if p := c.async.pending(); p != 0 {
		t.Fatalf("pending %d after the last request completed", p)
	}
}
