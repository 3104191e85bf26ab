package verbs

import (
	"errors"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gccl/gccl/internal/errs"
)

func TestErrorTexts(t *testing.T) {
	e := &Error{Op: "ibv_post_send", Device: "mlx5_0", QPN: 0x1a2, Err: syscall.ENOMEM, Hint: "the queue is full"}
	require.Equal(t, "verbs: mlx5_0 QP 0x1a2: ibv_post_send: cannot allocate memory (the queue is full)", e.Error())
	require.ErrorIs(t, e, syscall.ENOMEM)
	require.Equal(t, "verbs: rxe0: ibv_alloc_pd: bad address", (&Error{Op: "ibv_alloc_pd", Device: "rxe0", Err: syscall.EFAULT}).Error())

	wc := WC{WRID: 9, Status: WCRetryExcErr, QPNum: 0x33, VendorErr: 0x81}
	err := wcError("mlx5_2", &wc)
	require.Equal(t, "verbs: mlx5_2 QP 0x33: work request 0x9 failed: transport retry counter exceeded (status 12, vendor error 0x81)", err.Error())
	require.False(t, errors.Is(err, ErrFlushed))
	wc.Status = WCFlushErr
	require.ErrorIs(t, wcError("mlx5_2", &wc), ErrFlushed)
	wc.Status = WCSuccess
	require.NoError(t, wcError("mlx5_2", &wc))

	pe := &PostError{Posted: 3, Err: e}
	require.ErrorIs(t, pe, syscall.ENOMEM)
	require.Contains(t, pe.Error(), "the first 3 work requests were posted, the rest not")

	// The package's sentinels are gccl's kinds.
	require.ErrorIs(t, ErrNotSupported, errs.ErrNotSupported)
	require.ErrorIs(t, ErrTimeout, errs.ErrTimeout)
	require.ErrorIs(t, ErrClosed, errs.ErrClosed)
	require.ErrorIs(t, ErrInvalidArgument, errs.ErrInvalidArgument)
}

// A registration refused for the locked-memory limit says the bytes, the
// limit and how to raise it.
func TestRegHint(t *testing.T) {
	h := regHint(uintptr(syscall.ENOMEM), 1<<30, 8<<20, false)
	require.Equal(t, "registering 1073741824 bytes pins them, and RLIMIT_MEMLOCK is 8388608 bytes: raise it with "+
		"`ulimit -l unlimited`, in a container `--ulimit memlock=-1`, or in /etc/security/limits.conf", h)
	require.Contains(t, regHint(uintptr(syscall.EPERM), 4096, 0, true), "RLIMIT_MEMLOCK is unlimited")
	require.Contains(t, regHint(uintptr(syscall.EFAULT), 4096, 0, true), "not mapped")
	require.Empty(t, regHint(uintptr(syscall.EINVAL), 4096, 0, true))

	var wc WC
	wc.Imm, wc.Flags = 0x11223344, WCWithImm
	wc.fixImm()
	require.Equal(t, uint32(0x44332211), wc.Imm)
	wc.Flags = 0
	wc.fixImm()
	require.Equal(t, uint32(0x44332211), wc.Imm, "no immediate: left alone")
}
