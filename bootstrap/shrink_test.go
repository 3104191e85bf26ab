package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestShrinkAfterLoss(t *testing.T) {
	srv, secret := startServer(t, 4, WithHeartbeatTimeout(lossTimeout))
	c := joinAll(t, srv, secret, 4, nil)
	survivors := []*Client{c[0], c[1], c[3]}

	// Rank 2 vanishes, as a crashed process would; the job's rounds that
	// need it fail.
	c[2].sess.conn.Close()
	for _, cl := range survivors {
		if n := nextNotice(t, cl, 2*lossTimeout+2*time.Second); n.Kind != NoticeRankLost || n.Rank != 2 {
			t.Fatalf("rank %d: notice %v, want rank 2 lost", cl.Rank(), n)
		}
	}
	for _, cl := range survivors {
		if got := cl.LostRanks(); !slices.Equal(got, []int{2}) {
			t.Fatalf("rank %d: LostRanks = %v, want [2]", cl.Rank(), got)
		}
	}
	if err := c[0].Barrier(context.Background()); !errors.Is(err, ErrRankLost) {
		t.Fatalf("job Barrier after rank 2 was lost: %v, want ErrRankLost", err)
	}
	// A survivor also gives up on the job's group, as a communicator does
	// when an operation fails: that must not stop the shrink.
	if err := c[3].Abort(context.Background(), "peer lost"); err != nil {
		t.Fatal(err)
	}

	subs := make([]*Client, 3)
	noErrors(t, onEveryRank(survivors, func(i int, cl *Client) error {
		var err error
		subs[i], err = cl.Shrink(context.Background(), []int{2})
		return err
	}))
	t.Cleanup(func() { closeAll(t, subs) })
	for i, sub := range subs {
		if got := sub.LostRanks(); len(got) != 0 {
			t.Fatalf("survivor %d: LostRanks of the shrunk group = %v, want none", i, got)
		}
		if sub.Rank() != i || sub.Size() != 3 || !slices.Equal(sub.JobRanks(), []int{0, 1, 3}) {
			t.Fatalf("survivor %d: rank %d of %d, job ranks %v; want rank %d of 3, job ranks [0 1 3]", i, sub.Rank(), sub.Size(), sub.JobRanks(), i)
		}
	}
	noErrors(t, onEveryRank(subs, func(i int, sub *Client) error {
		all, err := sub.AllGather(context.Background(), []byte{byte(i)})
		if err != nil {
			return err
		}
		if len(all) != 3 || all[0][0] != 0 || all[1][0] != 1 || all[2][0] != 2 {
			return fmt.Errorf("AllGather of the shrunk group: %v", all)
		}
		if err := sub.Set(context.Background(), fmt.Sprint("k", i), []byte{byte(i)}); err != nil {
			return err
		}
		v, err := sub.Get(context.Background(), fmt.Sprint("k", (i+1)%3))
		if err != nil || len(v) != 1 || v[0] != byte((i+1)%3) {
			return fmt.Errorf("Get of a peer's key in the shrunk group: %v, %v", v, err)
		}
		return sub.Barrier(context.Background())
	}))
	// The job's group stays aborted, and says so.
	if err := c[1].Set(context.Background(), "k", nil); !errors.Is(err, ErrAborted) {
		t.Fatalf("Set in the aborted job group: %v, want ErrAborted", err)
	}
	// The shrunk group hears neither of the excluded rank nor of its
	// parent's abort.
	for _, sub := range subs {
		expectNoNotice(t, sub, 20*time.Millisecond)
	}
}

