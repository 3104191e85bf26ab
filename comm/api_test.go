package comm_test

import (
	"context"
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

func TestTypedAllReduce(t *testing.T) {
	cs := world(t, 4, nil)
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		x := []float32{float32(c.Rank()), 1, 2}
		if err := comm.AllReduce(bg, c, x, x, comm.Sum); err != nil {
			return err
		}
		if x[0] != 6 || x[1] != 4 || x[2] != 8 {
			return fmt.Errorf("got %v", x)
		}
		h := []comm.BFloat16Bits{comm.ToBFloat16(1.5)}
		if err := comm.AllReduce(bg, c, h, h, comm.Max); err != nil {
			return err
		}
		if h[0].Float() != 1.5 {
			return fmt.Errorf("bf16 max = %v", h[0].Float())
		}
		return nil
	}))
}

func TestTypeOf(t *testing.T) {
	if comm.TypeOf[float32]() != comm.Float32 || comm.TypeOf[comm.Float16Bits]() != comm.Float16 ||
		comm.TypeOf[uint8]() != comm.Uint8 || comm.TypeOf[comm.Float8E5M2Bits]() != comm.Float8E5M2 {
		t.Fatal("TypeOf maps Go types to the wrong DataType")
	}
	for _, dt := range comm.DataTypes {
		if !dt.Valid() || dt.Size() == 0 || dt.String() == "" {
			t.Errorf("%v: invalid metadata", dt)
		}
	}
}

func TestAsyncCompletesInIssueOrder(t *testing.T) {
	cs := world(t, 3, nil)
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		const k = 20
		bufs := make([][]int64, k)
		reqs := make([]*comm.Request, k)
		for i := range bufs {
			bufs[i] = []int64{int64(i * (c.Rank() + 1))}
			reqs[i] = comm.AllReduceAsync(c, bufs[i], bufs[i], comm.Sum)
		}
		// A blocking call issued behind async ones waits its turn.
		y := []int64{1}
		if err := comm.AllReduce(bg, c, y, y, comm.Sum); err != nil {
			return err
		}
		for i, r := range reqs {
			select {
			case <-r.Done():
			default:
				return fmt.Errorf("request %d not done after a later blocking call returned", i)
			}
			if err := r.Wait(bg); err != nil {
				return err
			}
			if r.Err() != nil || bufs[i][0] != int64(i*6) {
				return fmt.Errorf("request %d: %v, got %d", i, r.Err(), bufs[i][0])
			}
		}
		if y[0] != 3 {
			return fmt.Errorf("blocking all-reduce after async: %d", y[0])
		}
		return c.BarrierAsync().Wait(bg)
	}))
}

// More async calls than the queue holds, waited for out of order and from
// two goroutines at once: whoever runs the queue (the progress goroutine,
// or a waiter that finds it idle) runs it in issue order, every result is
// right, and a waiter whose context has ended returns at once.
func TestAsyncWaitersRunTheQueueInOrder(t *testing.T) {
	cs := world(t, 3, nil)
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		const k = 2500 // beyond the queue's 1024
		bufs := make([][]int64, k)
		reqs := make([]*comm.Request, k)
		for i := range bufs {
			bufs[i] = []int64{int64(i * (c.Rank() + 1))}
			reqs[i] = comm.AllReduceAsync(c, bufs[i], bufs[i], comm.Sum)
		}
		done, cancel := context.WithCancel(bg)
		cancel()
		if err := reqs[k-1].Wait(done); err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("wait with an ended context: %v", err)
		}
		// Done made while the queue runs: each is closed once, when its
		// request completes (made lazily, racing the completion).
		var watchers sync.WaitGroup
		for i := 0; i < k; i += 97 {
			watchers.Add(1)
			go func() {
				defer watchers.Done()
				<-reqs[i].Done()
			}()
		}
		defer watchers.Wait()
		mid := make(chan error, 1)
		go func() { mid <- reqs[k/2].Wait(bg) }()
		if err := reqs[k-1].Wait(bg); err != nil {
			return err
		}
		if err := <-mid; err != nil {
			return err
		}
		for i, r := range reqs {
			if err := r.Wait(bg); err != nil {
				return fmt.Errorf("request %d: %v", i, err)
			}
			if bufs[i][0] != int64(i*6) {
				return fmt.Errorf("request %d: got %d, want %d", i, bufs[i][0], i*6)
			}
		}
		return nil
	}))
}

