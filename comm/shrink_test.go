package comm_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gccl/gccl/comm"
)

// survivorsSum runs an all-reduce on cs and checks it against the sum of
// every member's contribution (rank+1, scaled by salt).
func survivorsSum(t *testing.T, cs []*comm.Comm, salt int64) {
	t.Helper()
	const count = 100003 // several chunks, an odd tail
	want := int64(0)
	for r := range cs {
		want += int64(r+1) * salt
	}
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		in, out := make([]int64, count), make([]int64, count)
		for i := range in {
			in[i] = int64(c.Rank()+1)*salt + int64(i)
		}
		if err := comm.AllReduce(bg, c, in, out, comm.Sum); err != nil {
			return err
		}
		for i, v := range out {
			if v != want+int64(len(cs)*i) {
				return fmt.Errorf("out[%d] = %d, want %d", i, v, want+int64(len(cs)*i))
			}
		}
		return nil
	}))
}

// lose makes rank victim of cs fail as a dead rank looks to its peers: it
// aborts and closes, and the others' next all-reduce fails.
func lose(t *testing.T, cs []*comm.Comm, victim int) []*comm.Comm {
	t.Helper()
	cs[victim].Abort(errors.New("rank died"))
	cs[victim].Close()
	var survivors []*comm.Comm
	for r, c := range cs {
		if r != victim {
			survivors = append(survivors, c)
		}
	}
	errs := onAll(t, survivors, func(c *comm.Comm) error {
		x := make([]float32, 1000)
		return comm.AllReduce(bg, c, x, x, comm.Sum)
	})
	for i, err := range errs {
		if !errors.Is(err, comm.ErrPeerLost) && !errors.Is(err, comm.ErrAborted) {
			t.Fatalf("survivor %d: all-reduce with a dead rank: %v, want ErrPeerLost", i, err)
		}
	}
	return survivors
}

func shrinkAll(t *testing.T, cs []*comm.Comm, exclude []int) []*comm.Comm {
	t.Helper()
	out := make([]*comm.Comm, len(cs))
	errs := onAll(t, cs, func(c *comm.Comm) error {
		var err error
		for i := range cs {
			if cs[i] == c {
				out[i], err = c.Shrink(bg, exclude)
			}
		}
		return err
	})
	mustAll(t, errs)
	return out
}

func checkShrunk(t *testing.T, shrunk []*comm.Comm) {
	t.Helper()
	for i, c := range shrunk {
		if c.Rank() != i || c.Size() != len(shrunk) {
			t.Fatalf("survivor %d: rank %d of %d in the shrunk communicator, want %d of %d", i, c.Rank(), c.Size(), i, len(shrunk))
		}
	}
}

