package bootstrap

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// lossTimeout is the heartbeat timeout of the failure tests: short, so they
// run fast, yet long enough for a loaded 2-core machine under -race.
const lossTimeout = 500 * time.Millisecond

func TestAbruptCloseIsReportedAsLost(t *testing.T) {
	srv, secret := startServer(t, 3, WithHeartbeatTimeout(lossTimeout))
	c := joinAll(t, srv, secret, 3, nil)

	pending := make(chan error, 2)
	for _, cl := range c[:2] {
		go func() { pending <- cl.Barrier(context.Background()) }()
	}
	// Rank 2 vanishes without Close, as a crashed process would.
	start := time.Now()
	c[2].sess.conn.Close()

	for _, cl := range c[:2] {
		n := nextNotice(t, cl, 2*lossTimeout+2*time.Second)
		if n.Kind != NoticeRankLost || n.Rank != 2 || !strings.Contains(n.Reason, "heartbeat") {
			t.Fatalf("rank %d: notice %v, want rank 2 lost (heartbeat)", cl.Rank(), n)
		}
		if !strings.Contains(n.String(), "rank 2 lost") || !errors.Is(n.Err(), ErrRankLost) {
			t.Fatalf("notice text %q / error %v", n, n.Err())
		}
	}
	t.Logf("rank 2's loss reached the others after %v", time.Since(start))
	for range 2 {
		if err := <-pending; !errors.Is(err, ErrRankLost) || !strings.Contains(err.Error(), "rank 2") {
			t.Fatalf("Barrier pending when rank 2 died: %v, want ErrRankLost naming rank 2", err)
		}
	}
	// Later calls that need rank 2 fail at once rather than time out.
	if _, err := c[0].AllGather(context.Background(), nil); !errors.Is(err, ErrRankLost) {
		t.Fatalf("AllGather after rank 2 was lost: %v, want ErrRankLost", err)
	}
	if err := srv.Err(); !errors.Is(err, ErrRankLost) {
		t.Fatalf("Server.Err = %v, want ErrRankLost", err)
	}
}

func TestSilentRankIsReportedAsLost(t *testing.T) {
	srv, secret := startServer(t, 3, WithHeartbeatTimeout(lossTimeout))
	c := joinAll(t, srv, secret, 3, nil)
	// Rank 1 stays connected but stops beating, like a hung process.
	c[1].sess.heartbeatPaused.Store(true)
	for _, cl := range []*Client{c[0], c[2]} {
		n := nextNotice(t, cl, 2*lossTimeout+2*time.Second)
		if n.Kind != NoticeRankLost || n.Rank != 1 || !strings.Contains(n.Reason, "no heartbeat") {
			t.Fatalf("rank %d: notice %v, want rank 1 lost for silence", cl.Rank(), n)
		}
	}
	// The silent rank learns that it was given up on.
	n := nextNotice(t, c[1], 5*time.Second)
	if n.Kind != NoticeRankLost || n.Rank != 1 {
		t.Fatalf("silent rank's own notice: %v, want itself declared lost", n)
	}
	if err := c[1].Barrier(context.Background()); !errors.Is(err, ErrRankLost) {
		t.Fatalf("Barrier on a rank declared lost: %v, want ErrRankLost", err)
	}
}

func TestAbortNotifiesEveryRank(t *testing.T) {
	srv, secret := startServer(t, 3)
	c := joinAll(t, srv, secret, 3, nil)
	pending := make(chan error, 2)
	for _, cl := range c[:2] {
		go func() { pending <- cl.Barrier(context.Background()) }()
	}
	if err := c[2].Abort(context.Background(), "CUDA error: out of memory"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		err := <-pending
		if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "rank 2") || !strings.Contains(err.Error(), "out of memory") {
			t.Fatalf("Barrier pending during the abort: %v, want ErrAborted with rank and reason", err)
		}
	}
	for _, cl := range c[:2] {
		n := nextNotice(t, cl, 5*time.Second)
		if n.Kind != NoticeAbort || n.Rank != 2 || n.Reason != "CUDA error: out of memory" {
			t.Fatalf("rank %d: notice %v, want abort from rank 2", cl.Rank(), n)
		}
		if n.String() != "abort from rank 2: CUDA error: out of memory" || !errors.Is(n.Err(), ErrAborted) {
			t.Fatalf("notice text %q / error %v", n, n.Err())
		}
	}
	expectNoNotice(t, c[2], 200*time.Millisecond) // its own abort is not news to it
	if err := c[0].Set(context.Background(), "k", nil); !errors.Is(err, ErrAborted) {
		t.Fatalf("Set after the abort: %v, want ErrAborted", err)
	}
	if err := srv.Err(); !errors.Is(err, ErrAborted) {
		t.Fatalf("Server.Err = %v, want ErrAborted", err)
	}
}