// A rank whose peer never arrives fills its async queue, and the goroutine
// issuing the calls waits for a slot. Aborting the Comm from another
// goroutine releases it: every request completes, with an error naming the
// abort or the closed Comm, and nothing hangs.
func TestAbortReleasesAFullAsyncQueue(t *testing.T) {
	cs := world(t, 2, nil)
	const k = comm.AsyncQueueLen + 500
	reqs := make([]*comm.Request, k)
	issued := make(chan struct{})
	go func() {
		defer close(issued)
		x := []int32{1}
		for i := range reqs {
			reqs[i] = comm.AllReduceAsync(cs[0], x, x, comm.Sum)
		}
	}()
	testutil.WaitFor(t, 10*time.Second, "the issuing goroutine never waited for a slot of the full queue",
		func() bool { return comm.AsyncProducerWaits(cs[0]) })
	cs[0].Abort(errors.New("operator pressed stop"))
	select {
	case <-issued:
	case <-time.After(10 * time.Second):
		t.Fatal("the issuing goroutine still waits for a slot after Abort")
	}
	for i, r := range reqs {
		err := r.Wait(bg)
		if err == nil {
			t.Fatalf("request %d of an aborted Comm succeeded", i)
		}
		if !errors.Is(err, comm.ErrAborted) && !errors.Is(err, comm.ErrClosed) {
			t.Fatalf("request %d: %v, want ErrAborted or ErrClosed", i, err)
		}
	}
}

func TestGroupNeighbourExchange(t *testing.T) {
	// Every rank sends to and receives from both neighbours at once, with
	// messages many slots long: this deadlocks unless the group progresses
	// all its operations together.
	cs := world(t, 5, &comm.Config{SlotSize: 256, SlotCount: 2})
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		n, r := c.Size(), c.Rank()
		next, prev := (r+1)%n, (r+n-1)%n
		const L = 1000
		toNext, toPrev := make([]int32, L), make([]int32, L)
		fromNext, fromPrev := make([]int32, L), make([]int32, L)
		for i := range toNext {
			toNext[i], toPrev[i] = int32(r*L+i), int32(-r*L-i)
		}
		self := []int32{int32(r)}
		selfIn := []int32{-1}
		if err := c.Group(bg,
			comm.SendTo(next, toNext), comm.SendTo(prev, toPrev),
			comm.RecvFrom(prev, fromPrev), comm.RecvFrom(next, fromNext),
			comm.SendTo(r, self), comm.RecvFrom(r, selfIn)); err != nil {
			return err
		}
		for i := 0; i < L; i++ {
			if fromPrev[i] != int32(prev*L+i) || fromNext[i] != int32(-next*L-i) {
				return fmt.Errorf("element %d: from prev %d, from next %d", i, fromPrev[i], fromNext[i])
			}
		}
		if selfIn[0] != int32(r) {
			return fmt.Errorf("send to self delivered %d", selfIn[0])
		}
		return nil
	}))
}

func TestSendRecvInOrder(t *testing.T) {
	cs := world(t, 2, &comm.Config{SlotSize: 128})
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		for k := 0; k < 5; k++ {
			buf := make([]uint8, 300+k)
			if c.Rank() == 0 {
				for i := range buf {
					buf[i] = uint8(i + k)
				}
				if err := comm.Send(bg, c, buf, 1); err != nil {
					return err
				}
				continue
			}
			if err := comm.Recv(bg, c, buf, 0); err != nil {
				return err
			}
			for i := range buf {
				if buf[i] != uint8(i+k) {
					return fmt.Errorf("message %d byte %d = %d", k, i, buf[i])
				}
			}
		}
		return nil
	}))
}

