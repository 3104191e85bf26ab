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

// vCount is the count rank src sends rank dst in round k: random, a
// quarter of them zero, a few long enough to take several slots.
func vCount(src, dst, k int) int {
	h := hash(src, dst, 1000+k)
	switch h % 8 {
	case 0, 1:
		return 0
	case 2:
		return 200 + int(h>>8%300)
	}
	return 1 + int(h>>8%40)
}

// vVal is element i of the block rank src sends rank dst: distinct per
// block and position, and it fits every element type.
func vVal[T comm.Scalar](src, dst, i int) T { return T((src*37 + dst*11 + i*3) % 101) }

// allToAllVCase checks one AllToAllV of element type T on rank c, in the
// form given: "slice", "buffer", "async", "buffer-async", each also
// "inplace" (send and recv the same buffer; needs equal totals, so the
// counts are symmetric then).
func allToAllVCase[T comm.Scalar](c *comm.Comm, k int, form string, inplace bool) error {
	n, r := c.Size(), c.Rank()
	count := func(src, dst int) int {
		if inplace { // equal send and receive totals
			return vCount(min(src, dst), max(src, dst), k)
		}
		return vCount(src, dst, k)
	}
	sc, rc := make([]int, n), make([]int, n)
	st, rt := 0, 0
	for p := range n {
		sc[p], rc[p] = count(r, p), count(p, r)
		st, rt = st+sc[p], rt+rc[p]
	}
	send, recv := make([]T, st), make([]T, rt)
	for i := range recv {
		recv[i] = T(99) // anything not written shows
	}
	off := 0
	for p := range n {
		for i := range sc[p] {
			send[off+i] = vVal[T](r, p, i)
		}
		off += sc[p]
	}
	if inplace {
		recv = send
	}
	var err error
	switch form {
	case "slice":
		err = comm.AllToAllV(bg, c, send, sc, recv, rc)
	case "buffer":
		s, d := comm.Host(send), comm.Host(recv)
		err = c.AllToAllV(bg, s, sc, d, rc)
	case "async":
		req := comm.AllToAllVAsync(c, send, sc, recv, rc)
		clear(sc) // the counts may be reused at once
		clear(rc)
		err = req.Wait(bg)
	case "buffer-async":
		req := c.AllToAllVAsync(comm.Host(send), sc, comm.Host(recv), rc)
		clear(sc)
		clear(rc)
		err = req.Wait(bg)
	}
	if err != nil {
		return err
	}
	off = 0
	for p := range n {
		for i := range count(p, r) {
			if got, want := recv[off+i], vVal[T](p, r, i); got != want {
				return fmt.Errorf("block from rank %d element %d = %v, want %v", p, i, got, want)
			}
		}
		off += count(p, r)
	}
	return nil
}

func allGatherVCase[T comm.Scalar](c *comm.Comm, k int, form string, inplace bool) error {
	n, r := c.Size(), c.Rank()
	counts := make([]int, n)
	total, disp := 0, 0
	for p := range n {
		counts[p] = vCount(p, 0, k)
		if p == r {
			disp = total
		}
		total += counts[p]
	}
	recv := make([]T, total)
	for i := range recv {
		recv[i] = T(99)
	}
	send := make([]T, counts[r])
	if inplace {
		send = recv[disp : disp+counts[r]]
	}
	for i := range send {
		send[i] = vVal[T](r, 0, i)
	}
	var err error
	switch form {
	case "slice":
		err = comm.AllGatherV(bg, c, send, recv, counts)
	case "buffer":
		err = c.AllGatherV(bg, comm.Host(send), comm.Host(recv), counts)
	case "async":
		req := comm.AllGatherVAsync(c, send, recv, counts)
		clear(counts)
		err = req.Wait(bg)
	case "buffer-async":
		req := c.AllGatherVAsync(comm.Host(send), comm.Host(recv), counts)
		clear(counts)
		err = req.Wait(bg)
	}
	if err != nil {
		return err
	}
	off := 0
	for p := range n {
		m := vCount(p, 0, k)
		for i := range m {
			if got, want := recv[off+i], vVal[T](p, 0, i); got != want {
				return fmt.Errorf("block of rank %d element %d = %v, want %v", p, i, got, want)
			}
		}
		off += m
	}
	return nil
}

var vForms = []string{"slice", "buffer", "async", "buffer-async"}

