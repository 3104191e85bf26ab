package shm

import (
	"context"
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gccl/gccl/internal/spin"
	"github.com/gccl/gccl/transport"
)

// testDir is a private directory on tmpfs (like production), removed at
// the end of the test.
func testDir(tb testing.TB) string {
	tb.Helper()
	base := DefaultDir
	if st, err := os.Stat(base); err != nil || !st.IsDir() {
		base = ""
	}
	d, err := os.MkdirTemp(base, "gccl-shmtest-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// world creates n connected ranks in this process: each mailbox maps the
// others' files, exactly as separate processes would.
func world(tb testing.TB, n int, cfg Config) []*Endpoint {
	tb.Helper()
	if cfg.Dir == "" {
		cfg.Dir = testDir(tb)
	}
	mbs := make([]*Mailbox, n)
	for r := range mbs {
		var peers []int
		for p := 0; p < n; p++ {
			if p != r {
				peers = append(peers, p)
			}
		}
		mb, err := Create("job", r, n, peers, cfg)
		if err != nil {
			tb.Fatal(err)
		}
		mbs[r] = mb
	}
	eps := make([]*Endpoint, n)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for r, mb := range mbs {
		peers := map[int]Peer{}
		for p, pm := range mbs {
			if p != r {
				peers[p] = Peer{Name: pm.Name(), Pid: os.Getpid()}
			}
		}
		ep, err := mb.Connect(ctx, peers)
		if err != nil {
			tb.Fatal(err)
		}
		eps[r] = ep
		tb.Cleanup(func() { ep.Close() })
	}
	for _, mb := range mbs {
		if err := mb.Unlink(); err != nil {
			tb.Fatal(err)
		}
	}
	return eps
}

// testTimeout bounds every blocking helper, so a bug fails instead of hanging.
const testTimeout = 20 * time.Second

// send blocks until msg is committed to peer with tag. It waits like the
// executor: spin, yield, then sleep.
func send(ep *Endpoint, peer int, msg []byte, tag transport.Tag) error {
	s, err := ep.Sender(peer)
	if err != nil {
		return err
	}
	var deadline time.Time
	var bo backoff
	for {
		seen := ep.Seq()
		b, ok, err := s.TryReserve(len(msg))
		if err != nil {
			return err
		}
		if ok {
			copy(b, msg)
			s.Commit(tag)
			return nil
		}
		if err := wait(ep, seen, &bo, &deadline); err != nil {
			return err
		}
	}
}

// recv blocks until a message from peer arrives, copies it into buf and
// releases it.
func recv(ep *Endpoint, peer int, buf []byte) (int, transport.Tag, error) {
	r, err := ep.Receiver(peer)
	if err != nil {
		return 0, 0, err
	}
	var deadline time.Time
	var bo backoff
	for {
		seen := ep.Seq()
		m, tag, ok, err := r.TryNext()
		if err != nil {
			return 0, 0, err
		}
		if ok {
			n := copy(buf, m)
			r.Release()
			return n, tag, nil
		}
		if err := wait(ep, seen, &bo, &deadline); err != nil {
			return 0, 0, err
		}
	}
}

// wait spins, then sleeps with testTimeout as the deadline, read from the
// clock only once sleeping starts.
func wait(ep *Endpoint, seen uint64, bo *backoff, deadline *time.Time) error {
	if bo.Spin() {
		return nil
	}
	if deadline.IsZero() {
		*deadline = time.Now().Add(testTimeout)
	}
	return ep.Wait(context.Background(), seen, *deadline)
}

// backoff is spin.Backoff with a configurable poll interval: the transport
// is measured with a tight one (GCCL_SHM_TEST_PAUSE=1 pause per poll, the
// default), and can be measured with the executor's (=20, spin's
// pausePerRound). Both spin about as long before sleeping.
type backoff struct{ n int }

var pausesPerPoll = func() int {
	if n, err := strconv.Atoi(os.Getenv("GCCL_SHM_TEST_PAUSE")); err == nil && n > 0 {
		return n
	}
	return 1
}()

func (b *backoff) Reset() { b.n = 0 }

func (b *backoff) Spin() bool {
	b.n++
	polls := spin.PauseRounds * 20 / pausesPerPoll
	switch {
	case b.n <= polls:
		spin.Pause(pausesPerPoll)
		return true
	case b.n <= polls+spin.YieldRounds:
		runtime.Gosched()
		return true
	}
	return false
}

// fill writes message i's pattern; check verifies it.
func fill(b []byte, i int) {
	for j := range b {
		b[j] = byte(i*131 + j*7 + 1)
	}
}

func check(b []byte, i int) bool {
	for j := range b {
		if b[j] != byte(i*131+j*7+1) {
			return false
		}
	}
	return true
}

// wantPeerClosed checks that err is a PeerError naming peer that wraps
// ErrPeerClosed and, if text is not empty, mentions text.
func wantPeerClosed(tb testing.TB, err error, peer int, text string) {
	tb.Helper()
	var pe *transport.PeerError
	if !errors.As(err, &pe) || pe.Peer != peer || !errors.Is(err, transport.ErrPeerClosed) {
		tb.Fatalf("got %v, want a PeerError for rank %d wrapping ErrPeerClosed", err, peer)
	}
	if text != "" && !strings.Contains(err.Error(), text) {
		tb.Fatalf("error %q does not mention %q", err, text)
	}
}

// dirEntries lists dir's names.
func dirEntries(tb testing.TB, dir string) []string {
	tb.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}
