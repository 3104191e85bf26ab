package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/gccl/gccl/bootstrap/bootstrappb"
	"github.com/gccl/gccl/internal/testutil"
)

func TestWrongSecret(t *testing.T) {
	srv, _ := startServer(t, 2)
	cfg := testConfig(srv.Addr(), NewSecret(), 0, 2)
	_, err := Join(context.Background(), cfg)
	if !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("Join with another job's secret: %v, want ErrUnauthenticated", err)
	}
	if !strings.Contains(err.Error(), "wrong job secret") || !strings.Contains(err.Error(), "GCCL_SECRET") {
		t.Fatalf("message should say the secret is wrong and what to check: %v", err)
	}

	// Calls without any secret are refused too (raw client, no credentials).
	conn, err := grpc.NewClient("passthrough:///"+srv.Addr(), dialOptions("", insecure.NewCredentials())[0])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = pb.NewBootstrapClient(conn).Set(context.Background(), &pb.SetRequest{Rank: 0, Key: "k"})
	if !errors.Is(fromStatus(err), ErrUnauthenticated) {
		t.Fatalf("Set without a secret: %v, want ErrUnauthenticated", err)
	}
}

func TestMalformedSecretRejectedLocally(t *testing.T) {
	for _, secret := range []string{"", "abc", strings.Repeat("g", 32), strings.Repeat("a", 33)} {
		cfg := testConfig("127.0.0.1:1", secret, 0, 1)
		if _, err := Join(context.Background(), cfg); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("secret %q: %v, want ErrInvalidArgument", secret, err)
		}
	}
	if _, err := NewServer("127.0.0.1:0", "short", 1); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("NewServer with a short secret: %v, want ErrInvalidArgument", err)
	}
}

func TestVersionMismatch(t *testing.T) {
	srv, secret := startServer(t, 2)
	for _, tc := range []struct {
		name            string
		version         string
		protocol        int
		wantInMessage   []string
		wantNotAccepted bool
	}{
		{name: "library", version: "9.9.9-other", wantInMessage: []string{"rank 1", "9.9.9-other", Version}},
		{name: "protocol", protocol: ProtocolVersion + 1, wantInMessage: []string{"rank 1", fmt.Sprintf("protocol %d", ProtocolVersion+1), fmt.Sprintf("protocol %d", ProtocolVersion)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(srv.Addr(), secret, 1, 2)
			cfg.Version, cfg.Protocol = tc.version, tc.protocol
			_, err := Join(context.Background(), cfg)
			if !errors.Is(err, ErrVersionMismatch) {
				t.Fatalf("Join: %v, want ErrVersionMismatch", err)
			}
			for _, s := range tc.wantInMessage {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("message lacks %q: %v", s, err)
				}
			}
		})
	}
}

func TestJoinRejected(t *testing.T) {
	srv, secret := startServer(t, 2)

	// Size mismatch.
	_, err := Join(context.Background(), testConfig(srv.Addr(), secret, 0, 3))
	if !errors.Is(err, ErrJoinRejected) || !strings.Contains(err.Error(), "3 ranks") || !strings.Contains(err.Error(), "serves 2") {
		t.Fatalf("Join with size 3 into a 2-rank job: %v, want ErrJoinRejected naming both sizes", err)
	}

	// Rank out of range: Config validation stops it before any call, so ask
	// the server directly.
	conn, err := grpc.NewClient("passthrough:///"+srv.Addr(), dialOptions(secret, insecure.NewCredentials())...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = pb.NewBootstrapClient(conn).Join(context.Background(), &pb.JoinRequest{
		Rank: 5, Size: 2, LibraryVersion: Version, ProtocolVersion: ProtocolVersion, TimeoutMs: 1000,
	})
	if err = fromStatus(err); !errors.Is(err, ErrJoinRejected) || !strings.Contains(err.Error(), "rank 5") {
		t.Fatalf("server-side Join of rank 5 in a 2-rank job: %v, want ErrJoinRejected", err)
	}
	if _, err := Join(context.Background(), testConfig(srv.Addr(), secret, 2, 2)); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Config with rank 2 of 2: %v, want ErrInvalidArgument", err)
	}

	// Duplicate rank: rank 0 waits for rank 1; a second rank 0 is refused;
	// then rank 1 completes the job.
	first := make(chan error, 1)
	var firstClient *Client
	go func() {
		var err error
		firstClient, err = Join(context.Background(), testConfig(srv.Addr(), secret, 0, 2))
		first <- err
	}()
	waitFor(t, func() bool { srv.mu.Lock(); defer srv.mu.Unlock(); return srv.joined == 1 })
	_, err = Join(context.Background(), testConfig(srv.Addr(), secret, 0, 2))
	if !errors.Is(err, ErrJoinRejected) || !strings.Contains(err.Error(), "duplicate rank 0") {
		t.Fatalf("second rank 0: %v, want ErrJoinRejected for a duplicate rank", err)
	}
	second, err := Join(context.Background(), testConfig(srv.Addr(), secret, 1, 2))
	if err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	closeAll(t, []*Client{firstClient, second})
}

