package comm

import (
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
// ranks. A field that pushes it past 320 bytes (the size class it fills)
// should be a deliberate choice.
func TestRequestFitsItsSizeClass(t *testing.T) {
	if sz := unsafe.Sizeof(Request{}); sz > 320 {
		t.Fatalf("Request is %d bytes, past the 320-byte size class", sz)
	}
}
