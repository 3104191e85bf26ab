package ibverbs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gccl/gccl/transport"
	"github.com/gccl/gccl/transport/tcp"
)

// flakyStore answers Get with its errors in turn, then with the value.
type flakyStore struct {
	errs []error
	gets int
}

func (s *flakyStore) Set(context.Context, string, []byte) error { return nil }

func (s *flakyStore) Get(ctx context.Context, _ string) ([]byte, error) {
	s.gets++
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(s.errs) > 0 {
		err := s.errs[0]
		s.errs = s.errs[1:]
		return nil, err
	}
	return []byte("v"), nil
}

// A set-up asks the store again while a read times out (the peer may use
// the pair much later than the store's timeout), gives up on any other
// error, and stops once the endpoint closes.
func TestStoreGetRetriesTimeouts(t *testing.T) {
	defer func(d time.Duration) { storeRetry = d }(storeRetry)
	storeRetry = time.Millisecond
	timeout := fmt.Errorf("gccl bootstrap: get \"k\": %w", transport.ErrTimeout)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	s := &flakyStore{errs: []error{timeout, timeout}}
	e := &Endpoint{store: s, setupCtx: ctx}
	b, err := e.storeGet("k")
	require.NoError(t, err)
	require.Equal(t, "v", string(b))
	require.Equal(t, 3, s.gets)

	lost := errors.New("rendezvous lost")
	s = &flakyStore{errs: []error{timeout, lost}}
	e.store = s
	_, err = e.storeGet("k")
	require.ErrorIs(t, err, lost)
	require.Equal(t, 2, s.gets)

	cancel()
	s = &flakyStore{errs: []error{timeout}}
	e.store = s
	_, err = e.storeGet("k")
	require.ErrorIs(t, err, context.Canceled)
}

// recordingStore is a memStore that checks, whenever a rank reads its
// peer's word that it recorded the failure, that the peer holds the cause:
// the reader may apply the failure (and exit) at once.
type recordingStore struct {
	*memStore
	eps   []*Endpoint
	reads chan error
}

func (s *recordingStore) Get(ctx context.Context, k string) ([]byte, error) {
	v, err := s.memStore.Get(ctx, k)
	var a, b int
	if rest, ok := strings.CutPrefix(k, "gccl-ib/j/recorded/"); ok && err == nil {
		if _, err := fmt.Sscanf(rest, "%d-%d", &a, &b); err != nil {
			s.reads <- fmt.Errorf("key %q: %v", k, err)
		} else if s.eps[a].SetupFailure(b) == nil {
			s.reads <- fmt.Errorf("rank %d read that rank %d recorded the failure, but rank %d holds none", b, a, a)
		} else {
			s.reads <- nil
		}
	}
	return v, err
}

// A pair that fails for good fails with its recorded error when the peer's
// word that it recorded the failure too cannot be read (the peer applied the
// failure and exited, taking the rendezvous it served); a pair that may move
// to TCP fails with the store's error.
func TestSettleAfterThePeerLeft(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lost := errors.New("gccl bootstrap: rendezvous unreachable: EOF")
	for _, strict := range []bool{true, false} {
		e := &Endpoint{rank: 1, size: 2, store: &flakyStore{errs: []error{lost}}, job: "j", setupCtx: ctx,
			o: options{strict: strict}, fallback: &tcp.Endpoint{}, setupFailures: make([]atomic.Pointer[error], 2)}
		x := exchange{c: &conn{e: e, peer: 0}}
		x.r.why = "on rank 0: modify to RTR: timed out"
		for _, step := range steps[3:] { // record, settle
			if !step(&x, e) {
				break
			}
		}
		require.Equal(t, "on rank 0: modify to RTR: timed out", x.r.why)
		if strict {
			require.NoError(t, x.r.err)
			err := e.SetupFailure(0)
			require.Error(t, err)
			require.Contains(t, err.Error(), "GCCL_STRICT=1 forbids a downgrade: rank 1 -> 0 via TCP instead of IB (on rank 0: modify to RTR")
			continue
		}
		require.ErrorIs(t, x.r.err, lost)
		require.Contains(t, x.r.err.Error(), "reading whether rank 0 recorded the outcome")
		require.Nil(t, e.SetupFailure(0))
	}
}

