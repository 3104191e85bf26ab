package ibverbs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gccl/gccl/internal/leakcheck"
	"github.com/gccl/gccl/internal/logx"
	"github.com/gccl/gccl/internal/testutil"
	"github.com/gccl/gccl/internal/verbs"
	"github.com/gccl/gccl/transport"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// requireDevice skips the test where this host has no RDMA device (fails
// it under GCCL_TEST_REQUIRE_RDMA=1, as tests/rxe/run.sh sets in its VM).
func requireDevice(t testing.TB) {
	t.Helper()
	_, err := verbs.Devices()
	if err == nil {
		_, err = verbs.DeviceNames()
	}
	if err != nil && os.Getenv("GCCL_TEST_REQUIRE_RDMA") == "1" {
		t.Fatalf("GCCL_TEST_REQUIRE_RDMA=1, but: %v", err)
	}
	if errors.Is(err, verbs.ErrNotSupported) {
		err = fmt.Errorf("%w (tests/rxe/run.sh runs this test in a Soft-RoCE VM)", err)
	}
	testutil.SkipIfNotSupported(t, err)
}

// memStore is the job's key-value store, in memory.
type memStore struct {
	mu   sync.Mutex
	cond *sync.Cond
	m    map[string][]byte
}

func newMemStore() *memStore {
	s := &memStore{m: map[string][]byte{}}
	s.cond = sync.NewCond(&s.mu)
	return s
}

func (s *memStore) Set(_ context.Context, k string, v []byte) error {
	s.mu.Lock()
	s.m[k] = append([]byte(nil), v...)
	s.cond.Broadcast()
	s.mu.Unlock()
	return nil
}

func (s *memStore) Get(ctx context.Context, k string) ([]byte, error) {
	stop := context.AfterFunc(ctx, func() { s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock() })
	defer stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if v, ok := s.m[k]; ok {
			return v, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s.cond.Wait()
	}
}

// worldConfig describes an in-process job: n ranks, each "on its own host"
// (so that RDMA is expected), with env as every rank's environment (and
// envOf's additions per rank).
type worldConfig struct {
	n                   int
	slotSize, slotCount int
	env                 map[string]string
	envOf               func(rank int) map[string]string
}

type world struct {
	eps   []*Endpoint
	raw   []transport.Endpoint // what Connect returned
	bells []*transport.Doorbell
	logs  []*testutil.SyncBuffer
	errs  []error
}