func TestShrinkLocal(t *testing.T) {
	before := runtime.NumGoroutine()
	cs, err := comm.InitLocal(4, &comm.Config{Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	survivors := lose(t, cs, 2)
	shrunk := shrinkAll(t, survivors, []int{2})
	checkShrunk(t, shrunk)
	survivorsSum(t, shrunk, 1000)
	// The parents stay aborted; closing them leaves the shrunk ones working.
	for _, c := range survivors {
		c.Close()
	}
	survivorsSum(t, shrunk, 7)
	// Shrink of a healthy communicator, which stays usable.
	again := shrinkAll(t, shrunk[1:], []int{0})
	checkShrunk(t, again)
	survivorsSum(t, again, 3)
	for _, c := range append(shrunk, again...) {
		c.Close()
	}
	checkNoLeak(t, before)
}

func TestShrinkRemote(t *testing.T) {
	for _, shm := range []bool{true, false} {
		t.Run(fmt.Sprintf("shm=%v", shm), func(t *testing.T) {
			before := runtime.NumGoroutine()
			if shm {
				t.Setenv("GCCL_STRICT", "1") // no downgrade may hide a name collision
			} else {
				t.Setenv("GCCL_SHM_DISABLE", "1")
			}
			cs, stop := initJobOver(t, 4)
			survivors := lose(t, cs, 3)
			shrunk := shrinkAll(t, survivors, []int{3})
			checkShrunk(t, shrunk)
			survivorsSum(t, shrunk, 1000)
			// Abort notices of the parents keep arriving; the shrunk
			// communicators do not hear them.
			time.Sleep(100 * time.Millisecond)
			for _, c := range survivors {
				c.Close()
			}
			survivorsSum(t, shrunk, 5)
			// A shrink of the shrunk communicator, healthy, excluding a
			// live rank: rank 0 serves the rendezvous, so it stays.
			again := shrinkAll(t, shrunk[:2], []int{2})
			checkShrunk(t, again)
			survivorsSum(t, again, 11)
			survivorsSum(t, shrunk, 13)
			mustAll(t, onAll(t, append(again, shrunk...), func(c *comm.Comm) error { return c.Close() }))
			stop()
			checkNoLeak(t, before)
		})
	}
}

func TestShrinkListsMustAgree(t *testing.T) {
	for _, remote := range []bool{false, true} {
		t.Run(fmt.Sprintf("remote=%v", remote), func(t *testing.T) {
			var cs []*comm.Comm
			if remote {
				var stop func()
				cs, stop = initJob(t, 4)
				defer stop()
			} else {
				cs = world(t, 4, &comm.Config{Timeout: 20 * time.Second})
			}
			defer func() {
				for _, c := range cs {
					c.Close()
				}
			}()
			lists := [][]int{{3}, {3}, {1}}
			errs := onAll(t, cs[:3], func(c *comm.Comm) error {
				nc, err := c.Shrink(bg, lists[c.Rank()])
				if err == nil {
					nc.Close()
				}
				return err
			})
			for r, err := range errs {
				if !errors.Is(err, comm.ErrMismatch) || !strings.Contains(err.Error(), "Shrink") {
					t.Errorf("rank %d: Shrink with lists that disagree: %v, want ErrMismatch", r, err)
				}
			}
			// Bad lists are refused on the spot, and numbered: the next
			// shrink, with one list, works.
			for _, bad := range [][]int{{4}, {-1}, {1, 1}, {0}} {
				if _, err := cs[0].Shrink(bg, bad); !errors.Is(err, comm.ErrInvalidArgument) {
					t.Errorf("Shrink(%v): %v, want ErrInvalidArgument", bad, err)
				}
			}
			for _, c := range cs[1:3] {
				for range 4 {
					c.Shrink(bg, []int{c.Rank()}) // refused: excludes itself
				}
			}
			shrunk := make([]*comm.Comm, 3)
			mustAll(t, onAll(t, cs[:3], func(c *comm.Comm) error {
				var err error
				shrunk[c.Rank()], err = c.Shrink(bg, []int{3})
				return err
			}))
			survivorsSum(t, shrunk, 1)
			for _, c := range shrunk {
				c.Close()
			}
		})
	}
}

func TestShrinkAfterClose(t *testing.T) {
	cs := world(t, 2, nil)
	cs[0].Close()
	if _, err := cs[0].Shrink(bg, []int{1}); !errors.Is(err, comm.ErrClosed) {
		t.Fatalf("Shrink of a closed communicator: %v, want ErrClosed", err)
	}
}

func TestShrinkTimesOut(t *testing.T) {
	cs := world(t, 3, &comm.Config{Timeout: 200 * time.Millisecond})
	// Rank 2 is left out by nobody, but never calls Shrink.
	errs := onAll(t, cs[:2], func(c *comm.Comm) error {
		_, err := c.Shrink(bg, nil)
		return err
	})
	for r, err := range errs {
		if !errors.Is(err, comm.ErrTimeout) || !strings.Contains(err.Error(), "2 of the 3") {
			t.Errorf("rank %d: Shrink without every survivor: %v, want ErrTimeout saying 2 of the 3 arrived", r, err)
		}
	}
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if _, err := cs[0].Shrink(ctx, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Shrink with a cancelled context: %v, want context.Canceled", err)
	}
}

// TestNestedSplitsDoNotCollide: the children of two sibling communicators,
// made at the same time with the same split number and color, get distinct
// shared-memory names (GCCL_STRICT=1 turns a collision's fallback to TCP
// into an error).
func TestNestedSplitsDoNotCollide(t *testing.T) {
	t.Setenv("GCCL_STRICT", "1")
	cs, stop := initJobOver(t, 4)
	defer stop()
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		defer c.Close()
		half, err := c.Split(bg, c.Rank()%2, 0)
		if err != nil {
			return err
		}
		defer half.Close()
		for range 3 {
			child, err := half.Split(bg, 0, 0)
			if err != nil {
				return err
			}
			x := []int64{int64(c.Rank())}
			if err := comm.AllReduce(bg, child, x, x, comm.Sum); err != nil {
				return err
			}
			if want := int64(c.Rank()%2)*2 + 2; x[0] != want {
				return fmt.Errorf("child all-reduce %d, want %d", x[0], want)
			}
			child.Close()
		}
		return nil
	}))
}