func TestInvalidArguments(t *testing.T) {
	cs := world(t, 2, nil)
	// Every rank makes the same bad calls, as SPMD code does.
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		f4, f5 := make([]float32, 4), make([]float32, 5)
		i4 := make([]int32, 4)
		cases := []struct {
			name string
			err  error
		}{
			{"length mismatch", comm.AllReduce(bg, c, f4, f5, comm.Sum)},
			{"type mismatch", c.AllReduce(bg, comm.Host(f4), comm.Host(i4), comm.Sum)},
			{"unknown op", comm.AllReduce(bg, c, f4, f4, comm.Op{Kind: 99})},
			{"unknown type", c.AllReduce(bg, comm.HostBytesOf(comm.DataType(99), make([]byte, 8)), comm.HostBytesOf(comm.DataType(99), make([]byte, 8)), comm.Sum)},
			{"part of an element", c.AllReduce(bg, comm.HostBytesOf(comm.Float32, make([]byte, 7)), comm.HostBytesOf(comm.Float32, make([]byte, 7)), comm.Sum)},
			{"nil HostBuffer", c.AllReduce(bg, (*comm.HostBuffer)(nil), comm.Host(f4), comm.Sum)},
			{"partial overlap", comm.AllReduce(bg, c, f5[:4], f5[1:], comm.Sum)},
			{"nil send", comm.AllReduce(bg, c, nil, f4, comm.Sum)},
			{"bad root", comm.Broadcast(bg, c, f4, f4, 2)},
			{"negative root", comm.Reduce(bg, c, f4, f4, comm.Sum, -1)},
			{"allgather size", comm.AllGather(bg, c, f4, f5)},
			{"reducescatter size", comm.ReduceScatter(bg, c, f5, f4, comm.Sum)},
			{"alltoall blocks", comm.AllToAll(bg, c, f5, make([]float32, 5))},
			{"allgather overlap", comm.AllGather(bg, c, f4[1:3], f4)},
			{"bad peer", comm.Send(bg, c, f4, 2)},
			{"unmatched self send", c.Group(bg, comm.SendTo(c.Rank(), f4))},
			{"async bad op", comm.AllReduceAsync(c, f4, f4, comm.Op{}).Wait(bg)},
		}
		for _, tc := range cases {
			if !errors.Is(tc.err, comm.ErrInvalidArgument) {
				return fmt.Errorf("%s: got %v, want ErrInvalidArgument", tc.name, tc.err)
			}
		}
		// Rejected calls leave the Comm usable.
		return c.Barrier(bg)
	}))
}

func TestRejectedCallOnOneRankIsDetected(t *testing.T) {
	// Rank 0's bad call is numbered although it sends nothing, so its next
	// collective cannot be paired with the peer's call of the same kind.
	cs := world(t, 2, nil)
	errs := onAll(t, cs, func(c *comm.Comm) error {
		x := []float32{1}
		if c.Rank() == 0 {
			if err := comm.AllReduce(bg, c, x, x, comm.Op{}); !errors.Is(err, comm.ErrInvalidArgument) {
				return fmt.Errorf("bad op accepted: %v", err)
			}
		}
		return comm.AllReduce(bg, c, x, x, comm.Sum)
	})
	if !errors.Is(errs[0], comm.ErrMismatch) && !errors.Is(errs[1], comm.ErrMismatch) {
		t.Fatalf("misaligned collectives not detected: %v", errs)
	}
}

func TestUseAfterClose(t *testing.T) {
	cs := world(t, 2, nil)
	cs[1].Close()
	x := []float32{1}
	if err := comm.AllReduce(bg, cs[1], x, x, comm.Sum); !errors.Is(err, comm.ErrClosed) {
		t.Fatalf("call after Close: %v", err)
	}
	if err := cs[1].AllGatherAsync(comm.Host(x), comm.Host([]float32{0, 0})).Wait(bg); !errors.Is(err, comm.ErrClosed) {
		t.Fatalf("async call after Close: %v", err)
	}
	// The peer that still expects rank 1 learns it is gone.
	if err := comm.AllReduce(bg, cs[0], x, x, comm.Sum); !errors.Is(err, comm.ErrPeerLost) {
		t.Fatalf("all-reduce with a closed peer: %v", err)
	}
}

func TestMismatchedOperationsFailLoudly(t *testing.T) {
	cs := world(t, 2, nil)
	errs := onAll(t, cs, func(c *comm.Comm) error {
		x := []float32{1, 2}
		if c.Rank() == 0 {
			return comm.AllReduce(bg, c, x, x, comm.Sum)
		}
		return comm.Broadcast(bg, c, x, x, 0)
	})
	if !errors.Is(errs[0], comm.ErrMismatch) && !errors.Is(errs[1], comm.ErrMismatch) {
		t.Fatalf("different collectives not detected: %v", errs)
	}

	cs = world(t, 3, nil)
	errs = onAll(t, cs, func(c *comm.Comm) error {
		x := make([]float32, 10+c.Rank()%2)
		return comm.AllReduce(bg, c, x, x, comm.Sum)
	})
	if !anyIs(errs, comm.ErrMismatch) {
		t.Fatalf("different counts not detected: %v", errs)
	}
}

