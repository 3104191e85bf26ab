package comm_test

import (
	"errors"
	"testing"
	"time"

	"github.com/gccl/gccl/comm"
)

// lateRank runs 6 all-reduces on cs; before the 4th, rank late sleeps.
func lateRank(t *testing.T, cs []*comm.Comm, late int, sleep time.Duration) {
	t.Helper()
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		x := make([]float32, 4096)
		for i := range 6 {
			if i == 3 && c.Rank() == late {
				time.Sleep(sleep)
			}
			if err := comm.AllReduce(bg, c, x, x, comm.Sum); err != nil {
				return err
			}
		}
		return nil
	}))
}

func checkStragglers(t *testing.T, cs []*comm.Comm, late int, sleep time.Duration) {
	t.Helper()
	reports := make([][]comm.Straggle, len(cs))
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		var err error
		reports[c.Rank()], err = c.Stragglers(bg)
		return err
	}))
	rep := reports[0]
	t.Logf("%+v", rep)
	if len(rep) != 6 {
		t.Fatalf("%d collectives reported, want 6: %+v", len(rep), rep)
	}
	for i, s := range rep {
		if s.Op != "AllReduce" || s.Seq != uint64(i+1) {
			t.Fatalf("report %d: %+v, want AllReduce #%d", i, s, i+1)
		}
	}
	if s := rep[3]; s.Last != late || s.Late < sleep/2 {
		t.Fatalf("the 4th all-reduce: %+v; want rank %d last, at least %v late", s, late, sleep/2)
	}
	for r := range reports {
		if len(reports[r]) != len(rep) || reports[r][3] != rep[3] {
			t.Fatalf("rank %d's report differs from rank 0's: %+v", r, reports[r])
		}
	}
}

func TestStragglersLocal(t *testing.T) {
	cs := world(t, 3, nil)
	lateRank(t, cs, 2, 100*time.Millisecond)
	checkStragglers(t, cs, 2, 100*time.Millisecond)
}

func TestStragglersRemote(t *testing.T) {
	cs, stop := initJob(t, 3)
	defer stop()
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	lateRank(t, cs, 1, 100*time.Millisecond)
	checkStragglers(t, cs, 1, 100*time.Millisecond)
}

func TestStragglersWithAsyncPending(t *testing.T) {
	cs := world(t, 2, &comm.Config{Timeout: 20 * time.Second})
	x, y := make([]float32, 1<<16), make([]float32, 1<<16)
	req := comm.AllReduceAsync(cs[0], x, x, comm.Sum)
	if _, err := cs[0].Stragglers(bg); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Errorf("Stragglers with an async all-reduce running: %v, want ErrInvalidArgument", err)
	}
	mustAll(t, onAll(t, cs[1:], func(c *comm.Comm) error { return comm.AllReduce(bg, c, y, y, comm.Sum) }))
	if err := req.Wait(bg); err != nil {
		t.Fatal(err)
	}
	// The refused call was numbered: the next ones meet as a mismatch (rank
	// 0's second against rank 1's first), not as each other's data.
	for r, err := range onAll(t, cs, func(c *comm.Comm) error {
		_, err := c.Stragglers(bg)
		return err
	}) {
		if !errors.Is(err, comm.ErrMismatch) {
			t.Errorf("rank %d: Stragglers after rank 0's was refused: %v, want ErrMismatch", r, err)
		}
	}
}

// TestArrivalClockIsTheWallClock: arrival times agree with the wall clock
// (other hosts compare against theirs), also after the wall clock was set
// since the process started, which the clock follows within 100 ms (a CI
// VM's clock was stepped by 5.8 s while the tests ran).
func TestArrivalClockIsTheWallClock(t *testing.T) {
	for range 3 {
		var at, before, after int64
		for try := range 2 {
			before = time.Now().UnixNano()
			at = comm.WallNow()
			after = time.Now().UnixNano()
			// Allow for one millisecond of NTP slew.
			if at >= before-int64(time.Millisecond) && at <= after+int64(time.Millisecond) {
				break
			}
			if try == 0 { // a step just now: followed within 100 ms
				time.Sleep(150 * time.Millisecond)
				continue
			}
			t.Fatalf("arrival clock %d, wall clock between %d and %d", at, before, after)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStragglersAfterWrapAround: once more than 64 collectives ran, the
// report covers the latest 64, every one of them (the log is a ring; the
// all-gather that Stragglers itself makes overwrites the oldest entry).
func TestStragglersAfterWrapAround(t *testing.T) {
	const ops = 100
	cs := world(t, 2, nil)
	reports := make([][]comm.Straggle, len(cs))
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		x := []int64{1}
		for range ops {
			if err := comm.AllReduce(bg, c, x, x, comm.Sum); err != nil {
				return err
			}
		}
		var err error
		reports[c.Rank()], err = c.Stragglers(bg)
		return err
	}))
	for r, rep := range reports {
		if len(rep) != 64 || rep[0].Seq != ops-63 || rep[63].Seq != ops {
			t.Fatalf("rank %d: %d collectives reported (%+v ... %+v), want the 64 from #%d to #%d",
				r, len(rep), rep[0], rep[len(rep)-1], ops-63, ops)
		}
	}
}
