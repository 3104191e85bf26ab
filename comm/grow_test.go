package comm_test

import (
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
)

// growAll grows every rank of cs to size while newcomers join through
// join(i), the i-th newcomer; it returns the grown ranks of cs, then the
// newcomers', and each call's error.
func growAll(t *testing.T, cs []*comm.Comm, size int, join func(i int) (*comm.Comm, error)) ([]*comm.Comm, []error) {
	t.Helper()
	out := make([]*comm.Comm, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() { out[i], errs[i] = c.Grow(bg, size) })
	}
	for i := range size - len(cs) {
		wg.Go(func() { out[len(cs)+i], errs[len(cs)+i] = join(i) })
	}
	wg.Wait()
	return out, errs
}

// byRank orders grown communicators by their rank, newcomers having taken
// whichever free rank they got.
func byRank(t *testing.T, cs []*comm.Comm) []*comm.Comm {
	t.Helper()
	out := make([]*comm.Comm, len(cs))
	for _, c := range cs {
		if c.Size() != len(cs) || out[c.Rank()] != nil {
			t.Fatalf("grown communicator: rank %d of %d, want distinct ranks of %d", c.Rank(), c.Size(), len(cs))
		}
		out[c.Rank()] = c
	}
	return out
}

func TestGrowLocal(t *testing.T) {
	before := runtime.NumGoroutine()
	cs, err := comm.InitLocal(4, &comm.Config{Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Kill, shrink, grow, continue: rank 2 dies, the survivors shrink to
	// 3 ranks, a newcomer takes rank 3 of the grown communicator.
	survivors := lose(t, cs, 2)
	shrunk := shrinkAll(t, survivors, []int{2})
	for _, c := range survivors {
		c.Close()
	}
	grown, errs := growAll(t, shrunk, 4, func(int) (*comm.Comm, error) { return comm.JoinLocal(bg, shrunk[1], 3, nil) })
	mustAll(t, errs)
	for i, c := range grown {
		if c.Rank() != i || c.Size() != 4 {
			t.Fatalf("grown %d: rank %d of %d, want %d of 4", i, c.Rank(), c.Size(), i)
		}
	}
	survivorsSum(t, grown, 1000)
	// The shrunk communicator is untouched, and a healthy one grows again,
	// by two newcomers that take any rank.
	survivorsSum(t, shrunk, 3)
	again, errs := growAll(t, grown, 6, func(int) (*comm.Comm, error) { return comm.JoinLocal(bg, grown[0], comm.AnyRank, nil) })
	mustAll(t, errs)
	again = byRank(t, again)
	survivorsSum(t, again, 17)
	for _, c := range append(append(shrunk, grown...), again...) {
		c.Close()
	}
	checkNoLeak(t, before)
}

// jobOver starts a rendezvous for n ranks and inits them; it returns their
// communicators and what a newcomer needs to join the job.
func jobOver(t *testing.T, n int, timeout time.Duration) (cs []*comm.Comm, newcomer func(rank, size int) (*comm.Comm, error), stop func()) {
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
	cfg := func(rank, size int, secret string) *comm.Config {
		return &comm.Config{Logger: quiet, Bootstrap: &bootstrap.Config{
			Rank: rank, Size: size, Addr: srv.Addr(), Secret: secret, Timeout: timeout, Logger: quiet}}
	}
	cs = make([]*comm.Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { cs[r], errs[r] = comm.Init(bg, cfg(r, n, secret)) })
	}
	wg.Wait()
	mustAll(t, errs)
	newcomer = func(rank, size int) (*comm.Comm, error) { return comm.Join(bg, cfg(rank, size, secret)) }
	return cs, newcomer, func() { srv.Stop(); <-served }
}

func TestGrowRemote(t *testing.T) {
	for _, shm := range []bool{true, false} {
		t.Run(fmt.Sprintf("shm=%v", shm), func(t *testing.T) {
			before := runtime.NumGoroutine()
			if shm {
				t.Setenv("GCCL_STRICT", "1") // no downgrade may hide a name collision
			} else {
				t.Setenv("GCCL_SHM_DISABLE", "1")
			}
			cs, newcomer, stop := jobOver(t, 4, 10*time.Second)
			survivors := lose(t, cs, 2)
			shrunk := shrinkAll(t, survivors, []int{2})
			grown, errs := growAll(t, shrunk, 4, func(int) (*comm.Comm, error) { return newcomer(comm.AnyRank, 4) })
			mustAll(t, errs)
			for i, c := range grown {
				if c.Rank() != i || c.Size() != 4 {
					t.Fatalf("grown %d: rank %d of %d, want %d of 4", i, c.Rank(), c.Size(), i)
				}
			}
			survivorsSum(t, grown, 1000)
			for _, c := range survivors {
				c.Close()
			}
			survivorsSum(t, grown, 7)
			survivorsSum(t, shrunk, 5)
			mustAll(t, onAll(t, append(shrunk, grown...), func(c *comm.Comm) error { return c.Close() }))
			stop()
			checkNoLeak(t, before)
		})
	}
}

func TestGrowSizesMustAgree(t *testing.T) {
	for _, remote := range []bool{false, true} {
		t.Run(fmt.Sprintf("remote=%v", remote), func(t *testing.T) {
			var cs []*comm.Comm
			var join func(int) (*comm.Comm, error)
			if remote {
				var stop func()
				var newcomer func(rank, size int) (*comm.Comm, error)
				cs, newcomer, stop = jobOver(t, 2, 10*time.Second)
				defer stop()
				join = func(int) (*comm.Comm, error) { return newcomer(comm.AnyRank, 3) }
			} else {
				var err error
				if cs, err = comm.InitLocal(2, &comm.Config{Timeout: 20 * time.Second}); err != nil {
					t.Fatal(err)
				}
				join = func(int) (*comm.Comm, error) { return comm.JoinLocal(bg, cs[0], comm.AnyRank, nil) }
			}
			errs := onAll(t, cs, func(c *comm.Comm) error {
				_, err := c.Grow(bg, 3+c.Rank())
				return err
			})
			for r, err := range errs {
				t.Logf("rank %d: %v", r, err)
				if !errors.Is(err, comm.ErrMismatch) {
					t.Fatalf("rank %d: Grow with sizes 3 and 4: %v, want ErrMismatch", r, err)
				}
			}
			// A size that is no growth is refused before any exchange.
			for r, err := range onAll(t, cs, func(c *comm.Comm) error { _, err := c.Grow(bg, 2); return err }) {
				if !errors.Is(err, comm.ErrInvalidArgument) {
					t.Fatalf("rank %d: Grow to the same size: %v, want ErrInvalidArgument", r, err)
				}
			}
			// The refused calls kept the ranks in step: the next grow works.
			grown, errs := growAll(t, cs, 3, join)
			mustAll(t, errs)
			survivorsSum(t, byRank(t, grown), 9)
			mustAll(t, onAll(t, append(cs, grown...), func(c *comm.Comm) error { return c.Close() }))
		})
	}
}

func TestGrowTimesOutNamingWhoIsMissing(t *testing.T) {
	for _, remote := range []bool{false, true} {
		t.Run(fmt.Sprintf("remote=%v", remote), func(t *testing.T) {
			var cs []*comm.Comm
			if remote {
				var stop func()
				cs, _, stop = jobOver(t, 2, 500*time.Millisecond)
				defer stop()
			} else {
				var err error
				if cs, err = comm.InitLocal(2, &comm.Config{Timeout: 500 * time.Millisecond}); err != nil {
					t.Fatal(err)
				}
			}
			errs := onAll(t, cs, func(c *comm.Comm) error {
				_, err := c.Grow(bg, 3)
				return err
			})
			for r, err := range errs {
				t.Logf("rank %d: %v", r, err)
				if !errors.Is(err, comm.ErrTimeout) || !strings.Contains(err.Error(), "newcomers") {
					t.Fatalf("rank %d: Grow that no newcomer joined: %v, want a timeout", r, err)
				}
			}
			mustAll(t, onAll(t, cs, func(c *comm.Comm) error { return c.Close() }))
		})
	}
}

func TestJoinLocalRefusesBadRanks(t *testing.T) {
	cs := world(t, 2, nil)
	if _, err := comm.JoinLocal(bg, cs[0], 1, nil); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Fatalf("newcomer asking for a member's rank: %v, want ErrInvalidArgument", err)
	}
}

// TestGrowOfAbortedCommIsRefused: across processes an aborted group does
// not grow; Shrink with an empty list makes one that does.
func TestGrowOfAbortedCommIsRefused(t *testing.T) {
	cs, newcomer, stop := jobOver(t, 2, 10*time.Second)
	defer stop()
	cs[0].Abort(errors.New("test gives up"))
	// The abort reaches rank 1 through the rendezvous.
	for deadline := time.Now().Add(10 * time.Second); cs[1].Err() == nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("rank 1 never heard of rank 0's abort")
		}
	}
	for r, err := range onAll(t, cs, func(c *comm.Comm) error { _, err := c.Grow(bg, 3); return err }) {
		if !errors.Is(err, comm.ErrAborted) {
			t.Fatalf("rank %d: Grow of an aborted communicator: %v, want ErrAborted", r, err)
		}
	}
	fresh := shrinkAll(t, cs, nil)
	grown, errs := growAll(t, fresh, 3, func(int) (*comm.Comm, error) { return newcomer(comm.AnyRank, 3) })
	mustAll(t, errs)
	survivorsSum(t, grown, 21)
	mustAll(t, onAll(t, append(append(cs, fresh...), grown...), func(c *comm.Comm) error { c.Close(); return nil }))
}
