package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestAllGatherRounds(t *testing.T) {
	for _, size := range []int{1, 2, 5} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			srv, secret := startServer(t, size)
			c := joinAll(t, srv, secret, size, nil)
			const rounds = 4
			noErrors(t, onEveryRank(c, func(r int, cl *Client) error {
				for round := range rounds {
					// Round 2 contributes nothing: empty data must survive.
					data := []byte(strings.Repeat(fmt.Sprintf("r%d.%d;", r, round), r+1))
					if round == 2 {
						data = nil
					}
					all, err := cl.AllGather(context.Background(), data)
					if err != nil {
						return err
					}
					if len(all) != size {
						return fmt.Errorf("round %d: %d contributions, want %d", round, len(all), size)
					}
					for peer, got := range all {
						want := strings.Repeat(fmt.Sprintf("r%d.%d;", peer, round), peer+1)
						if round == 2 {
							want = ""
						}
						if string(got) != want {
							return fmt.Errorf("round %d: rank %d's contribution is %q, want %q", round, peer, got, want)
						}
					}
				}
				return nil
			}))
		})
	}
}

func TestBarrierWaitsForEveryRank(t *testing.T) {
	const size, rounds = 4, 3
	srv, secret := startServer(t, size)
	c := joinAll(t, srv, secret, size, nil)
	var arrived [rounds]atomic.Int32
	noErrors(t, onEveryRank(c, func(r int, cl *Client) error {
		for round := range rounds {
			if r == round%size {
				time.Sleep(20 * time.Millisecond) // a straggler per round
			}
			arrived[round].Add(1)
			if err := cl.Barrier(context.Background()); err != nil {
				return err
			}
			if n := arrived[round].Load(); n != size {
				return fmt.Errorf("round %d: left the barrier when only %d of %d ranks had arrived", round, n, size)
			}
		}
		return nil
	}))
}

func TestCollectiveTimeoutNamesMissingRanks(t *testing.T) {
	const size = 4
	srv, secret := startServer(t, size)
	c := joinAll(t, srv, secret, size, func(cfg *Config) { cfg.Timeout = 300 * time.Millisecond })
	// Ranks 1 and 3 never arrive.
	errs := onEveryRank([]*Client{c[0], c[2]}, func(_ int, cl *Client) error { return cl.Barrier(context.Background()) })
	for _, err := range errs {
		if !errors.Is(err, ErrTimeout) {
			t.Fatalf("Barrier without ranks 1 and 3: %v, want ErrTimeout", err)
		}
		if !strings.Contains(err.Error(), "ranks 1, 3 have not arrived") {
			t.Fatalf("the message should name the missing ranks: %v", err)
		}
	}
}

func TestCollectiveOrderMismatch(t *testing.T) {
	srv, secret := startServer(t, 2)
	c := joinAll(t, srv, secret, 2, nil)
	errs := onEveryRank(c, func(r int, cl *Client) error {
		if r == 0 {
			_, err := cl.AllGather(context.Background(), []byte("x"))
			return err
		}
		return cl.Barrier(context.Background())
	})
	for r, err := range errs {
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "same order") {
			t.Fatalf("rank %d: AllGather against Barrier: %v, want ErrInvalidArgument explaining the order rule", r, err)
		}
	}
}

func TestSplit(t *testing.T) {
	const size = 7
	srv, secret := startServer(t, size)
	c := joinAll(t, srv, secret, size, nil)
	ctx := context.Background()

	// Colors: even ranks 0, odd ranks 1, rank 6 none. Keys reverse the order
	// within a color, except that ranks 2 and 4 tie and keep rank order.
	color := func(r int) int {
		if r == 6 {
			return NoColor
		}
		return r % 2
	}
	key := func(r int) int {
		if r == 2 || r == 4 {
			return 0
		}
		return -r
	}
	wantMembers := map[int][]int{0: {0, 2, 4}, 1: {5, 3, 1}}
	subs := make([]*Client, size)
	noErrors(t, onEveryRank(c, func(r int, cl *Client) error {
		sub, err := cl.Split(ctx, color(r), key(r))
		if err != nil {
			return err
		}
		subs[r] = sub
		if color(r) == NoColor {
			if sub != nil {
				return fmt.Errorf("NoColor gave a client")
			}
			return nil
		}
		want := wantMembers[color(r)]
		if got := sub.JobRanks(); !slices.Equal(got, want) {
			return fmt.Errorf("members %v, want %v", got, want)
		}
		if sub.Size() != len(want) || want[sub.Rank()] != r {
			return fmt.Errorf("rank %d of %d in %v", sub.Rank(), sub.Size(), want)
		}
		if sub.JobID() != cl.JobID() {
			return fmt.Errorf("sub-client job ID %q, parent %q", sub.JobID(), cl.JobID())
		}
		return nil
	}))
	t.Cleanup(func() {
		for _, s := range subs {
			if s != nil {
				s.Close()
			}
		}
	})

	// Parent and sub-groups run their own collective sequences, interleaved
	// differently on each rank, and their keys do not collide.
	noErrors(t, onEveryRank(c, func(r int, cl *Client) error {
		sub := subs[r]
		if sub != nil {
			if err := sub.Set(ctx, "who", []byte(fmt.Sprint(color(r)))); err != nil {
				return err
			}
			for round := range 3 {
				all, err := sub.AllGather(ctx, []byte{byte(r), byte(round)})
				if err != nil {
					return err
				}
				for i, d := range all {
					if int(d[0]) != sub.JobRanks()[i] || int(d[1]) != round {
						return fmt.Errorf("sub-group round %d: entry %d is %v", round, i, d)
					}
				}
			}
			if v, err := sub.Get(ctx, "who"); err != nil || string(v) != fmt.Sprint(color(r)) {
				return fmt.Errorf("sub-group key: %q, %v", v, err)
			}
			if err := sub.Barrier(ctx); err != nil {
				return err
			}
		}
		all, err := cl.AllGather(ctx, []byte{byte(r)})
		if err != nil {
			return err
		}
		for i, d := range all {
			if int(d[0]) != i {
				return fmt.Errorf("parent all-gather entry %d is %v", i, d)
			}
		}
		// The parent never set "who".
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if _, err := cl.Get(short, "who"); !errors.Is(err, ErrTimeout) {
			return fmt.Errorf("parent Get(who) = %v, want ErrTimeout: sub-group keys leaked into the parent", err)
		}
		return nil
	}))

	// Split of a split: the even group splits by rank parity of its group rank.
	noErrors(t, onEveryRank(c, func(r int, cl *Client) error {
		sub := subs[r]
		if sub == nil || color(r) != 0 {
			return nil
		}
		subsub, err := sub.Split(ctx, sub.Rank()/2, 0)
		if err != nil {
			return err
		}
		defer subsub.Close()
		want := []int{0, 2} // group ranks 0 and 1 of {0, 2, 4}
		if r == 4 {
			want = []int{4}
		}
		if got := subsub.JobRanks(); !slices.Equal(got, want) {
			return fmt.Errorf("nested split members %v, want %v", got, want)
		}
		return subsub.Barrier(ctx)
	}))

	if _, err := c[0].Split(ctx, -5, 0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Split with color -5: %v, want ErrInvalidArgument", err)
	}
}