// TestVariableCollectives: AllToAllV and AllGatherV on 1, 2, 3, 5 and 8
// ranks, with random counts (zeros included), several element types,
// every form, in place and out of place, checked exactly, call after call
// on the same communicators. 256-byte slots cut the long blocks into
// chunks.
func TestVariableCollectives(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 8} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			cs := world(t, n, &comm.Config{SlotSize: 256, Timeout: time.Minute})
			mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
				k := 0
				for _, form := range vForms {
					for _, inplace := range []bool{false, true} {
						for _, run := range []func(c *comm.Comm, k int, form string, inplace bool) error{
							allToAllVCase[uint8], allToAllVCase[int32], allToAllVCase[float64], allToAllVCase[comm.BFloat16Bits],
							allGatherVCase[int8], allGatherVCase[float32], allGatherVCase[uint64], allGatherVCase[comm.Float16Bits],
						} {
							k++
							if err := run(c, k, form, inplace); err != nil {
								return fmt.Errorf("call %d (%s, in place %v): %w", k, form, inplace, err)
							}
						}
					}
				}
				// The communicator is still in step with the others.
				return c.Barrier(bg)
			}))
		})
	}
}

// TestVariableCollectivesAllZero: every count zero, and empty buffers.
func TestVariableCollectivesAllZero(t *testing.T) {
	cs := world(t, 3, nil)
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		z := make([]int, 3)
		for range 3 {
			if err := comm.AllToAllV(bg, c, []float32{}, z, []float32{}, z); err != nil {
				return err
			}
			if err := comm.AllGatherV(bg, c, []int64{}, []int64{}, z); err != nil {
				return err
			}
		}
		return c.Barrier(bg)
	}))
}

// TestVariableCollectivesInterleaved: variable-size collectives between
// other collectives and async calls stay in step.
func TestVariableCollectivesInterleaved(t *testing.T) {
	cs := world(t, 4, nil)
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		n, r := c.Size(), c.Rank()
		x := []int64{int64(r)}
		reqs := []*comm.Request{comm.AllReduceAsync(c, x, x, comm.Sum)}
		// Rank r sends r+1 elements to every rank.
		send := make([]int32, n*(r+1))
		for i := range send {
			send[i] = int32(r)
		}
		sc, rc := make([]int, n), make([]int, n)
		for p := range n {
			sc[p], rc[p] = r+1, p+1
		}
		recv := make([]int32, n*(n+1)/2)
		reqs = append(reqs, comm.AllToAllVAsync(c, send, sc, recv, rc))
		all := make([]int32, n*(n+1)/2)
		if err := comm.AllGatherV(bg, c, send[:r+1], all, rc); err != nil { // queued behind the async calls
			return err
		}
		for _, q := range reqs {
			if err := q.Wait(bg); err != nil {
				return err
			}
		}
		if x[0] != int64(n*(n-1)/2) {
			return fmt.Errorf("all-reduce: %d", x[0])
		}
		off := 0
		for p := range n {
			for i := range p + 1 {
				if recv[off+i] != int32(p) || all[off+i] != int32(p) {
					return fmt.Errorf("block %d element %d: all-to-all %d, all-gather %d", p, i, recv[off+i], all[off+i])
				}
			}
			off += p + 1
		}
		return c.Barrier(bg)
	}))
}

