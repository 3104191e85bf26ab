//go:build linux && cgo

package verbs

/*
#include <errno.h>
#include "ibv_abi.h"

// ibv_reg_dmabuf_mr (rdma-core 34, IBVERBS_1.12), resolved apart from the
// other entry points so that an older library still loads.
static void *gvd_fn;
static void gvd_set(void *p) { gvd_fn = p; }
typedef struct { void *p; int err; } gvd_res;
static gvd_res gvd_reg(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova, int fd, int access) {
	errno = 0;
	gvd_res r = {((struct ibv_mr *(*)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int))gvd_fn)(pd, offset, len, iova, fd, access), 0};
	if (!r.p) r.err = errno ? errno : EIO;
	return r;
}
*/
import "C"

import (
	"fmt"
	"os"
	"sync"

	"github.com/gccl/gccl/internal/dl"
)

var dmabuf struct {
	once sync.Once
	err  error
}

// loadDmabuf resolves ibv_reg_dmabuf_mr once.
func loadDmabuf() error {
	if err := load(); err != nil {
		return err
	}
	dmabuf.once.Do(func() {
		path := os.Getenv("GCCL_IBVERBS_LIBRARY")
		if path == "" {
			path = DefaultLibrary
		}
		lib, err := dl.Open(path) // loaded already: the same handle, one more reference, kept
		if err != nil {
			dmabuf.err = fmt.Errorf("%w: %v", ErrNotSupported, err)
			return
		}
		p := lib.Sym("ibv_reg_dmabuf_mr")
		if p == nil {
			lib.Close()
			dmabuf.err = fmt.Errorf("%w: %s has no ibv_reg_dmabuf_mr (rdma-core 34 or later registers dma-buf memory)", ErrNotSupported, path)
			return
		}
		C.gvd_set(p)
	})
	return dmabuf.err
}

// RegisterDmabuf registers n bytes of a dma-buf (device memory exported by
// its driver, e.g. CUDA's cuMemGetHandleForAddressRange), starting offset
// bytes into it, as a memory region whose addresses start at iova: local
// SGEs and peers' RDMA operations name its bytes as [iova, iova+n)
// (ibv_reg_dmabuf_mr, the GPUDirect RDMA path of kernels and NICs that
// support it). The region holds its own reference to the dma-buf: the
// caller may close fd once this returns. A library without the call, or a
// device or kernel that refuses it (EOPNOTSUPP, EINVAL), is an error that
// says so; errors.Is(err, ErrNotSupported) holds for a missing call.
func (pd *PD) RegisterDmabuf(offset uint64, n int, iova uint64, fd int, access Access) (*MR, error) {
	if n <= 0 || fd < 0 {
		return nil, fmt.Errorf("%w: registering %d bytes of dma-buf descriptor %d", ErrInvalidArgument, n, fd)
	}
	if err := loadDmabuf(); err != nil {
		return nil, err
	}
	if err := pd.use(); err != nil {
		return nil, err
	}
	r := C.gvd_reg(pd.p, C.uint64_t(offset), C.size_t(n), C.uint64_t(iova), C.int(fd), C.int(access))
	if r.p == nil {
		e := &Error{Op: fmt.Sprintf("ibv_reg_dmabuf_mr of %d bytes at offset %#x of fd %d", n, offset, fd), Device: pd.ctx.name, Err: errno(C.int(r.err))}
		switch r.err {
		case C.EOPNOTSUPP, C.ENOSYS, C.EPROTONOSUPPORT:
			e.Hint = "the device or kernel does not register dma-buf memory (kernel 5.12 and a NIC driver with dma-buf support are needed)"
		}
		return nil, e
	}
	cm := (*C.struct_ibv_mr)(r.p)
	pd.adopt(1)
	live.mrs.Add(1)
	return &MR{pd: pd, m: cm, addr: iova, n: n, lkey: uint32(cm.lkey), rkey: uint32(cm.rkey)}, nil
}
