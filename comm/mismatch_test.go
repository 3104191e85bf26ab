package comm_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/internal/logx"
	"github.com/gccl/gccl/internal/testutil"
)

// TestDifferentCountsFailLoudly: ranks passing different counts (or types,
// ops, roots) to one collective get ErrMismatch, never a wrong answer, also
// when the counts cut into chunks of the same length that would pair up.
// (Where no rank receives from a rank that disagrees, say two ranks that
// each believe they are a broadcast's root, nothing can tell until the
// next call.)
func TestDifferentCountsFailLoudly(t *testing.T) {
	rootOf := func(c *comm.Comm) int { return c.Rank() / 2 } // rank 2 disagrees
	for _, algo := range []string{"ring", "tree", ""} {
		for _, c := range []struct {
			name string
			run  func(c *comm.Comm) error
		}{
			{name: "counts", run: func(c *comm.Comm) error {
				x := make([]int32, 32<<c.Rank())
				return comm.AllReduce(bg, c, x, x, comm.Sum)
			}},
			{name: "int32 against float32", run: func(c *comm.Comm) error {
				if c.Rank() == 0 {
					x := make([]int32, 64)
					return comm.AllReduce(bg, c, x, x, comm.Sum)
				}
				x := make([]float32, 64)
				return comm.AllReduce(bg, c, x, x, comm.Sum)
			}},
			{name: "sum against max", run: func(c *comm.Comm) error {
				x := make([]int32, 64)
				return comm.AllReduce(bg, c, x, x, []comm.Op{comm.Sum, comm.Max}[c.Rank()%2])
			}},
			{name: "broadcast roots", run: func(c *comm.Comm) error {
				x := make([]int32, 64)
				return comm.Broadcast(bg, c, x, x, rootOf(c))
			}},
			{name: "reduce roots", run: func(c *comm.Comm) error {
				x := make([]int32, 64)
				return comm.Reduce(bg, c, x, x, comm.Sum, rootOf(c))
			}},
			{name: "all-gather blocks", run: func(c *comm.Comm) error {
				n := 16 << c.Rank()
				return comm.AllGather(bg, c, make([]int32, n), make([]int32, 3*n))
			}},
		} {
			t.Run(fmt.Sprintf("%s/algo=%q", c.name, algo), func(t *testing.T) {
				// 64-byte slots: the counts cut into 64-byte chunks alike.
				cs := world(t, 3, &comm.Config{SlotSize: 64, Timeout: 3 * time.Second, Algo: algo})
				if errs := onAll(t, cs, c.run); !anyIs(errs, comm.ErrMismatch) {
					t.Fatalf("no rank reported ErrMismatch: %v", errs)
				}
			})
		}
	}
}

// TestSendRecvLengthsMustMatch: a receive shorter or longer than its send
// fails on both ranks; the data is neither truncated nor left to the next
// receive.
func TestSendRecvLengthsMustMatch(t *testing.T) {
	for _, lens := range [][2]int{{512, 256}, {256, 512}, {512, 768}} {
		t.Run(fmt.Sprintf("send %d recv %d", lens[0], lens[1]), func(t *testing.T) {
			cs := world(t, 2, &comm.Config{SlotSize: 256, Timeout: 3 * time.Second})
			errs := onAll(t, cs, func(c *comm.Comm) error {
				if c.Rank() == 0 {
					return comm.Send(bg, c, make([]byte, lens[0]), 1)
				}
				return comm.Recv(bg, c, make([]byte, lens[1]), 0)
			})
			if !errors.Is(errs[1], comm.ErrMismatch) {
				t.Fatalf("receive: %v, want ErrMismatch (send: %v)", errs[1], errs[0])
			}
		})
	}
}

