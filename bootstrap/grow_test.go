package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/gccl/gccl/bootstrap/bootstrappb"
)

// growAll grows every member client to newSize while newcomers (their
// Configs' Rank and Size as given) join; it returns the grown clients of
// the members, then of the newcomers, and every call's error.
func growAll(members []*Client, newSize int, name string, newcomers []Config) ([]*Client, []error) {
	out := make([]*Client, len(members)+len(newcomers))
	errs := make([]error, len(out))
	var wg sync.WaitGroup
	for i, m := range members {
		wg.Go(func() { out[i], errs[i] = m.Grow(context.Background(), newSize, name) })
	}
	for j, cfg := range newcomers {
		i := len(members) + j
		wg.Go(func() {
			var got string
			out[i], got, errs[i] = JoinGrow(context.Background(), cfg)
			if errs[i] == nil && got != name {
				errs[i] = fmt.Errorf("newcomer %d learnt name %q, want %q", j, got, name)
			}
		})
	}
	wg.Wait()
	return out, errs
}

func newcomerConfig(addr, secret string, rank, size int) Config {
	cfg := testConfig(addr, secret, rank, size)
	return cfg
}

func TestGrowAfterShrink(t *testing.T) {
	srv, secret := startServer(t, 4, WithHeartbeatTimeout(lossTimeout))
	c := joinAll(t, srv, secret, 4, nil)
	survivors := []*Client{c[0], c[1], c[3]}
	c[2].sess.conn.Close() // rank 2 dies
	for _, cl := range survivors {
		if n := nextNotice(t, cl, 2*lossTimeout+2*time.Second); n.Rank != 2 {
			t.Fatalf("rank %d: notice %v, want rank 2 lost", cl.Rank(), n)
		}
	}
	subs := make([]*Client, 3)
	noErrors(t, onEveryRank(survivors, func(i int, cl *Client) error {
		var err error
		subs[i], err = cl.Shrink(context.Background(), []int{2})
		return err
	}))
	t.Cleanup(func() { closeAll(t, subs) })

	// A replacement takes the lost rank's place at the end: job rank 4,
	// rank 3 of the grown group.
	grown, errs := growAll(subs, 4, "job-x1-g1", []Config{newcomerConfig(srv.Addr(), secret, AnyRank, 4)})
	noErrors(t, errs)
	t.Cleanup(func() { closeAll(t, grown) })
	for i, g := range grown {
		if g.Rank() != i || g.Size() != 4 || !slices.Equal(g.JobRanks(), []int{0, 1, 3, 4}) {
			t.Fatalf("grown client %d: rank %d of %d, job ranks %v; want rank %d of 4, job ranks [0 1 3 4]", i, g.Rank(), g.Size(), g.JobRanks(), i)
		}
	}
	noErrors(t, onEveryRank(grown, func(i int, g *Client) error {
		all, err := g.AllGather(context.Background(), []byte{byte(10 + i)})
		if err != nil {
			return err
		}
		for r, b := range all {
			if len(b) != 1 || b[0] != byte(10+r) {
				return fmt.Errorf("AllGather of the grown group: %v", all)
			}
		}
		if err := g.Set(context.Background(), fmt.Sprint("k", i), []byte{byte(i)}); err != nil {
			return err
		}
		v, err := g.Get(context.Background(), fmt.Sprint("k", (i+1)%4))
		if err != nil || len(v) != 1 || v[0] != byte((i+1)%4) {
			return fmt.Errorf("Get of a peer's key in the grown group: %v, %v", v, err)
		}
		return g.Barrier(context.Background())
	}))
	// The newcomer hears of no old loss; the members' shrunk group is
	// still usable.
	for _, g := range grown {
		if got := g.LostRanks(); len(got) != 0 {
			t.Fatalf("grown rank %d: LostRanks = %v, want none", g.Rank(), got)
		}
		expectNoNotice(t, g, 20*time.Millisecond)
	}
	noErrors(t, onEveryRank(subs, func(_ int, s *Client) error { return s.Barrier(context.Background()) }))

	// The newcomer's loss reaches the others as any rank's does.
	grown[3].sess.conn.Close()
	nextNotice(t, grown[3], 2*lossTimeout+2*time.Second) // its own client notices
	for _, g := range grown[:3] {
		if n := nextNotice(t, g, 2*lossTimeout+2*time.Second); n.Kind != NoticeRankLost || n.Rank != 4 {
			t.Fatalf("grown rank %d: notice %v, want job rank 4 lost", g.Rank(), n)
		}
		if got := g.LostRanks(); !slices.Equal(got, []int{3}) {
			t.Fatalf("grown rank %d: LostRanks = %v, want [3]", g.Rank(), got)
		}
	}
}

