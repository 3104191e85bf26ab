package comm_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gccl/gccl/bootstrap"
	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/transport"
)

// TestCloseRunsQueuedAsync: Close waits for the async operations issued
// before it, which run to completion rather than fail.
func TestCloseRunsQueuedAsync(t *testing.T) {
	cs, err := comm.InitLocal(2, &comm.Config{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		bufs := make([][]float32, 8)
		reqs := make([]*comm.Request, len(bufs))
		for i := range reqs {
			bufs[i] = make([]float32, 1024)
			for j := range bufs[i] {
				bufs[i][j] = float32(i + c.Rank())
			}
			reqs[i] = comm.AllReduceAsync(c, bufs[i], bufs[i], comm.Sum)
		}
		if err := c.Close(); err != nil {
			return fmt.Errorf("Close: %v", err)
		}
		for i, r := range reqs {
			if err := r.Wait(bg); err != nil {
				return fmt.Errorf("request %d, issued before Close: %v", i, err)
			}
			if want := float32(2*i + 1); bufs[i][0] != want || bufs[i][1023] != want {
				return fmt.Errorf("request %d: got %v, want %v", i, bufs[i][0], want)
			}
		}
		x := []float32{1}
		if err := comm.AllReduce(bg, c, x, x, comm.Sum); !errors.Is(err, comm.ErrClosed) {
			return fmt.Errorf("call after Close: %v", err)
		}
		return nil
	}))
}

// TestAbortEndsClose: Abort during a Close that waits for a stuck async
// operation fails that operation, and Close returns.
func TestAbortEndsClose(t *testing.T) {
	cs := world(t, 2, &comm.Config{Timeout: time.Minute})
	x := make([]float32, 16)
	req := comm.AllReduceAsync(cs[0], x, x, comm.Sum) // rank 1 never joins
	closed := make(chan error, 1)
	go func() { closed <- cs[0].Close() }()
	time.Sleep(100 * time.Millisecond) // Close is waiting for the request
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while its queued operation waits for a peer", err)
	default:
	}
	cs[0].Abort(errors.New("operator stop"))
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close still blocked 5 s after Abort")
	}
	if err := req.Wait(bg); !errors.Is(err, comm.ErrAborted) {
		t.Fatalf("the stuck operation: %v, want ErrAborted", err)
	}
}

// initJob starts n ranks of a multi-process-style job inside this process:
// a rendezvous, comm.Init per rank, TCP over loopback.
func initJob(t *testing.T, n int) (cs []*comm.Comm, stop func()) {
	t.Helper()
	t.Setenv("GCCL_SHM_DISABLE", "1")
	return initJobOver(t, n)
}

// initJobOver is initJob over the transports the environment allows:
// shared memory between the ranks, unless GCCL_SHM_DISABLE=1.
func initJobOver(t *testing.T, n int) (cs []*comm.Comm, stop func()) {
	t.Helper()
	t.Setenv("GCCL_SOCKET_IFNAME", "lo")
	quiet := slog.New(slog.DiscardHandler)
	secret := bootstrap.NewSecret()
	srv, err := bootstrap.NewServer("127.0.0.1:0", secret, n, bootstrap.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	cs = make([]*comm.Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs[r], errs[r] = comm.Init(context.Background(), &comm.Config{Logger: quiet, Bootstrap: &bootstrap.Config{
				Rank: r, Size: n, Addr: srv.Addr(), Secret: secret, Timeout: 10 * time.Second, Logger: quiet}})
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: Init: %v", r, err)
		}
	}
	return cs, func() { srv.Stop(); <-served }
}

// TestCloseAfterAbortReleasesEverything: an aborted Comm's Close still
// closes its transport and rendezvous connection; nothing is left running.
func TestCloseAfterAbortReleasesEverything(t *testing.T) {
	for _, abort := range []bool{false, true} {
		t.Run(fmt.Sprintf("abort=%v", abort), func(t *testing.T) {
			before := runtime.NumGoroutine()
			cs, stop := initJob(t, 2)
			mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
				x := []float32{1} // each rank's own: in place
				return comm.AllReduce(bg, c, x, x, comm.Sum)
			}))
			if abort {
				for _, c := range cs {
					c.Abort(nil)
				}
			}
			mustAll(t, onAll(t, cs, func(c *comm.Comm) error { return c.Close() }))
			stop()
			checkNoLeak(t, before)
		})
	}
}