// TestRejectedSplitIsDetected: a Split that one rank rejects is numbered,
// so the peers' Split meets that rank's next call as a mismatch instead of
// taking its data.
func TestRejectedSplitIsDetected(t *testing.T) {
	cs := world(t, 2, &comm.Config{Timeout: 3 * time.Second})
	var mu sync.Mutex
	var subs []*comm.Comm
	errs := onAll(t, cs, func(c *comm.Comm) error {
		if c.Rank() == 0 {
			if _, err := c.Split(bg, -7, 0); !errors.Is(err, comm.ErrInvalidArgument) {
				return fmt.Errorf("bad color accepted: %v", err)
			}
			return comm.AllGather(bg, c, []int64{5, 5}, make([]int64, 4))
		}
		s, err := c.Split(bg, 0, 0)
		if s != nil {
			mu.Lock()
			subs = append(subs, s)
			mu.Unlock()
		}
		return err
	})
	for _, s := range subs {
		s.Close()
	}
	if !errors.Is(errs[0], comm.ErrMismatch) && !errors.Is(errs[1], comm.ErrMismatch) {
		t.Fatalf("misaligned Split not detected: %v", errs)
	}
}

// TestUnusedRecvDoesNotSetTheType: at a non-root, Reduce's receive buffer
// is unused, and its type does not change how the send buffer is read.
func TestUnusedRecvDoesNotSetTheType(t *testing.T) {
	cs := world(t, 2, nil)
	out := make([]float32, 4)
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		send := comm.Host([]float32{1, 2, 3, 4})
		if c.Rank() == 0 {
			return c.Reduce(bg, send, comm.Host(out), comm.Avg, 0)
		}
		return c.Reduce(bg, send, comm.Host(make([]float64, 2)), comm.Avg, 0)
	}))
	for i, v := range out {
		if v != float32(i+1) {
			t.Fatalf("root got %v, want [1 2 3 4]", out)
		}
	}
}

// TestNilPointerBuffer: a nil *HostBuffer is an absent buffer, an error,
// not a panic.
func TestNilPointerBuffer(t *testing.T) {
	cs := world(t, 1, nil)
	var nb *comm.HostBuffer
	if err := cs[0].AllReduce(bg, nb, nb, comm.Sum); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Fatalf("all-reduce of a nil *HostBuffer: %v", err)
	}
	if err := cs[0].Barrier(bg); err != nil {
		t.Fatalf("the Comm after a rejected call: %v", err)
	}
}

// TestWatchdogOnSplitComm: the watchdog names late ranks on communicators
// made by Split too.
func TestWatchdogOnSplitComm(t *testing.T) {
	var logs testutil.SyncBuffer
	cs := world(t, 4, &comm.Config{Watchdog: 50 * time.Millisecond, Timeout: time.Second,
		Logger: logx.New(&logs, "WARN", "")})
	subs := make([]*comm.Comm, 4)
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		s, err := c.Split(bg, 0, c.Rank())
		subs[c.Rank()] = s
		return err
	}))
	defer func() {
		for _, s := range subs {
			s.Close()
		}
	}()
	var wg sync.WaitGroup
	for r := range 2 { // split ranks 2 and 3 never arrive
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := make([]float32, 8)
			comm.AllReduce(bg, subs[r], x, x, comm.Sum)
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(3 * time.Second)
	for !strings.Contains(logs.String(), "ranks [2 3] have not reached it") {
		if time.Now().After(deadline) {
			t.Fatalf("no watchdog report naming ranks 2 and 3; logs:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWatchdogWithoutTimeout: with no operation timeout, the watchdog
// still reports a hung collective, once.
func TestWatchdogWithoutTimeout(t *testing.T) {
	var logs testutil.SyncBuffer
	cs := world(t, 2, &comm.Config{Watchdog: 50 * time.Millisecond, Timeout: -1,
		Logger: logx.New(&logs, "WARN", "")})
	done := make(chan error, 1)
	go func() {
		x := make([]float32, 8)
		done <- comm.AllReduce(bg, cs[0], x, x, comm.Sum) // rank 1 never arrives
	}()
	deadline := time.Now().Add(3 * time.Second)
	for !strings.Contains(logs.String(), "ranks [1] have not reached it") {
		if time.Now().After(deadline) {
			t.Fatalf("no watchdog report:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // six more watchdog periods
	cs[0].Abort(errors.New("test over"))
	if err := <-done; !errors.Is(err, comm.ErrAborted) {
		t.Fatalf("the hung all-reduce: %v", err)
	}
	if n := strings.Count(logs.String(), "watchdog: AllReduce #1 has waited"); n != 1 {
		t.Fatalf("%d watchdog reports for one hung operation, want 1:\n%s", n, logs.String())
	}
}
