//go:build linux && cgo

package cuda

import (
	"errors"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// DmaBufFD through the fake driver: the descriptor maps the allocation's
// bytes; the device attribute and the refusals of an unaligned range, a
// range inside an allocation (the fake's limit) and FAKECUDA_NO_DMABUF.
func TestDmaBufFD(t *testing.T) {
	fakeDriver(t)
	d, ctx := device0(t)
	ok, err := d.Attribute(0, AttrDmaBufSupported)
	require.NoError(t, err)
	require.Equal(t, 1, ok)
	p, err := ctx.Alloc(1 << 20)
	require.NoError(t, err)
	defer ctx.Free(p)
	want := make([]byte, 1<<20)
	for i := range want {
		want[i] = byte(i * 7)
	}
	require.NoError(t, ctx.CopyToDevice(p, want))
	fd, err := ctx.DmaBufFD(p, 1<<20)
	require.NoError(t, err)
	m, err := unix.Mmap(fd, 4096, 8192, unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	require.Equal(t, want[4096:4096+8192], m)
	unix.Munmap(m)
	syscall.Close(fd)

	_, err = ctx.DmaBufFD(p+1, 4096)
	require.ErrorIs(t, err, &Error{Result: ErrInvalidValue})
	_, err = ctx.DmaBufFD(p+4096, 4096)
	require.ErrorIs(t, err, &Error{Result: ErrInvalidValue})
	_, err = ctx.DmaBufFD(p, 0)
	require.Error(t, err)

	t.Setenv("FAKECUDA_NO_DMABUF", "1")
	ok, err = d.Attribute(0, AttrDmaBufSupported)
	require.NoError(t, err)
	require.Equal(t, 0, ok)
	_, err = ctx.DmaBufFD(p, 4096)
	require.ErrorIs(t, err, &Error{Result: 801})
	require.Contains(t, err.Error(), "cuMemGetHandleForAddressRange: CUDA_ERROR_NOT_SUPPORTED (801)")
}

// A driver without cuMemGetHandleForAddressRange (older than CUDA 11.7)
// still loads; DmaBufFD then says the driver lacks it.
func TestDmaBufFDWithoutTheCall(t *testing.T) {
	fakeDriver(t, "-DOMIT_DMABUF")
	_, ctx := device0(t)
	p, err := ctx.Alloc(4096)
	require.NoError(t, err)
	defer ctx.Free(p)
	fd, err := ctx.DmaBufFD(p, 4096)
	require.True(t, errors.Is(err, ErrNotSupported), "%v", err)
	require.Equal(t, -1, fd)
	require.Contains(t, err.Error(), "cuMemGetHandleForAddressRange")
}