func TestGrowHealthyJobWithNamedRanks(t *testing.T) {
	srv, secret := startServer(t, 2)
	c := joinAll(t, srv, secret, 2, nil)
	// Newcomers that name their ranks get them, whatever their order of
	// arrival; they may start before the members call Grow.
	grown, errs := growAll(c, 5, "n", []Config{
		newcomerConfig(srv.Addr(), secret, 4, 5),
		newcomerConfig(srv.Addr(), secret, 2, 5),
		newcomerConfig(srv.Addr(), secret, 3, 0),
	})
	noErrors(t, errs)
	t.Cleanup(func() { closeAll(t, grown) })
	wantRanks := []int{0, 1, 4, 2, 3}
	for i, g := range grown {
		if g.Rank() != wantRanks[i] || g.Size() != 5 {
			t.Fatalf("grown client %d: rank %d of %d, want %d of 5", i, g.Rank(), g.Size(), wantRanks[i])
		}
	}
	if jr := grown[0].JobRanks(); len(jr) != 5 || !slices.Equal(jr[:2], []int{0, 1}) {
		t.Fatalf("job ranks of the grown group: %v", jr)
	}
	noErrors(t, onEveryRank(grown, func(_ int, g *Client) error { return g.Barrier(context.Background()) }))
	// The job's group is untouched, and grows again.
	noErrors(t, onEveryRank(c, func(_ int, cl *Client) error { return cl.Barrier(context.Background()) }))
	again, errs := growAll(c, 3, "n2", []Config{newcomerConfig(srv.Addr(), secret, AnyRank, 0)})
	noErrors(t, errs)
	closeAll(t, again)
	if jr := again[2].JobRanks(); !slices.Equal(jr, []int{0, 1, 5}) {
		t.Fatalf("second grow: job ranks %v, want [0 1 5]", jr)
	}
}

func TestGrowSizesMustAgree(t *testing.T) {
	srv, secret := startServer(t, 2)
	c := joinAll(t, srv, secret, 2, nil)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, size := range []int{3, 4} {
		wg.Go(func() { _, errs[i] = c[i].Grow(context.Background(), size, "n") })
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, ErrMismatch) {
			t.Fatalf("rank %d: Grow with disagreeing sizes: %v, want ErrMismatch", i, err)
		}
	}
	if !strings.Contains(errs[0].Error(), "grows to 3") || !strings.Contains(errs[0].Error(), "grows to 4") {
		t.Fatalf("mismatch error does not name both sizes: %v", errs[0])
	}
	// A newcomer that asks for another size than the open grow's is
	// refused at once, naming both.
	done := make(chan error, 2)
	grown := make([]*Client, len(c))
	for i := range c {
		go func() {
			var err error
			grown[i], err = c[i].Grow(context.Background(), 3, "n")
			done <- err
		}()
	}
	waitOpenGrow(t, srv)
	_, _, err := JoinGrow(context.Background(), newcomerConfig(srv.Addr(), secret, AnyRank, 5))
	if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "grows to 3 ranks, not 5") {
		t.Fatalf("newcomer asking for 5 ranks of a grow to 3: %v, want ErrMismatch naming both", err)
	}
	_, _, err = JoinGrow(context.Background(), newcomerConfig(srv.Addr(), secret, 1, 3))
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "new ranks are 2..2") {
		t.Fatalf("newcomer asking for a member's rank: %v, want an error naming the new ranks", err)
	}
	nc, _, err := JoinGrow(context.Background(), newcomerConfig(srv.Addr(), secret, AnyRank, 3))
	if err != nil {
		t.Fatal(err)
	}
	for range c {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	closeAll(t, append(grown, nc))
}

