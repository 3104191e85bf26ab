package comm

import (
	"runtime"
	"testing"
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