func TestStalledPeerTimesOut(t *testing.T) {
	cs := world(t, 3, &comm.Config{Timeout: 200 * time.Millisecond})
	// Rank 2 never joins: the others fail with ErrTimeout, then the whole
	// communicator is aborted.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := make([]float64, 1000)
			errs[r] = comm.AllReduce(bg, cs[r], x, x, comm.Sum)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if !errors.Is(err, comm.ErrTimeout) && !errors.Is(err, comm.ErrPeerLost) {
			t.Fatalf("rank %d: %v, want ErrTimeout or ErrPeerLost", r, err)
		}
		var oe *comm.OpError
		if !errors.As(err, &oe) || oe.Op != "AllReduce" || oe.Seq != 1 {
			t.Fatalf("rank %d: error does not name the operation: %v", r, err)
		}
	}
	if !errors.Is(errs[0], comm.ErrTimeout) && !errors.Is(errs[1], comm.ErrTimeout) {
		t.Fatalf("no rank timed out: %v", errs)
	}
	x := []float64{1}
	if err := comm.AllReduce(bg, cs[0], x, x, comm.Sum); !errors.Is(err, comm.ErrAborted) {
		t.Fatalf("call after a timeout: %v", err)
	}
}

func TestContextCancelAbortsEveryone(t *testing.T) {
	cs := world(t, 3, &comm.Config{Timeout: 2 * time.Second})
	ctx, cancel := context.WithCancel(bg)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	// Rank 1 is late; rank 0 gives up waiting for it.
	for _, r := range []int{0, 2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := bg
			if r == 0 {
				c = ctx
			}
			x := make([]float32, 1<<16)
			errs[r] = comm.AllReduce(c, cs[r], x, x, comm.Sum)
		}()
	}
	time.Sleep(50 * time.Millisecond)
	cancel()
	wg.Wait()
	if !errors.Is(errs[0], context.Canceled) {
		t.Fatalf("rank 0: %v, want context.Canceled", errs[0])
	}
	if errs[2] == nil {
		t.Fatal("rank 2 succeeded without rank 1")
	}
	x := make([]float32, 1<<16)
	if err := comm.AllReduce(bg, cs[1], x, x, comm.Sum); !errors.Is(err, comm.ErrPeerLost) {
		t.Fatalf("late rank 1: %v, want ErrPeerLost", err)
	}
}

func TestAbortWakesPeers(t *testing.T) {
	cs := world(t, 4, nil)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for r := 1; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := make([]int32, 1<<18)
			errs[r] = comm.AllReduce(bg, cs[r], x, x, comm.Sum)
		}()
	}
	time.Sleep(20 * time.Millisecond)
	cs[0].Abort(errors.New("operator pressed stop"))
	wg.Wait()
	for r := 1; r < 4; r++ {
		if !errors.Is(errs[r], comm.ErrPeerLost) {
			t.Fatalf("rank %d: %v, want ErrPeerLost", r, errs[r])
		}
		if !strings.Contains(errs[r].Error(), "rank") {
			t.Fatalf("rank %d: error names no rank: %v", r, errs[r])
		}
	}
}

func TestConcurrentUseDetected(t *testing.T) {
	cs := world(t, 2, &comm.Config{Timeout: time.Second})
	x := make([]float32, 4)
	done := make(chan error, 1)
	go func() {
		done <- comm.AllReduce(bg, cs[0], x, x, comm.Sum) // waits for rank 1
	}()
	// Only once the first call holds the Comm: otherwise this one could
	// become the call that waits for rank 1 (a loaded CI run saw that).
	for !comm.Busy(cs[0]) {
		select {
		case err := <-done:
			t.Fatalf("the first call ended before a second could overlap it: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	y := make([]float32, 4)
	if err := comm.AllReduce(bg, cs[0], y, y, comm.Sum); !errors.Is(err, comm.ErrConcurrentUse) {
		t.Fatalf("second concurrent call: %v", err)
	}
	x1 := make([]float32, 4) // rank 1's own buffer
	if err := comm.AllReduce(bg, cs[1], x1, x1, comm.Sum); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestInvalidConfig(t *testing.T) {
	if _, err := comm.InitLocal(0, nil); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Fatalf("InitLocal(0): %v", err)
	}
	if _, err := comm.InitLocal(2, &comm.Config{Algo: "butterfly"}); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Fatalf("unknown algorithm: %v", err)
	}
	if _, err := comm.InitLocal(2, &comm.Config{SlotCount: 1}); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Fatalf("one slot: %v", err)
	}
	// 64 TiB per ring: refused, not allocated.
	if _, err := comm.InitLocal(2, &comm.Config{SlotSize: 1 << 30, SlotCount: 1 << 16}); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Fatalf("huge slot rings: %v", err)
	}
	// 1e-10 s would round to 0, which means "wait forever" for GCCL_TIMEOUT
	// and "off" for GCCL_WATCHDOG.
	for _, name := range []string{"GCCL_TIMEOUT", "GCCL_WATCHDOG"} {
		for _, v := range []string{"soon", "-1", "NaN", "Inf", "1e-10"} {
			t.Run(name+"="+v, func(t *testing.T) {
				t.Setenv(name, v)
				_, err := comm.InitLocal(2, nil)
				if !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), name) {
					t.Fatalf("%s=%s: %v", name, v, err)
				}
			})
		}
	}
}