// A pair whose RDMA failed on one side only, and that may not move to TCP
// (GCCL_STRICT=1, or no fallback): both sides end with the failure recorded
// for SetupFailure before either can apply it, whichever side failed and
// however late the other side comes; a pair that moves to TCP records
// nothing, and an up pair skips the extra round.
func TestFailedPairRecordedOnBothSidesFirst(t *testing.T) {
	for _, c := range []struct {
		name   string
		strict bool
		want   string // in both sides' SetupFailure; "" for none
	}{
		{"strict", true, "GCCL_STRICT=1 forbids a downgrade: rank %d -> %d via TCP instead of IB ("},
		{"no fallback", false, "but this rank has no TCP fallback"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, late := range []int{0, 1} { // the rank that reaches the verdict last
				store := &recordingStore{memStore: newMemStore(), reads: make(chan error, 2)}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				eps := make([]*Endpoint, 2)
				for r := range eps {
					eps[r] = &Endpoint{rank: r, size: 2, store: store, job: "j", setupCtx: ctx,
						o: options{strict: c.strict}, setupFailures: make([]atomic.Pointer[error], 2)}
				}
				store.eps = eps
				// Rank 0's QPs failed to reach RTR; rank 1's connected.
				require.NoError(t, store.Set(ctx, readyKey("j", 0, 1), []byte("modify to RTR: timed out")))
				require.NoError(t, store.Set(ctx, readyKey("j", 1, 0), nil))
				done := make(chan exchange, 2)
				run := func(r int) {
					x := exchange{c: &conn{e: eps[r], peer: 1 - r}}
					if r == 0 {
						x.r.why = "modify to RTR: timed out"
					}
					for _, step := range steps[2:] {
						if !step(&x, eps[r]) {
							break
						}
					}
					done <- x
				}
				go run(1 - late)
				// The early rank must wait for the late one.
				select {
				case x := <-done:
					t.Fatalf("rank %d settled before its peer recorded the failure: %+v", x.c.e.rank, x.r)
				case <-time.After(20 * time.Millisecond):
				}
				go run(late)
				for range 2 {
					x := <-done
					require.NoError(t, x.r.err)
					require.NotEmpty(t, x.r.why)
				}
				for range 2 {
					require.NoError(t, <-store.reads)
				}
				for r, e := range eps {
					err := e.SetupFailure(1 - r)
					require.Error(t, err)
					want := c.want
					if c.strict {
						want = fmt.Sprintf(c.want, r, 1-r)
					}
					require.Contains(t, err.Error(), want)
					require.Nil(t, e.SetupFailure(r), "no pair with itself")
					require.Nil(t, e.SetupFailure(2), "no rank 2")
				}
			}
		})
	}
	t.Run("to TCP or up", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		store := newMemStore()
		e := &Endpoint{rank: 0, size: 2, store: store, job: "j", setupCtx: ctx,
			fallback: &tcp.Endpoint{}, setupFailures: make([]atomic.Pointer[error], 2)}
		require.NoError(t, store.Set(ctx, readyKey("j", 1, 0), []byte("no route")))
		require.NoError(t, store.Set(ctx, recordedKey("j", 1, 0), nil))
		x := exchange{c: &conn{e: e, peer: 1}}
		for _, step := range steps[2:] {
			if !step(&x, e) {
				break
			}
		}
		require.NoError(t, x.r.err)
		require.Equal(t, "on rank 1: no route", x.r.why)
		require.Nil(t, e.SetupFailure(1), "a pair that moves to TCP has not failed")

		// Up on both sides: the verdict ends the exchange, nothing recorded.
		store = newMemStore()
		e.store = store
		require.NoError(t, store.Set(ctx, readyKey("j", 1, 0), nil))
		x = exchange{c: &conn{e: e, peer: 1}}
		n := 0
		for _, step := range steps[2:] {
			n++
			if !step(&x, e) {
				break
			}
		}
		require.Equal(t, 1, n, "steps run for a pair that is up")
		require.Empty(t, x.r.why)
		_, recorded := store.m[recordedKey("j", 0, 1)]
		require.False(t, recorded)
	})
}