func TestSplitClientsOutliveParent(t *testing.T) {
	srv, secret := startServer(t, 2)
	c := joinAll(t, srv, secret, 2, nil)
	subs := make([]*Client, 2)
	noErrors(t, onEveryRank(c, func(r int, cl *Client) error {
		var err error
		subs[r], err = cl.Split(context.Background(), 0, r)
		return err
	}))
	// Closing a sub-client closes only its own channel.
	if err := subs[1].Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-subs[1].Lost(); ok {
		t.Fatal("closed sub-client's Lost channel is still open")
	}
	if err := subs[1].Barrier(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Barrier on a closed sub-client: %v, want ErrClosed", err)
	}
	// Closing the parent leaves its open sub-clients working, as a
	// communicator made by Split or Shrink outlives its parent.
	if err := c[0].Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-c[0].Lost(); ok {
		t.Fatal("closed parent's Lost channel is still open")
	}
	if err := c[0].Set(context.Background(), "k", nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Set on a closed parent: %v, want ErrClosed", err)
	}
	if err := subs[0].Set(context.Background(), "k", []byte("v")); err != nil {
		t.Fatalf("Set on the sub-client of a closed parent: %v", err)
	}
	if v, err := subs[0].Get(context.Background(), "k"); err != nil || string(v) != "v" {
		t.Fatalf("Get on the sub-client of a closed parent: %q, %v", v, err)
	}
	select {
	case <-srv.Done():
		t.Fatal("rank 0 left the job although its sub-client is open")
	default:
	}
	// The last client to close leaves the job.
	if err := subs[0].Close(); err != nil {
		t.Fatal(err)
	}
	if err := c[1].Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-srv.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the job did not end after every client of every rank closed")
	}
	if err := subs[0].Set(context.Background(), "k", nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Set on a closed sub-client: %v, want ErrClosed", err)
	}
}

// countingListener counts the connections a server accepts.
type countingListener struct {
	net.Listener
	accepted atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

func TestOneConnectionPerRank(t *testing.T) {
	const size = 4
	secret := NewSecret()
	srv, err := NewServer("127.0.0.1:0", secret, size, WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	counting := &countingListener{Listener: srv.listener}
	srv.listener = counting
	go srv.Serve()
	// Stop after the clients' cleanup has closed them (cleanups run last
	// in, first out): a client that leaves a stopped rendezvous is told so.
	t.Cleanup(func() { srv.Stop() })

	c := joinAll(t, srv, secret, size, nil)
	noErrors(t, onEveryRank(c, func(r int, cl *Client) error {
		ctx := context.Background()
		sub, err := cl.Split(ctx, r%2, 0)
		if err != nil {
			return err
		}
		defer sub.Close()
		subsub, err := sub.Split(ctx, 0, 0)
		if err != nil {
			return err
		}
		defer subsub.Close()
		for _, g := range []*Client{cl, sub, subsub} {
			if _, err := g.AllGather(ctx, []byte("d")); err != nil {
				return err
			}
			if err := g.Set(ctx, fmt.Sprint("k", r), nil); err != nil {
				return err
			}
		}
		return cl.Barrier(ctx)
	}))
	if n := counting.accepted.Load(); n != size {
		t.Fatalf("the rendezvous accepted %d connections from %d ranks (with Split clients), want one per rank", n, size)
	}
}