func TestVariableCollectivesInvalidArguments(t *testing.T) {
	cs := world(t, 2, nil)
	// Every rank makes the same bad calls, as SPMD code does.
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		r := c.Rank()
		f4, f5 := make([]float32, 4), make([]float32, 5)
		own := []int{0, 0}
		own[r] = 4
		cases := []struct {
			name string
			err  error
		}{
			{"too few counts", comm.AllToAllV(bg, c, f4, []int{4}, f4, []int{2, 2})},
			{"too many counts", comm.AllToAllV(bg, c, f4, []int{2, 2}, f5, []int{1, 2, 2})},
			{"negative count", comm.AllToAllV(bg, c, f4, []int{6, -2}, f4, []int{2, 2})},
			{"counts short of the buffer", comm.AllToAllV(bg, c, f5, []int{2, 2}, f4, []int{2, 2})},
			{"counts beyond the buffer", comm.AllToAllV(bg, c, f4, []int{2, 3}, f4, []int{2, 2})},
			{"huge counts", comm.AllToAllV(bg, c, f4, []int{1 << 62, 1 << 62}, f4, []int{2, 2})},
			{"own block", comm.AllToAllV(bg, c, f4, []int{2, 2}, make([]float32, 4), []int{0, 4})},
			{"partial overlap", comm.AllToAllV(bg, c, f5[:4], []int{2, 2}, f5[1:], []int{2, 2})},
			{"nil send", comm.AllToAllV(bg, c, nil, []int{0, 0}, f4, []int{2, 2})},
			{"nil counts", comm.AllToAllV(bg, c, f4, nil, f4, nil)},
			{"type mismatch", c.AllToAllV(bg, comm.Host(f4), []int{2, 2}, comm.Host(make([]int32, 4)), []int{2, 2})},
			{"unknown type", c.AllToAllV(bg, comm.HostBytesOf(comm.DataType(99), make([]byte, 8)), []int{1, 1}, comm.HostBytesOf(comm.DataType(99), make([]byte, 8)), []int{1, 1})},
			{"async bad counts", comm.AllToAllVAsync(c, f4, []int{1, 1}, f4, []int{2, 2}).Wait(bg)},
			{"buffer async nil", c.AllToAllVAsync(nil, []int{0, 0}, comm.Host(f4), []int{2, 2}).Wait(bg)},
			{"allgatherv send length", comm.AllGatherV(bg, c, f5, make([]float32, 8), []int{4, 4})},
			{"allgatherv counts", comm.AllGatherV(bg, c, f4, make([]float32, 8), []int{4, 3})},
			{"allgatherv negative", comm.AllGatherV(bg, c, f4, make([]float32, 4), []int{-1, 5})},
			{"allgatherv overlap", comm.AllGatherV(bg, c, f5[1:5], f5[:5], []int{4, 1})},
			{"allgatherv type", c.AllGatherV(bg, comm.Host(f4), comm.Host(make([]int32, 8)), []int{4, 4})},
			{"allgatherv async", comm.AllGatherVAsync(c, f4, f4, []int{2, 2}).Wait(bg)},
			{"allgatherv buffer async", c.AllGatherVAsync(comm.Host(f4), comm.Host(f5), own).Wait(bg)},
		}
		for _, tc := range cases {
			if !errors.Is(tc.err, comm.ErrInvalidArgument) {
				return fmt.Errorf("%s: got %v, want ErrInvalidArgument", tc.name, tc.err)
			}
		}
		// Rejected calls leave the Comm usable and in step: a good call
		// after them works.
		recv := make([]float32, 8)
		if err := comm.AllGatherV(bg, c, []float32{1, 2, 3, 4}, recv, []int{4, 4}); err != nil {
			return err
		}
		return c.Barrier(bg)
	}))
}

// TestVariableCollectivesCountsMismatch: a rank expecting another count
// from a peer than the peer sends (also zero against non-zero, in either
// direction) or another data type fails with ErrMismatch at once, never
// with wrong data or a hang; the Comm aborts, and every rank's call, or
// the next one, fails. The timeout is long: nothing waits for it.
func TestVariableCollectivesCountsMismatch(t *testing.T) {
	// counts[r] gives rank r's send and receive counts, rank 1 disagreeing
	// with rank 0 about what goes from 0 to 1.
	for _, tc := range []struct {
		name     string
		send0to1 int // what rank 0 sends rank 1
		recv1    int // what rank 1 expects from rank 0
		slot     int
	}{
		{"shorter", 7, 5, 0},
		{"longer", 5, 7, 0},
		{"several slots", 300, 200, 64},
		{"zero sent", 0, 3, 0},
		{"zero expected", 3, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := world(t, 3, &comm.Config{Timeout: time.Minute, SlotSize: tc.slot})
			errs := onAll(t, cs, func(c *comm.Comm) error {
				r := c.Rank()
				sc, rc := []int{2, 2, 2}, []int{2, 2, 2}
				if r == 0 {
					sc[1] = tc.send0to1
				}
				if r == 1 {
					rc[0] = tc.recv1
				}
				send, recv := make([]int32, sum(sc)), make([]int32, sum(rc))
				if err := comm.AllToAllV(bg, c, send, sc, recv, rc); err != nil {
					return err
				}
				return c.Barrier(bg)
			})
			wantMismatchWithoutTimeout(t, errs, 1)
		})
	}
	t.Run("allgatherv", func(t *testing.T) {
		cs := world(t, 3, &comm.Config{Timeout: time.Minute})
		errs := onAll(t, cs, func(c *comm.Comm) error {
			counts := []int{3, 0, 2}
			if c.Rank() == 2 {
				counts = []int{2, 1, 2} // disagrees about ranks 0 and 1
			}
			if err := comm.AllGatherV(bg, c, make([]uint8, counts[c.Rank()]), make([]uint8, 5), counts); err != nil {
				return err
			}
			return c.Barrier(bg)
		})
		wantMismatchWithoutTimeout(t, errs, 2)
	})
	t.Run("data type", func(t *testing.T) {
		cs := world(t, 2, &comm.Config{Timeout: time.Minute})
		errs := onAll(t, cs, func(c *comm.Comm) error {
			counts := []int{2, 2}
			if c.Rank() == 0 {
				return comm.AllToAllV(bg, c, make([]float32, 4), counts, make([]float32, 4), counts)
			}
			return comm.AllToAllV(bg, c, make([]int32, 4), counts, make([]int32, 4), counts)
		})
		// The rank that finds out first aborts, and the other may see that
		// before it reads the data.
		if !anyIs(errs, comm.ErrMismatch) || errs[0] == nil || errs[1] == nil {
			t.Fatalf("int32 against float32: %v, want ErrMismatch, and an error on both ranks", errs)
		}
	})
}