// waitFor polls cond for up to 5 s.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, 5*time.Second, "condition not reached", cond)
}

func TestJoinTimeoutNamesMissingRanks(t *testing.T) {
	srv, secret := startServer(t, 4)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, r := range []int{0, 2} {
		cfg := testConfig(srv.Addr(), secret, r, 4)
		cfg.Timeout = 300 * time.Millisecond
		wg.Go(func() { _, errs[i] = Join(context.Background(), cfg) })
	}
	wg.Wait()
	for _, err := range errs {
		if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "ranks 1, 3 have not joined") {
			t.Fatalf("Join without ranks 1 and 3: %v, want ErrTimeout naming them", err)
		}
	}
	// The ranks that gave up are free to join again.
	joinAll(t, srv, secret, 4, nil)
}

func TestJoinBeforeServerStarts(t *testing.T) {
	// Reserve a port, then start serving on it only after the ranks dialed.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	secret := NewSecret()
	var wg sync.WaitGroup
	clients := make([]*Client, 2)
	errs := make([]error, 2)
	for r := range 2 {
		wg.Go(func() { clients[r], errs[r] = Join(context.Background(), testConfig(addr, secret, r, 2)) })
	}
	time.Sleep(200 * time.Millisecond)
	srv, err := NewServer(addr, secret, 2, WithLogger(quiet()))
	if err != nil {
		t.Skipf("port %s was taken in between: %v", addr, err)
	}
	go srv.Serve()
	defer srv.Stop()
	wg.Wait()
	noErrors(t, errs)
	closeAll(t, clients)
}

func TestServerStoppedBeforeEveryoneJoined(t *testing.T) {
	srv, secret := startServer(t, 3)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := range 2 {
		wg.Go(func() { _, errs[r] = Join(context.Background(), testConfig(srv.Addr(), secret, r, 3)) })
	}
	waitFor(t, func() bool { srv.mu.Lock(); defer srv.mu.Unlock(); return srv.joined == 2 })
	start := time.Now()
	srv.Stop()
	wg.Wait()
	for r, err := range errs {
		if !errors.Is(err, ErrRendezvousLost) {
			t.Fatalf("rank %d: Join while the rendezvous stops: %v, want ErrRendezvousLost", r, err)
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("pending Joins took %v to fail after Stop", d)
	}
}

func TestServerStoppedDuringCollective(t *testing.T) {
	srv, secret := startServer(t, 3)
	c := joinAll(t, srv, secret, 3, nil)
	errs := make(chan error, 2)
	for _, cl := range c[:2] {
		go func() { errs <- cl.Barrier(context.Background()) }()
	}
	waitFor(t, func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		for _, r := range srv.rounds {
			return r.count == 2
		}
		return false
	})
	srv.Stop()
	for range 2 {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrRendezvousLost) {
				t.Fatalf("Barrier while the rendezvous stops: %v, want ErrRendezvousLost", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("pending Barrier did not fail within 5s of Stop")
		}
	}
	for _, cl := range c {
		if n := nextNotice(t, cl, 5*time.Second); n.Kind != NoticeRendezvousLost {
			t.Fatalf("rank %d: notice %v, want rendezvous lost", cl.Rank(), n)
		}
		if err := cl.Barrier(context.Background()); !errors.Is(err, ErrRendezvousLost) {
			t.Fatalf("Barrier after the rendezvous stopped: %v, want ErrRendezvousLost", err)
		}
	}
}

func TestServeInProcess(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	secret := NewSecret()
	const size = 3
	clients := make([]*Client, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		cfg := testConfig(addr, secret, r, size)
		cfg.Serve = r == 0
		wg.Go(func() { clients[r], errs[r] = Join(context.Background(), cfg) })
	}
	wg.Wait()
	noErrors(t, errs)
	noErrors(t, onEveryRank(clients, func(r int, c *Client) error {
		_, err := c.AllGather(context.Background(), []byte{byte(r)})
		return err
	}))

	// The serving rank's Close waits for the others to leave.
	closed := make(chan error, 1)
	go func() { closed <- clients[0].Close() }()
	select {
	case err := <-closed:
		t.Fatalf("serving rank's Close returned (%v) while other ranks were still in the job", err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := clients[1].Barrier(context.Background()); !errors.Is(err, ErrRankLost) {
		t.Fatalf("Barrier after rank 0 left: %v, want ErrRankLost (rank 0 left)", err)
	}
	closeAll(t, clients[1:])
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("serving rank's Close did not return after every rank left")
	}
}

func TestSecretIsCaseInsensitive(t *testing.T) {
	srv, secret := startServer(t, 1)
	c, err := Join(context.Background(), testConfig(srv.Addr(), strings.ToUpper(secret), 0, 1))
	if err != nil {
		t.Fatalf("Join with the secret in uppercase: %v", err)
	}
	if c.JobID() != DeriveJobID(secret) {
		t.Errorf("job ID %q, want the one derived from the lowercase secret", c.JobID())
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}
