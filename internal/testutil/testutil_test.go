package testutil

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gccl/gccl/internal/errs"
)

// recorder is a testing.TB that records Skip and Fatal instead of ending
// the goroutine.
type recorder struct {
	testing.TB
	skipped, failed bool
}

func (r *recorder) Helper()               {}
func (r *recorder) Skipf(string, ...any)  { r.skipped = true }
func (r *recorder) Fatal(...any)          { r.failed = true }
func (r *recorder) Fatalf(string, ...any) { r.failed = true }

func TestSkipIfNotSupported(t *testing.T) {
	for _, c := range []struct {
		err           error
		skip, failure bool
	}{
		{nil, false, false},
		{fmt.Errorf("opening the device: %w", errs.New(errs.ErrNotSupported, "cuda: not supported on this system")), true, false},
		{errors.New("device busy"), false, true},
		{fmt.Errorf("%w: bad size", errs.ErrInvalidArgument), false, true},
	} {
		r := &recorder{TB: t}
		SkipIfNotSupported(r, c.err)
		require.Equal(t, c.skip, r.skipped, "skipped on %v", c.err)
		require.Equal(t, c.failure, r.failed, "failed on %v", c.err)
	}
}