// wantMismatchWithoutTimeout checks that rank, which holds other counts than
// its peers, gets ErrMismatch and that every rank fails without waiting
// for its timeout.
func wantMismatchWithoutTimeout(t *testing.T, errs []error, rank int) {
	t.Helper()
	if !errors.Is(errs[rank], comm.ErrMismatch) {
		t.Fatalf("rank %d, which expects other counts: %v, want ErrMismatch", rank, errs[rank])
	}
	for r, err := range errs {
		if err == nil || errors.Is(err, comm.ErrTimeout) {
			t.Errorf("rank %d: %v, want an error other than a timeout", r, err)
		}
	}
}

// TestVariableCollectivesOtherOperation: a variable-size collective facing
// another operation on the peer (all-to-all, send/recv of the same
// lengths) is a mismatch, not a silent pairing.
func TestVariableCollectivesOtherOperation(t *testing.T) {
	for _, tc := range []struct {
		name string
		peer func(c *comm.Comm, send, recv []int32) error
	}{
		{"AllToAll", func(c *comm.Comm, send, recv []int32) error { return comm.AllToAll(bg, c, send, recv) }},
		{"Group", func(c *comm.Comm, send, recv []int32) error {
			return c.Group(bg, comm.SendTo(0, send[:2]), comm.RecvFrom(0, recv[:2]), comm.SendTo(1, send[2:]), comm.RecvFrom(1, recv[2:]))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := world(t, 2, &comm.Config{Timeout: time.Minute})
			errs := onAll(t, cs, func(c *comm.Comm) error {
				send, recv := make([]int32, 4), make([]int32, 4)
				if c.Rank() == 0 {
					return comm.AllToAllV(bg, c, send, []int{2, 2}, recv, []int{2, 2})
				}
				return tc.peer(c, send, recv)
			})
			if !anyIs(errs, comm.ErrMismatch) {
				t.Fatalf("AllToAllV against %s: %v, want ErrMismatch", tc.name, errs)
			}
			for r, err := range errs {
				if err == nil {
					t.Errorf("rank %d succeeded", r)
				}
			}
		})
	}
}

// TestRejectedVariableCollectiveIsDetected: a call one rank refuses is
// numbered, so the peer's call meets that rank's next one as a mismatch
// instead of taking its data.
func TestRejectedVariableCollectiveIsDetected(t *testing.T) {
	cs := world(t, 2, &comm.Config{Timeout: time.Minute})
	errs := onAll(t, cs, func(c *comm.Comm) error {
		counts := []int{2, 2}
		send, recv := make([]int32, 4), make([]int32, 4)
		if c.Rank() == 0 {
			if err := comm.AllToAllV(bg, c, send, []int{1, 1}, recv, counts); !errors.Is(err, comm.ErrInvalidArgument) {
				return fmt.Errorf("bad counts accepted: %v", err)
			}
		}
		return comm.AllToAllV(bg, c, send, counts, recv, counts)
	})
	if !anyIs(errs, comm.ErrMismatch) || errs[0] == nil || errs[1] == nil {
		t.Fatalf("misaligned all-to-alls: %v, want ErrMismatch, and an error on both ranks", errs)
	}
	for r, err := range errs {
		var oe *comm.OpError
		if errors.Is(err, comm.ErrMismatch) && (!errors.As(err, &oe) || oe.Op != "AllToAllV" || oe.Seq != uint64(2-r)) {
			t.Errorf("rank %d's error %v does not name AllToAllV #%d", r, err, 2-r)
		}
	}
}