// waitOpenGrow waits until a member opened a grow on srv.
func waitOpenGrow(t *testing.T, srv *Server) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		srv.mu.Lock()
		n := len(srv.grows.open)
		srv.mu.Unlock()
		if n > 0 {
			return
		}
	}
	t.Fatal("no grow opened")
}

func TestGrowTimeoutNamesWhoIsMissing(t *testing.T) {
	srv, secret := startServer(t, 3)
	c := joinAll(t, srv, secret, 3, func(cfg *Config) { cfg.Timeout = 300 * time.Millisecond })
	// Ranks 0 and 1 grow; rank 2 never calls, and no newcomer comes.
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() { _, errs[i] = c[i].Grow(context.Background(), 5, "n") })
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "members (job ranks) 2 have not called Grow") ||
			!strings.Contains(err.Error(), "2 of the 2 newcomers have not come") {
			t.Fatalf("rank %d: Grow without rank 2 and newcomers: %v, want a timeout naming both", i, err)
		}
	}
	// A newcomer with no grow open waits, then says so.
	cfg := newcomerConfig(srv.Addr(), secret, AnyRank, 0)
	cfg.Timeout = 200 * time.Millisecond
	if _, _, err := JoinGrow(context.Background(), cfg); !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "for a group to call Grow") {
		t.Fatalf("newcomer without a grow: %v, want a timeout saying no group called Grow", err)
	}
}

func TestGrowNewcomerWithWrongSecretRefused(t *testing.T) {
	srv, secret := startServer(t, 1)
	c := joinAll(t, srv, secret, 1, nil)
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, err := c[0].Grow(ctx, 2, "n")
		done <- err
	}()
	waitOpenGrow(t, srv)
	if _, _, err := JoinGrow(context.Background(), newcomerConfig(srv.Addr(), NewSecret(), AnyRank, 2)); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("newcomer with another job's secret: %v, want ErrUnauthenticated", err)
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("Grow that no newcomer joined succeeded")
	}
}

func TestGrowRefusesBadArguments(t *testing.T) {
	srv, secret := startServer(t, 2)
	c := joinAll(t, srv, secret, 2, nil)
	for _, tc := range []struct {
		size int
		name string
	}{{2, "n"}, {1, "n"}, {3, ""}, {3, "a/b"}, {maxGrowSize + 1, "n"}} {
		if _, err := c[0].Grow(context.Background(), tc.size, tc.name); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("Grow(%d, %q): %v, want ErrInvalidArgument", tc.size, tc.name, err)
		}
	}
	for _, tc := range []struct{ rank, size int }{{0, 3}, {3, 3}, {-2, 0}, {1, 1}} {
		if _, _, err := JoinGrow(context.Background(), newcomerConfig(srv.Addr(), secret, tc.rank, tc.size)); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("JoinGrow(rank %d, size %d): %v, want ErrInvalidArgument", tc.rank, tc.size, err)
		}
	}
	cfg := newcomerConfig(srv.Addr(), secret, AnyRank, 0)
	cfg.Serve = true
	if _, _, err := JoinGrow(context.Background(), cfg); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("serving newcomer: %v, want ErrInvalidArgument", err)
	}
}