// connectWorld connects the ranks of cfg through Listen, Reach and
// Connect, concurrently, as Init does; it fails t on any error unless
// allowErr, and closes every endpoint at the end of the test, checking
// that no verbs object is left.
func connectWorld(t *testing.T, cfg worldConfig, allowErr bool) *world {
	t.Helper()
	requireDevice(t)
	if cfg.slotSize == 0 {
		cfg.slotSize = 256 << 10
	}
	if cfg.slotCount == 0 {
		cfg.slotCount = 4
	}
	n := cfg.n
	fds := openFDs()
	store := newMemStore()
	w := &world{eps: make([]*Endpoint, n), raw: make([]transport.Endpoint, n), bells: make([]*transport.Doorbell, n),
		logs: make([]*testutil.SyncBuffer, n), errs: make([]error, n)}
	hosts, pids := make([]string, n), make([]int, n)
	for r := range n {
		hosts[r], pids[r] = fmt.Sprintf("host%d", r), 1000+r
	}
	job := fmt.Sprintf("test%d", time.Now().UnixNano())
	descs := make([]*transport.Descriptor, n)
	ls := make([]transport.Listener, n)
	setups := make([]transport.Setup, n)
	for r := range n {
		env := map[string]string{}
		for k, v := range cfg.env {
			env[k] = v
		}
		if cfg.envOf != nil {
			for k, v := range cfg.envOf(r) {
				env[k] = v
			}
		}
		var others []int
		for p := range n {
			if p != r {
				others = append(others, p)
			}
		}
		w.logs[r] = &testutil.SyncBuffer{}
		setups[r] = transport.Setup{JobID: job, Rank: r, Size: n, SlotSize: cfg.slotSize, SlotCount: cfg.slotCount,
			Hosts: hosts, Pids: pids, Unclaimed: others, Store: store,
			Getenv: func(k string) string { return env[k] }, Logger: logx.New(w.logs[r], "INFO", "")}
		l, err := ibTransport{}.Listen(context.Background(), &setups[r])
		require.NoError(t, err, "rank %d: Listen", r)
		require.NotNil(t, l, "rank %d: Listen found nothing to do", r)
		ls[r] = l
		descs[r] = transport.NewDescriptor(r, hosts[r], pids[r], map[string][]byte{Name: l.Addr()}, nil)
	}
	for r := range n {
		for p := range n {
			if p != r {
				require.True(t, reach(descs[r], descs[p]).OK, "rank %d cannot reach %d", r, p)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for r := range n {
		var peers []*transport.Descriptor
		for p := range n {
			if p != r {
				peers = append(peers, descs[p])
			}
		}
		w.bells[r] = transport.NewDoorbell()
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.raw[r], w.errs[r] = ls[r].Connect(ctx, w.bells[r], peers)
			if w.raw[r] != nil {
				w.eps[r] = w.raw[r].(*Endpoint)
			}
		}()
	}
	wg.Wait()
	for r, l := range ls {
		l.Release()
		if !allowErr {
			require.NoError(t, w.errs[r], "rank %d: Connect", r)
		}
	}
	t.Cleanup(func() {
		for r, ep := range w.eps {
			if ep != nil {
				require.NoError(t, ep.Close(), "rank %d: Close", r)
			}
		}
		require.Zero(t, verbs.Live().Total(), "verbs objects left: %v", verbs.Live())
		// The devices' and the completion channels' descriptors (and the
		// fallback's sockets) are closed too.
		deadline := time.Now().Add(5 * time.Second)
		for openFDs() > fds && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		require.LessOrEqual(t, openFDs(), fds, "file descriptors left open")
	})
	return w
}

// openFDs counts the process's open file descriptors.
func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	return len(ents)
}

const testTimeout = time.Minute

// pattern is the payload of message seq from src: n bytes that differ
// between messages and positions.
func pattern(src, seq, n int) []byte {
	b := make([]byte, n)
	x := uint32(src*7919 + seq*104729 + 1)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

// pump sends sizes[i]-byte messages to every peer and checks the same
// sequence from each, from one goroutine, as a rank's executor works:
// progress where it can, sleep on the endpoint when it cannot.
func pump(ep transport.Endpoint, peers []int, sizes []int) error {
	rank := ep.Rank()
	type link struct {
		s         transport.Sender
		r         transport.Receiver
		sent, got int
	}
	links := make([]*link, len(peers))
	for i, p := range peers {
		s, err := ep.Sender(p)
		if err != nil {
			return err
		}
		r, err := ep.Receiver(p)
		if err != nil {
			return err
		}
		links[i] = &link{s: s, r: r}
	}
	deadline := time.Now().Add(testTimeout)
	for {
		seen := ep.Seq()
		progress, done := false, true
		for i, l := range links {
			peer := peers[i]
			if l.sent < len(sizes) {
				done = false
				n := sizes[l.sent]
				b, ok, err := l.s.TryReserve(n)
				if err != nil {
					return fmt.Errorf("rank %d reserving message %d to %d: %w", rank, l.sent, peer, err)
				}
				if ok {
					copy(b, pattern(rank, l.sent, n))
					l.s.Commit(transport.MakeTag(uint8(rank+1), uint64(l.sent)))
					l.sent++
					progress = true
				}
			}
			if l.got < len(sizes) {
				done = false
				m, tag, ok, err := l.r.TryNext()
				if err != nil {
					return fmt.Errorf("rank %d waiting for message %d from %d: %w", rank, l.got, peer, err)
				}
				if ok {
					n := sizes[l.got]
					if want := transport.MakeTag(uint8(peer+1), uint64(l.got)); tag != want || !bytes.Equal(m, pattern(peer, l.got, n)) {
						return fmt.Errorf("rank %d message %d from %d: tag %#x, %d bytes; want tag %#x, %d bytes of the pattern",
							rank, l.got, peer, uint64(tag), len(m), uint64(want), n)
					}
					l.r.Release()
					l.got++
					progress = true
				}
			}
		}
		if done {
			return nil
		}
		if !progress {
			if err := ep.Wait(context.Background(), seen, deadline); err != nil {
				return fmt.Errorf("rank %d: %w", rank, err)
			}
		}
	}
}

// up connects every pair of w (a message each way), so that tests may look
// at the connections.
func (w *world) up(t *testing.T) {
	t.Helper()
	w.allPump(t, []int{1})
}

// waitUntil polls cond until it holds, failing t after testTimeout.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "timed out")
		time.Sleep(time.Millisecond)
	}
}

// allPump runs pump on every rank of w with every other rank.
func (w *world) allPump(t *testing.T, sizes []int) {
	t.Helper()
	require.NoError(t, errors.Join(w.pumpEach(sizes)...))
}

// pumpEach is allPump returning each rank's error.
func (w *world) pumpEach(sizes []int) []error {
	var wg sync.WaitGroup
	errs := make([]error, len(w.raw))
	for r, ep := range w.raw {
		var peers []int
		for p := range w.raw {
			if p != r {
				peers = append(peers, p)
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = pump(ep, peers, sizes)
		}()
	}
	wg.Wait()
	return errs
}