// TestShrinkLateSurvivorAfterTimeout: survivors that gave up on a Shrink
// take no part in it any more; one that arrives after they timed out must
// not get a communicator whose other members are gone, and the next
// Shrink, by everyone, works.
func TestShrinkLateSurvivorAfterTimeout(t *testing.T) {
	cs := world(t, 3, &comm.Config{Timeout: 200 * time.Millisecond})
	for r, err := range onAll(t, cs[:2], func(c *comm.Comm) error {
		_, err := c.Shrink(bg, nil)
		return err
	}) {
		if !errors.Is(err, comm.ErrTimeout) {
			t.Fatalf("rank %d: Shrink without rank 2: %v, want ErrTimeout", r, err)
		}
	}
	if nc, err := cs[2].Shrink(bg, nil); !errors.Is(err, comm.ErrTimeout) {
		if nc != nil {
			nc.Close()
		}
		t.Fatalf("rank 2: Shrink after the others gave up: %v, want ErrTimeout", err)
	}
	shrunk := shrinkAll(t, cs, nil)
	checkShrunk(t, shrunk)
	survivorsSum(t, shrunk, 1)
	for _, c := range shrunk {
		c.Close()
	}
}

// TestShrinkWithoutARankThatClosed: a rank whose process closes its
// communicator (an error of its own, a deferred Close) is gone for good:
// the others' LostRanks names it without their Comm failing, and they
// shrink without it.
func TestShrinkWithoutARankThatClosed(t *testing.T) {
	cs, stop := initJobOver(t, 3)
	defer stop()
	survivorsSum(t, cs, 1)
	if err := cs[2].Close(); err != nil {
		t.Fatal(err)
	}
	survivors := cs[:2]
	for r, c := range survivors {
		deadline := time.Now().Add(10 * time.Second)
		for len(c.LostRanks()) == 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if got := fmt.Sprint(c.LostRanks()); got != "[2]" {
			t.Fatalf("rank %d: LostRanks = %s after rank 2 closed, want [2]", r, got)
		}
		if err := c.Err(); err != nil {
			t.Fatalf("rank %d: Err = %v: a rank that left is no failure", r, err)
		}
	}
	shrunk := make([]*comm.Comm, len(survivors))
	mustAll(t, onAll(t, survivors, func(c *comm.Comm) error {
		var err error
		shrunk[c.Rank()], err = c.Shrink(bg, c.LostRanks())
		return err
	}))
	checkShrunk(t, shrunk)
	survivorsSum(t, shrunk, 3)
	mustAll(t, onAll(t, append(shrunk, survivors...), func(c *comm.Comm) error { return c.Close() }))
}

// A shrink whose survivors disagreed stays on record for latecomers, which
// fail too, until the parent world's last rank closes.
func TestMismatchedLocalShrinkIsForgottenAtClose(t *testing.T) {
	cs := world(t, 3, &comm.Config{Timeout: 20 * time.Second})
	lists := [][]int{{2}, {}}
	errs := onAll(t, cs[:2], func(c *comm.Comm) error {
		nc, err := c.Shrink(bg, lists[c.Rank()])
		if err == nil {
			nc.Close()
		}
		return err
	})
	for r, err := range errs {
		if !errors.Is(err, comm.ErrMismatch) {
			t.Fatalf("rank %d: %v, want ErrMismatch", r, err)
		}
	}
	if _, err := cs[2].Shrink(bg, nil); !errors.Is(err, comm.ErrMismatch) {
		t.Fatalf("a latecomer to the failed shrink: %v, want ErrMismatch", err)
	}
	for i, c := range cs {
		if n := comm.PendingShrinks(cs[0]); n != 1 {
			t.Fatalf("with %d of 3 ranks closed, %d shrinks on record, want the failed one", i, n)
		}
		c.Close()
	}
	if n := comm.PendingShrinks(cs[0]); n != 0 {
		t.Fatalf("%d shrinks on record after every rank closed", n)
	}
}