// TestErrReportsFailureBetweenCalls: Err is nil while a Comm is usable, and
// turns into the abort's cause without any call, also when the failure
// happened on another rank (the rendezvous tells the others).
func TestErrReportsFailureBetweenCalls(t *testing.T) {
	cs := world(t, 2, nil)
	allReduce := func(c *comm.Comm) error {
		x := []float32{1}
		return comm.AllReduce(bg, c, x, x, comm.Sum)
	}
	mustAll(t, onAll(t, cs, allReduce))
	for r, c := range cs {
		if err := c.Err(); err != nil {
			t.Fatalf("rank %d: Err = %v on a healthy Comm", r, err)
		}
	}
	cause := errors.New("operator stop")
	cs[0].Abort(cause)
	if err := cs[0].Err(); !errors.Is(err, comm.ErrAborted) || !errors.Is(err, cause) {
		t.Fatalf("after Abort: Err = %v, want ErrAborted wrapping the cause", err)
	}
	if err := cs[0].Close(); err != nil {
		t.Fatal(err)
	}
	if err := cs[0].Err(); !errors.Is(err, cause) {
		t.Fatalf("after Close of an aborted Comm: Err = %v, want the abort's cause", err)
	}
	if err := cs[1].Close(); err != nil {
		t.Fatal(err)
	}
	if err := cs[1].Err(); !errors.Is(err, comm.ErrClosed) {
		t.Fatalf("after Close: Err = %v, want ErrClosed", err)
	}

	job, stop := initJob(t, 3)
	defer stop()
	defer func() {
		for _, c := range job {
			c.Close()
		}
	}()
	mustAll(t, onAll(t, job, allReduce))
	job[2].Abort(cause)
	for r, c := range job[:2] {
		deadline := time.Now().Add(10 * time.Second)
		for c.Err() == nil && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if err := c.Err(); !errors.Is(err, comm.ErrAborted) || !errors.Is(err, comm.ErrPeerLost) {
			t.Fatalf("rank %d, idle while rank 2 aborted: Err = %v, want ErrAborted wrapping ErrPeerLost", r, err)
		}
	}
}

// setupFailed is an endpoint whose connection with peer failed its set-up
// with err.
type setupFailed struct {
	transport.Endpoint
	peer int
	err  error
}

func (e *setupFailed) SetupFailure(peer int) error {
	if peer == e.peer {
		return e.err
	}
	return nil
}

// TestLostPeerBlamesFailedSetup: a rank whose connection with a peer
// failed its set-up reports that failure first when the peer is then lost
// (the peer stopped on it), still as ErrPeerLost; without one, the loss
// alone.
func TestLostPeerBlamesFailedSetup(t *testing.T) {
	cause := errors.New("rank 0 -> 1 via TCP instead of IB (modify to RTR: timed out)")
	comm.SetEndpointHook(func(ep transport.Endpoint) transport.Endpoint {
		if ep.Rank() != 0 {
			return ep
		}
		return &setupFailed{Endpoint: ep, peer: 1, err: cause}
	})
	cs, stop := initJob(t, 3)
	comm.SetEndpointHook(nil)
	defer stop()
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	cs[1].Abort(errors.New("rank 1 stopped"))
	for r, want := range map[int]bool{0: true, 2: false} {
		err := cs[r].Err()
		for deadline := time.Now().Add(10 * time.Second); err == nil && time.Now().Before(deadline); err = cs[r].Err() {
			time.Sleep(time.Millisecond)
		}
		if !errors.Is(err, comm.ErrAborted) || !errors.Is(err, comm.ErrPeerLost) {
			t.Fatalf("rank %d: Err = %v, want ErrAborted and ErrPeerLost", r, err)
		}
		if got := errors.Is(err, cause); got != want {
			t.Fatalf("rank %d: Err = %v; names the set-up failure: %v, want %v", r, err, got, want)
		}
		if want && !strings.HasPrefix(err.Error(), "gccl: communicator aborted: "+cause.Error()+"; then gccl: peer lost: ") {
			t.Fatalf("rank %d: Err = %q does not give the set-up failure first", r, err)
		}
	}
}
