//go:build !linux || !cgo

package verbs

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Without cgo on Linux, every device call says why it cannot work.
func TestNotSupportedWithoutCgo(t *testing.T) {
	_, err := Open("mlx5_0")
	require.ErrorIs(t, err, ErrNotSupported)
	require.ErrorContains(t, err, "cgo off or not Linux")
	_, err = DeviceNames()
	require.ErrorIs(t, err, ErrNotSupported)
	var q *QP
	require.ErrorIs(t, q.PostSend(nil), ErrNotSupported)
	var cq *CQ
	_, err = cq.Poll(nil)
	require.ErrorIs(t, err, ErrNotSupported)
}