func TestGrowFailsWhenAMemberIsLost(t *testing.T) {
	srv, secret := startServer(t, 3, WithHeartbeatTimeout(lossTimeout))
	c := joinAll(t, srv, secret, 3, nil)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() { _, errs[i] = c[i].Grow(context.Background(), 4, "n") })
	}
	waitOpenGrow(t, srv)
	c[2].sess.conn.Close() // a member dies before it calls Grow
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, ErrRankLost) || !strings.Contains(err.Error(), "member rank 2") {
			t.Fatalf("rank %d: Grow whose member died: %v, want ErrRankLost naming rank 2", i, err)
		}
	}
	// Its own client notices too before the test closes it.
	nextNotice(t, c[2], 2*lossTimeout+2*time.Second)
}

func TestNewcomerFromEnv(t *testing.T) {
	secret := NewSecret()
	lookup := func(vars map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	}
	cfg, err := newcomerFromEnv(lookup(map[string]string{"GCCL_BOOTSTRAP_ADDR": "h:1", "GCCL_SECRET": strings.ToUpper(secret), "GCCL_BOOTSTRAP_TIMEOUT": "7"}))
	if err != nil || cfg.Rank != AnyRank || cfg.Size != 0 || cfg.Addr != "h:1" || cfg.Secret != secret || cfg.JobID != DeriveJobID(secret) || cfg.Timeout != 7*time.Second {
		t.Fatalf("newcomer from address and secret: %+v, %v", cfg, err)
	}
	cfg, err = newcomerFromEnv(lookup(map[string]string{"GCCL_BOOTSTRAP_ADDR": "h:1", "GCCL_SECRET": secret, "GCCL_RANK": "3", "GCCL_SIZE": "4"}))
	if err != nil || cfg.Rank != 3 || cfg.Size != 4 {
		t.Fatalf("newcomer with rank and size: %+v, %v", cfg, err)
	}
	cfg, err = newcomerFromEnv(lookup(map[string]string{"GCCL_BOOTSTRAP_ADDR": "h:1", "GCCL_SECRET": secret, "GCCL_TLS": "1"}))
	if err != nil || !cfg.TLS {
		t.Fatalf("newcomer with GCCL_TLS=1: %+v, %v", cfg, err)
	}
	for _, vars := range []map[string]string{
		{"GCCL_SECRET": secret},
		{"GCCL_BOOTSTRAP_ADDR": "h:1"},
		{"GCCL_BOOTSTRAP_ADDR": "h", "GCCL_SECRET": secret},
		{"GCCL_BOOTSTRAP_ADDR": "h:1", "GCCL_SECRET": "xyz"},
		{"GCCL_BOOTSTRAP_ADDR": "h:1", "GCCL_SECRET": secret, "GCCL_RANK": "x"},
	} {
		if _, err := newcomerFromEnv(lookup(vars)); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("newcomer from %v: %v, want ErrInvalidArgument", vars, err)
		}
	}
}

// TestServerGrowRefusesHostileRequests: a member's Grow request is checked
// before the rendezvous allocates anything for it.
func TestServerGrowRefusesHostileRequests(t *testing.T) {
	srv, secret := startServer(t, 2)
	c := joinAll(t, srv, secret, 2, nil)
	for _, req := range []*pb.GrowRequest{
		{Rank: 0, Group: "w", Seq: 1, NewSize: 1 << 30, Name: "n"},
		{Rank: 0, Group: "w", Seq: 1, NewSize: 3, Name: "../x"},
		{Rank: 0, Group: "w", Seq: 1, NewSize: 3, Name: "n", Members: []int32{0, 0}},
		{Rank: 0, Group: "w", Seq: 1, NewSize: 3, Name: "n", Members: []int32{0, 7}},
		{Rank: 0, Group: "w", Seq: 1, NewSize: 3, Name: "n", Members: []int32{1}},
		{Rank: 0, Group: "", Seq: 1, NewSize: 3, Name: "n"},
		{Rank: 9, Group: "w", Seq: 1, NewSize: 3, Name: "n"},
	} {
		if _, err := c[0].sess.rpc.Grow(context.Background(), req); !errors.Is(fromStatus(err), ErrInvalidArgument) {
			t.Errorf("Grow %v: %v, want an invalid-argument refusal", req, err)
		}
	}
}
