//go:build linux && cgo

package verbs

import (
	"errors"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// RegisterDmabuf on the real device: a memfd is not a dma-buf, so the
// kernel refuses it, and the error names the call and the device (Soft-RoCE
// in kernel 6.1 registers no dma-buf at all). Arguments are checked first.
func TestRegisterDmabufOnDevice(t *testing.T) {
	ctx, _, _ := device(t)
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	defer pd.Close()
	_, err = pd.RegisterDmabuf(0, 0, 0x1000, 3, AccessAll)
	require.ErrorIs(t, err, ErrInvalidArgument)
	fd, err := unix.MemfdCreate("not-a-dmabuf", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	defer syscall.Close(fd)
	require.NoError(t, unix.Ftruncate(fd, 1<<16))
	mr, err := pd.RegisterDmabuf(0, 1<<16, 0x10000, fd, AccessAll)
	if err == nil {
		mr.Close()
		t.Fatal("a memfd registered as a dma-buf")
	}
	t.Logf("%v", err)
	var e *Error
	if errors.Is(err, ErrNotSupported) {
		return // a library older than rdma-core 34
	}
	require.ErrorAs(t, err, &e)
	require.Equal(t, ctx.Name(), e.Device)
	require.Contains(t, e.Op, "ibv_reg_dmabuf_mr")
	require.Zero(t, Live().MRs)
}