func TestShrinkOfHealthyGroup(t *testing.T) {
	srv, secret := startServer(t, 3)
	c := joinAll(t, srv, secret, 3, nil)
	// Rank 0 is excluded although alive: it does not call Shrink, and the
	// job's group stays usable afterwards.
	subs := make([]*Client, 3)
	noErrors(t, onEveryRank(c[1:], func(i int, cl *Client) error {
		var err error
		subs[i+1], err = cl.Shrink(context.Background(), []int{0})
		return err
	}))
	t.Cleanup(func() { closeAll(t, subs[1:]) })
	if !slices.Equal(subs[2].JobRanks(), []int{1, 2}) || subs[2].Rank() != 1 {
		t.Fatalf("shrunk group: job ranks %v, rank %d", subs[2].JobRanks(), subs[2].Rank())
	}
	noErrors(t, onEveryRank(c, func(_ int, cl *Client) error { return cl.Barrier(context.Background()) }))
	// A second shrink of the same group makes a new group, separate from
	// the first.
	subs2 := make([]*Client, 2)
	noErrors(t, onEveryRank(c[1:], func(i int, cl *Client) error {
		var err error
		subs2[i], err = cl.Shrink(context.Background(), []int{0})
		return err
	}))
	t.Cleanup(func() { closeAll(t, subs2) })
	noErrors(t, onEveryRank(subs2, func(i int, sub *Client) error {
		return sub.Set(context.Background(), "k", []byte{byte(i)})
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := subs[1].Get(ctx, "k"); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Get in the first shrunk group of a key only the second set: %v, want ErrTimeout", err)
	}
}

func TestShrinkListsMustAgree(t *testing.T) {
	srv, secret := startServer(t, 4)
	c := joinAll(t, srv, secret, 4, nil)
	// Ranks 0 and 1 exclude rank 3; rank 2 excludes rank 1 instead.
	lists := [][]int{{3}, {3}, {1}}
	errs := onEveryRank(c[:3], func(r int, cl *Client) error {
		sub, err := cl.Shrink(context.Background(), lists[r])
		if err == nil {
			sub.Close()
		}
		return err
	})
	for r, err := range errs {
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "Shrink") {
			t.Errorf("rank %d: Shrink with disagreeing lists: %v, want ErrInvalidArgument naming Shrink", r, err)
		}
	}
	// Numbered despite the failure: the next attempt, with one list,
	// works on every rank.
	noErrors(t, onEveryRank(c[:3], func(r int, cl *Client) error {
		sub, err := cl.Shrink(context.Background(), []int{3})
		if err != nil {
			return err
		}
		defer sub.Close()
		return sub.Barrier(context.Background())
	}))
}

func TestShrinkRefusesBadLists(t *testing.T) {
	srv, secret := startServer(t, 1)
	c := joinAll(t, srv, secret, 1, nil)
	for _, tc := range []struct {
		exclude []int
		want    string
	}{
		{[]int{1}, "outside 0..0"},
		{[]int{-1}, "outside 0..0"},
		{[]int{0}, "excludes itself"},
	} {
		if _, err := c[0].Shrink(context.Background(), tc.exclude); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Shrink(%v): %v, want ErrInvalidArgument saying %q", tc.exclude, err, tc.want)
		}
	}
	srv2, secret2 := startServer(t, 3)
	c2 := joinAll(t, srv2, secret2, 3, nil)
	if _, err := c2[0].Shrink(context.Background(), []int{2, 2}); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "twice") {
		t.Errorf("Shrink([2 2]): %v, want ErrInvalidArgument saying twice", err)
	}
}

func TestAbortIsScopedToItsGroup(t *testing.T) {
	srv, secret := startServer(t, 3)
	c := joinAll(t, srv, secret, 3, nil)
	subs := make([]*Client, 3)
	noErrors(t, onEveryRank(c, func(r int, cl *Client) error {
		var err error
		subs[r], err = cl.Split(context.Background(), 0, 0)
		return err
	}))
	t.Cleanup(func() { closeAll(t, subs) })

	pending := make(chan error, 1)
	go func() { pending <- subs[1].Barrier(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	if err := subs[2].Abort(context.Background(), "out of memory"); err != nil {
		t.Fatal(err)
	}
	if err := <-pending; !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "out of memory") {
		t.Fatalf("Barrier pending in the aborted group: %v, want ErrAborted with the reason", err)
	}
	if _, err := subs[0].Get(context.Background(), "never"); !errors.Is(err, ErrAborted) {
		t.Fatalf("Get in the aborted group: %v, want ErrAborted", err)
	}
	for _, r := range []int{0, 1} {
		if n := nextNotice(t, subs[r], 5*time.Second); n.Kind != NoticeAbort || n.Rank != 2 {
			t.Fatalf("rank %d's sub-client: notice %v, want rank 2's abort", r, n)
		}
	}
	// The job's group goes on, and its channels do not hear of the
	// sub-group's abort.
	noErrors(t, onEveryRank(c, func(_ int, cl *Client) error { return cl.Barrier(context.Background()) }))
	for _, cl := range c {
		expectNoNotice(t, cl, 20*time.Millisecond)
	}
	if err := srv.Err(); !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "group") {
		t.Fatalf("Server.Err = %v, want the group's abort", err)
	}
}

// TestLostRanksNamesRanksThatLeft: a rank that closes its client (a process
// that ends on an error of its own, with a deferred Close) is gone for good:
// LostRanks names it, so that the others can shrink without it. Nothing
// failed, so nobody is told to abort.
func TestLostRanksNamesRanksThatLeft(t *testing.T) {
	srv, secret := startServer(t, 3)
	c := joinAll(t, srv, secret, 3, nil)
	survivors := c[:2]
	if err := c[2].Close(); err != nil {
		t.Fatal(err)
	}
	for _, cl := range survivors {
		deadline := time.Now().Add(10 * time.Second)
		for len(cl.LostRanks()) == 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if got := cl.LostRanks(); !slices.Equal(got, []int{2}) {
			t.Fatalf("rank %d: LostRanks = %v after rank 2 closed its client, want [2]", cl.Rank(), got)
		}
		expectNoNotice(t, cl, 20*time.Millisecond)
	}
	subs := make([]*Client, 2)
	noErrors(t, onEveryRank(survivors, func(i int, cl *Client) error {
		var err error
		subs[i], err = cl.Shrink(context.Background(), cl.LostRanks())
		return err
	}))
	t.Cleanup(func() { closeAll(t, subs) })
	noErrors(t, onEveryRank(subs, func(_ int, sub *Client) error { return sub.Barrier(context.Background()) }))
}