// TestWatchdogNamesRanksLateForAllToAllV: a variable-size collective is
// numbered as the collectives are, so the watchdog names the ranks that
// have not reached it.
func TestWatchdogNamesRanksLateForAllToAllV(t *testing.T) {
	var logs testutil.SyncBuffer
	cs := world(t, 3, &comm.Config{Watchdog: 50 * time.Millisecond, Timeout: -1,
		Logger: logx.New(&logs, "WARN", "")})
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error { // collective #1
		x := []float32{1}
		return comm.AllReduce(bg, c, x, x, comm.Sum)
	}))
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := range 2 { // rank 2 never arrives
		wg.Add(1)
		go func() {
			defer wg.Done()
			counts := []int{1, 1, 1}
			errs[r] = comm.AllToAllV(bg, cs[r], make([]float32, 3), counts, make([]float32, 3), counts)
		}()
	}
	deadline := time.Now().Add(3 * time.Second)
	for !strings.Contains(logs.String(), "watchdog: AllToAllV #2 has waited") || !strings.Contains(logs.String(), "ranks [2] have not reached it") {
		if time.Now().After(deadline) {
			t.Errorf("no watchdog report naming AllToAllV #2 and rank 2; logs:\n%s", logs.String())
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, c := range cs[:2] {
		c.Abort(errors.New("test over"))
	}
	wg.Wait()
	for r, err := range errs {
		if !errors.Is(err, comm.ErrAborted) && !errors.Is(err, comm.ErrPeerLost) {
			t.Errorf("rank %d's hung AllToAllV: %v", r, err)
		}
	}
}

func TestVariableCollectivesAllocateNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	const n = 4
	cs := world(t, n, nil)
	type bufs struct {
		send, recv     []float32
		sc, rc, counts []int
		hs, hr         *comm.HostBuffer
	}
	b := make([]bufs, n)
	for r := range b {
		x := bufs{sc: make([]int, n), rc: make([]int, n), counts: make([]int, n)}
		st, rt := 0, 0
		for p := range n {
			x.sc[p], x.rc[p], x.counts[p] = 1000*(r+p+1), 1000*(p+r+1), 1000*(p+1)
			st, rt = st+x.sc[p], rt+x.rc[p]
		}
		x.send, x.recv = make([]float32, st), make([]float32, max(rt, n*(n+1)/2*1000))
		x.hs, x.hr = comm.Host(x.send), comm.Host(x.recv[:rt])
		b[r] = x
	}
	ops := map[string]func(c *comm.Comm) error{
		"AllToAllV": func(c *comm.Comm) error {
			x := &b[c.Rank()]
			return comm.AllToAllV(bg, c, x.send, x.sc, x.recv[:len(x.send)], x.rc)
		},
		"AllToAllV/Buffer": func(c *comm.Comm) error {
			x := &b[c.Rank()]
			return c.AllToAllV(bg, x.hs, x.sc, x.hr, x.rc)
		},
		"AllToAllV/inplace": func(c *comm.Comm) error {
			x := &b[c.Rank()]
			return comm.AllToAllV(bg, c, x.send, x.sc, x.send, x.rc)
		},
		"AllGatherV": func(c *comm.Comm) error {
			x := &b[c.Rank()]
			r := c.Rank()
			return comm.AllGatherV(bg, c, x.send[:x.counts[r]], x.recv[:n*(n+1)/2*1000], x.counts)
		},
	}
	for name, op := range ops {
		t.Run(name, func(t *testing.T) {
			run, stop := lockstep(t, cs, op)
			defer stop()
			run() // warm up: connections, scratch
			if a := testing.AllocsPerRun(20, run); a != 0 {
				t.Fatalf("%v allocations per call", a)
			}
		})
	}
}

func sum(s []int) int {
	t := 0
	for _, v := range s {
		t += v
	}
	return t
}
