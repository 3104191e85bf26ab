// A fake of NVIDIA's cuFile library (libcufile.so.0) for the tests of
// internal/cufile and of p2p's GPUDirect Storage path on machines without
// a GPU. It moves file bytes straight into the fake CUDA driver's device
// memory (internal/cuda/testdata/fakecuda.c maps it into the process, so a
// device address is a host address) and, like the real library, needs a
// current CUDA context on the calling thread: without one it fails with
// status FAKE_NO_CONTEXT. FAKECUFILE_NO_DRIVER=1 makes cuFileDriverOpen
// fail as it does where the nvidia-fs driver is missing.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

typedef struct { int err; int cu_err; } CUfileError_t;
typedef struct {
	int type;
	union { int fd; void *handle; } handle;
	const void *fs_ops;
} CUfileDescr_t;

enum { DRIVER_NOT_INITIALIZED = 5001, INVALID_VALUE = 5003, FAKE_NO_CONTEXT = 5099 };

static int opened;

CUfileError_t cuFileDriverOpen(void) {
	const char *no = getenv("FAKECUFILE_NO_DRIVER");
	if (no && no[0] == '1') return (CUfileError_t){DRIVER_NOT_INITIALIZED, 0};
	__atomic_add_fetch(&opened, 1, __ATOMIC_SEQ_CST);
	return (CUfileError_t){0, 0};
}

CUfileError_t cuFileDriverClose_v2(void) {
	if (__atomic_sub_fetch(&opened, 1, __ATOMIC_SEQ_CST) < 0) return (CUfileError_t){DRIVER_NOT_INITIALIZED, 0};
	return (CUfileError_t){0, 0};
}

struct handle { int fd; };

CUfileError_t cuFileHandleRegister(void **fh, CUfileDescr_t *d) {
	if (__atomic_load_n(&opened, __ATOMIC_SEQ_CST) <= 0) return (CUfileError_t){DRIVER_NOT_INITIALIZED, 0};
	if (!fh || !d || d->type != 1 || d->fs_ops || fcntl(d->handle.fd, F_GETFD) < 0) return (CUfileError_t){INVALID_VALUE, 0};
	struct handle *h = malloc(sizeof *h);
	if (!h) return (CUfileError_t){INVALID_VALUE, 0};
	h->fd = d->handle.fd;
	*fh = h;
	return (CUfileError_t){0, 0};
}

void cuFileHandleDeregister(void *fh) { free(fh); }

// has_context asks the fake driver (already loaded by the process, from
// GCCL_CUDA_LIBRARY or as libcuda.so.1) for the calling thread's context.
static int has_context(void) {
	const char *path = getenv("GCCL_CUDA_LIBRARY");
	if (!path || !path[0]) path = "libcuda.so.1";
	void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
	if (!lib) return 0;
	int (*get)(void **) = (int (*)(void **))dlsym(lib, "cuCtxGetCurrent");
	void *ctx = NULL;
	int ok = get && get(&ctx) == 0 && ctx != NULL;
	dlclose(lib);
	return ok;
}

ssize_t cuFileRead(void *fh, void *base, size_t n, off_t foff, off_t doff) {
	if (!has_context()) return -FAKE_NO_CONTEXT;
	struct handle *h = fh;
	size_t done = 0;
	while (done < n) {
		ssize_t k = pread(h->fd, (char *)base + doff + done, n - done, foff + done);
		if (k < 0) return -1; // errno set
		if (k == 0) break;
		done += k;
	}
	return done;
}

ssize_t cuFileWrite(void *fh, const void *base, size_t n, off_t foff, off_t doff) {
	if (!has_context()) return -FAKE_NO_CONTEXT;
	struct handle *h = fh;
	size_t done = 0;
	while (done < n) {
		ssize_t k = pwrite(h->fd, (const char *)base + doff + done, n - done, foff + done);
		if (k < 0) return -1;
		done += k;
	}
	return done;
}