func TestGroupInPlaceSendRecv(t *testing.T) {
	// nccl-tests' in-place sendrecv: one buffer is both sent to the next
	// rank and received from the previous one, over many slots.
	cs := world(t, 3, &comm.Config{SlotSize: 256, SlotCount: 2})
	for iter := 0; iter < 20; iter++ {
		mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
			n, r := c.Size(), c.Rank()
			buf := make([]int32, 5000)
			for i := range buf {
				buf[i] = int32(r*100000 + i)
			}
			if err := c.Group(bg, comm.SendTo((r+1)%n, buf), comm.RecvFrom((r+n-1)%n, buf)); err != nil {
				return err
			}
			prev := (r + n - 1) % n
			for i := range buf {
				if buf[i] != int32(prev*100000+i) {
					return fmt.Errorf("element %d = %d, want %d", i, buf[i], prev*100000+i)
				}
			}
			return nil
		}))
	}
}

func TestSplit(t *testing.T) {
	cs := world(t, 6, nil)
	subs := make([]*comm.Comm, 6)
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		r := c.Rank()
		color := r % 2
		if r == 5 {
			color = comm.NoColor
		}
		// Keys reverse the order inside each color.
		sub, err := c.Split(bg, color, -r)
		if err != nil {
			return err
		}
		subs[r] = sub
		if r == 5 {
			if sub != nil {
				return fmt.Errorf("NoColor rank got a communicator")
			}
			return c.Barrier(bg)
		}
		wantSize := map[int]int{0: 3, 1: 2}[color]
		if sub.Size() != wantSize {
			return fmt.Errorf("rank %d: sub size %d, want %d", r, sub.Size(), wantSize)
		}
		x := []int32{int32(r)}
		if err := comm.AllReduce(bg, sub, x, x, comm.Sum); err != nil {
			return err
		}
		want := map[int]int32{0: 0 + 2 + 4, 1: 1 + 3}[color]
		if x[0] != want {
			return fmt.Errorf("rank %d: sum over its color = %d, want %d", r, x[0], want)
		}
		// The parent still works, and the order follows the keys.
		ranks := make([]int32, sub.Size())
		if err := comm.AllGather(bg, sub, []int32{int32(r)}, ranks); err != nil {
			return err
		}
		for i := 1; i < len(ranks); i++ {
			if ranks[i] > ranks[i-1] {
				return fmt.Errorf("sub ranks not ordered by key: %v", ranks)
			}
		}
		return c.Barrier(bg)
	}))
	for _, s := range subs {
		if s != nil {
			s.Close()
		}
	}
	if _, err := cs[0].Split(bg, -7, 0); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Fatalf("negative color: %v", err)
	}
}

func TestWatchdogNamesLateRanks(t *testing.T) {
	var logs testutil.SyncBuffer
	cs := world(t, 4, &comm.Config{Watchdog: 50 * time.Millisecond, Timeout: time.Second,
		Logger: logx.New(&logs, "WARN", "")})
	// Ranks 0 and 1 enter AllReduce #1; ranks 2 and 3 never do.
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := make([]float32, 8)
			errs[r] = comm.AllReduce(bg, cs[r], x, x, comm.Sum)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if !errors.Is(err, comm.ErrTimeout) && !errors.Is(err, comm.ErrPeerLost) {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "ranks [2 3] have not reached it") {
		if time.Now().After(deadline) {
			t.Fatalf("no watchdog report naming ranks 2 and 3:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	mustContainLine(t, logs.String(), "watchdog: AllReduce #1 has waited")
}

func mustContainLine(t *testing.T, s, want string) {
	t.Helper()
	if !strings.Contains(s, want) {
		t.Fatalf("missing %q in:\n%s", want, s)
	}
}

// TestOpErrorText: the text names the rank, the operation, its number when
// it has one (Group and Shrink calls have none) and the peer.
func TestOpErrorText(t *testing.T) {
	for _, tc := range []struct {
		err  comm.OpError
		want string
	}{
		{comm.OpError{Op: "AllReduce", Rank: 0, Seq: 5, Peer: 2, Err: comm.ErrPeerLost}, "gccl: rank 0: AllReduce #5 (peer rank 2): gccl: peer lost"},
		{comm.OpError{Op: "Shrink", Rank: 1, Peer: -1, Err: comm.ErrClosed}, "gccl: rank 1: Shrink: gccl: communicator closed"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("%q, want %q", got, tc.want)
		}
	}
}
