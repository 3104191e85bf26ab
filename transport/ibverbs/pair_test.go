package ibverbs

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gccl/gccl/transport"
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
