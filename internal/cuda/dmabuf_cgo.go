//go:build linux && cgo

package cuda

/*
#include <stdint.h>
#include <stddef.h>

// cuMemGetHandleForAddressRange(void *handle, CUdeviceptr, size_t,
// CUmemRangeHandleType, unsigned long long flags); a dma-buf handle is an
// int file descriptor.
typedef struct { int fd; int r; } dmabuf_result;
static dmabuf_result c_dmabuf(void *f, uint64_t p, size_t n) {
	dmabuf_result res = {-1, 0};
	res.r = ((int (*)(void *, uint64_t, size_t, int, unsigned long long))f)(&res.fd, p, n, 1, 0);
	return res;
}
*/
import "C"

import "fmt"

// DmaBufFD exports n bytes of device memory at p (page-aligned, inside one
// allocation) as a dma-buf file descriptor (cuMemGetHandleForAddressRange,
// CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD), which an RDMA NIC registers with
// ibv_reg_dmabuf_mr for GPUDirect RDMA: offset 0 of the dma-buf is p. The
// caller closes the descriptor once the registration holds it. A driver
// without the call (older than CUDA 11.7) returns an error wrapping
// ErrNotSupported.
func (c *Context) DmaBufFD(p DevicePtr, n int) (int, error) {
	f := c.d.fn["cuMemGetHandleForAddressRange"]
	if f == nil {
		return -1, fmt.Errorf("%w: the driver has no cuMemGetHandleForAddressRange (CUDA 11.7 and a driver of R515 or later export device memory as dma-buf)", ErrNotSupported)
	}
	if n <= 0 {
		return -1, &Error{Call: "cuMemGetHandleForAddressRange", Result: ErrInvalidValue, Name: ErrInvalidValue.Name()}
	}
	var res C.dmabuf_result
	err := c.Do(func() error {
		res = C.c_dmabuf(f, C.uint64_t(p), C.size_t(n))
		return c.d.check("cuMemGetHandleForAddressRange", res.r)
	})
	if err != nil {
		return -1, err
	}
	return int(res.fd), nil
}