func TestCleanCloseIsNotALoss(t *testing.T) {
	srv, secret := startServer(t, 3, WithHeartbeatTimeout(lossTimeout/2))
	c := joinAll(t, srv, secret, 3, nil)
	if err := c[2].Close(); err != nil {
		t.Fatal(err)
	}
	if n, ok := <-c[2].Lost(); ok {
		t.Fatalf("closed client's Lost channel is still open, holding %v", n)
	}
	if err := c[2].Barrier(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Barrier on a closed client: %v, want ErrClosed", err)
	}
	for _, cl := range c[:2] {
		expectNoNotice(t, cl, 3*lossTimeout/2) // three heartbeat timeouts
	}
	// A collective that needs the rank that left fails instead of hanging.
	if err := c[0].Barrier(context.Background()); !errors.Is(err, ErrRankLost) || !strings.Contains(err.Error(), "rank 2 left") {
		t.Fatalf("Barrier without the rank that left: %v, want ErrRankLost saying it left", err)
	}
	closeAll(t, c[:2])
	select {
	case <-srv.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Server.Done not closed after every rank left")
	}
	if err := srv.Err(); err != nil {
		t.Fatalf("Server.Err after clean leaves: %v", err)
	}
}

func TestNoGoroutineLeaks(t *testing.T) {
	check := checkGoroutines(t)

	// A healthy job with a split.
	secret := NewSecret()
	srv, err := NewServer("127.0.0.1:0", secret, 3, WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	clients := make([]*Client, 3)
	noErrors(t, onEveryRank(clients, func(r int, _ *Client) error {
		c, err := Join(context.Background(), testConfig(srv.Addr(), secret, r, 3))
		if err != nil {
			return err
		}
		clients[r] = c
		sub, err := c.Split(context.Background(), r%2, 0)
		if err != nil {
			return err
		}
		// A sub-client keeps the connection up until it closes too.
		defer sub.Close()
		if _, err := sub.AllGather(context.Background(), []byte("x")); err != nil {
			return err
		}
		if err := c.Set(context.Background(), "k", nil); err != nil {
			return err
		}
		return c.Barrier(context.Background())
	}))
	closeAll(t, clients)
	srv.Stop()

	// A job whose rendezvous stops under pending calls, with a rank that
	// vanished abruptly.
	srv, err = NewServer("127.0.0.1:0", secret, 3, WithLogger(quiet()), WithHeartbeatTimeout(lossTimeout))
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	noErrors(t, onEveryRank(clients, func(r int, _ *Client) error {
		var err error
		clients[r], err = Join(context.Background(), testConfig(srv.Addr(), secret, r, 3))
		return err
	}))
	clients[2].sess.conn.Close()
	nextNotice(t, clients[0], 5*time.Second)
	pending := make(chan error, 1)
	go func() { _, err := clients[1].Get(context.Background(), "never"); pending <- err }()
	time.Sleep(50 * time.Millisecond)
	srv.Stop()
	if err := <-pending; !errors.Is(err, ErrRendezvousLost) {
		t.Fatalf("Get pending at Stop: %v, want ErrRendezvousLost", err)
	}
	// Closed at once, before every client noticed the stop: Close must
	// not fail on the rendezvous being gone (it did, now and then, in CI).
	closeAll(t, clients)

	check()
}
