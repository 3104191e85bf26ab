// A fake CUDA driver for gccl's tests: it exports the entry points gccl
// resolves, with cuda.h's C signatures, so that everything above the driver
// runs for real on a machine without a GPU. It is built by the tests with
// gcc -shared (internal/cuda/cudatest).
//
//   - "Device memory" is host memory from memfd_create + mmap, so that an IPC
//     handle (the memfd's owner pid and fd) can be opened by another process
//     through /proc/<pid>/fd, as CUDA IPC maps one process's allocation into
//     another. Like the real driver, it refuses to open a handle in the
//     process that made it.
//   - The current context is per thread, as in the real driver: memory calls
//     made without one fail with CUDA_ERROR_INVALID_CONTEXT, which catches
//     calls made off the binding's locked OS thread.
//   - Streams and events exist as handles; every operation completes before
//     its call returns.
//   - Modules must be PTX text; cuModuleGetFunction finds only the kernels
//     the PTX declares (.entry), and cuLaunchKernel runs the same kernel
//     source compiled for the host (internal/kernels/hostemu.c), serially
//     over the grid. Built without -DGCCL_HOSTEMU, launches fail.
//   - Device 0 and 1 report compute capability 9.0 and 4 multiprocessors.
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef GCCL_HOSTEMU
#include "hostemu.c"
#endif

typedef int CUresult;
enum {
	OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, NO_DEVICE = 100,
	INVALID_DEVICE = 101, INVALID_CONTEXT = 201, INVALID_PTX = 218, INVALID_HANDLE = 400,
	NOT_FOUND = 500, LAUNCH_FAILED = 719,
};

static int inited;
static int ctxs[2];
static __thread void *cur; // the calling thread's current context

// Allocations: device memory (fd >= 0, owned) and opened IPC mappings.
struct alloc { uint64_t base; size_t size; int fd; int ipc; };
#define MAX_ALLOCS 4096
static struct alloc allocs[MAX_ALLOCS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static struct alloc *find(uint64_t p) {
	for (int i = 0; i < MAX_ALLOCS; i++)
		if (allocs[i].base && p >= allocs[i].base && p < allocs[i].base + allocs[i].size) return &allocs[i];
	return NULL;
}
static struct alloc *slot(void) {
	for (int i = 0; i < MAX_ALLOCS; i++)
		if (!allocs[i].base) return &allocs[i];
	return NULL;
}

CUresult cuInit(unsigned flags) {
	if (getenv("FAKECUDA_NO_DEVICE")) return NO_DEVICE;
	inited = 1;
	return OK;
}
CUresult cuDriverGetVersion(int *v) { *v = 12040; return OK; }
CUresult cuGetErrorName(CUresult r, const char **s) {
	switch (r) {
	case 1: *s = "CUDA_ERROR_INVALID_VALUE"; return OK;
	case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return OK;
	case 100: *s = "CUDA_ERROR_NO_DEVICE"; return OK;
	}
	return INVALID_VALUE; // unknown to this fake: the binding falls back to its table
}
CUresult cuDeviceGetCount(int *n) { if (!inited) return NOT_INITIALIZED; *n = 2; return OK; }
CUresult cuDeviceGet(int *d, int ordinal) { if (ordinal < 0 || ordinal >= 2) return INVALID_DEVICE; *d = ordinal; return OK; }
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
	switch (attr) {
	case 16: *v = 4; break;  // multiprocessors
	case 75: *v = 9; break;  // compute capability major
	case 76: *v = 0; break;  // minor
	case 33: *v = 0x3B + dev; break; // PCI bus
	default: *v = 0;
	}
	return OK;
}
CUresult cuDeviceGetPCIBusId(char *buf, int len, int dev) { snprintf(buf, len, "0000:%02X:00.0", 0x3B + dev); return OK; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { *ctx = &ctxs[dev]; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(int dev) { return OK; }
CUresult cuCtxSetCurrent(void *ctx) { cur = ctx; return OK; }
CUresult cuCtxSynchronize(void) { return cur ? OK : INVALID_CONTEXT; }

CUresult cuMemAlloc_v2(uint64_t *p, size_t n) {
	if (!cur) return INVALID_CONTEXT;
	if (n == 0) return INVALID_VALUE;
	if (n > ((size_t)1 << 30)) return OUT_OF_MEMORY;
	int fd = memfd_create("fakecuda", MFD_CLOEXEC);
	if (fd < 0) return OUT_OF_MEMORY;
	if (ftruncate(fd, n) != 0) { close(fd); return OUT_OF_MEMORY; }
	void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) { close(fd); return OUT_OF_MEMORY; }
	pthread_mutex_lock(&mu);
	struct alloc *a = slot();
	if (a) *a = (struct alloc){(uint64_t)(uintptr_t)m, n, fd, 0};
	pthread_mutex_unlock(&mu);
	if (!a) { munmap(m, n); close(fd); return OUT_OF_MEMORY; }
	*p = (uint64_t)(uintptr_t)m;
	return OK;
}
CUresult cuMemFree_v2(uint64_t p) {
	if (!cur) return INVALID_CONTEXT;
	pthread_mutex_lock(&mu);
	struct alloc *a = find(p);
	if (!a || a->base != p || a->ipc) { pthread_mutex_unlock(&mu); return INVALID_VALUE; }
	munmap((void *)(uintptr_t)a->base, a->size);
	close(a->fd);
	memset(a, 0, sizeof *a);
	pthread_mutex_unlock(&mu);
	return OK;
}
CUresult cuMemGetAddressRange_v2(uint64_t *base, size_t *size, uint64_t p) {
	if (!cur) return INVALID_CONTEXT;
	pthread_mutex_lock(&mu);
	struct alloc *a = find(p);
	if (a) { *base = a->base; *size = a->size; }
	pthread_mutex_unlock(&mu);
	return a ? OK : NOT_FOUND;
}

CUresult cuMemcpyHtoDAsync_v2(uint64_t dst, const void *src, size_t n, uintptr_t s) {
	if (!cur) return INVALID_CONTEXT;
	memcpy((void *)(uintptr_t)dst, src, n);
	return OK;
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, uint64_t src, size_t n, uintptr_t s) {
	if (!cur) return INVALID_CONTEXT;
	memcpy(dst, (void *)(uintptr_t)src, n);
	return OK;
}
CUresult cuMemcpyDtoDAsync_v2(uint64_t dst, uint64_t src, size_t n, uintptr_t s) {
	if (!cur) return INVALID_CONTEXT;
	memmove((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
	return OK;
}
CUresult cuMemsetD8Async(uint64_t dst, unsigned char v, size_t n, uintptr_t s) {
	if (!cur) return INVALID_CONTEXT;
	memset((void *)(uintptr_t)dst, v, n);
	return OK;
}
CUresult cuMemAllocHost_v2(void **p, size_t n) {
	if (!cur) return INVALID_CONTEXT;
	*p = malloc(n);
	return *p ? OK : OUT_OF_MEMORY;
}
CUresult cuMemFreeHost(void *p) { free(p); return OK; }
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags) { return cur ? OK : INVALID_CONTEXT; }
CUresult cuMemHostUnregister(void *p) { return cur ? OK : INVALID_CONTEXT; }

// Streams and events: handles only, since every operation is synchronous.
static uintptr_t next_handle = 1;
CUresult cuStreamCreate(uintptr_t *s, unsigned flags) {
	if (!cur) return INVALID_CONTEXT;
	*s = __atomic_fetch_add(&next_handle, 1, __ATOMIC_RELAXED);
	return OK;
}
CUresult cuStreamDestroy_v2(uintptr_t s) { return s ? OK : INVALID_HANDLE; }
CUresult cuStreamSynchronize(uintptr_t s) { return cur ? OK : INVALID_CONTEXT; }
CUresult cuStreamQuery(uintptr_t s) { return cur ? OK : INVALID_CONTEXT; }
CUresult cuStreamWaitEvent(uintptr_t s, uintptr_t e, unsigned flags) { return e ? OK : INVALID_HANDLE; }
CUresult cuEventCreate(uintptr_t *e, unsigned flags) { return cuStreamCreate(e, flags); }
CUresult cuEventRecord(uintptr_t e, uintptr_t s) { return e ? OK : INVALID_HANDLE; }
CUresult cuEventSynchronize(uintptr_t e) { return e ? OK : INVALID_HANDLE; }
CUresult cuEventQuery(uintptr_t e) { return e ? OK : INVALID_HANDLE; }
CUresult cuEventDestroy_v2(uintptr_t e) { return e ? OK : INVALID_HANDLE; }

// IPC handles: a magic, the owner's pid, the memfd, its inode and the
// size. The inode makes a handle name one allocation, as the real driver's
// do: a freed allocation's fd number may be reused for the next one, whose
// handle then differs, and opening a stale handle fails.
struct ipc_handle { char magic[16]; int32_t pid, fd; uint64_t size, ino; char pad[24]; };
typedef struct { char reserved[64]; } CUipcMemHandle;
static const char ipc_magic[16] = "fakecuda-ipc-v1";

CUresult cuIpcGetMemHandle(CUipcMemHandle *h, uint64_t p) {
	if (!cur) return INVALID_CONTEXT;
	pthread_mutex_lock(&mu);
	struct alloc *a = find(p);
	struct ipc_handle ih = {0};
	if (a && !a->ipc) {
		memcpy(ih.magic, ipc_magic, sizeof ih.magic);
		ih.pid = getpid();
		ih.fd = a->fd;
		ih.size = a->size;
		struct stat st;
		if (fstat(a->fd, &st) == 0) ih.ino = st.st_ino;
	}
	pthread_mutex_unlock(&mu);
	if (!a || a->ipc) return INVALID_VALUE;
	memcpy(h, &ih, sizeof ih);
	return OK;
}
CUresult cuIpcOpenMemHandle_v2(uint64_t *p, CUipcMemHandle h, unsigned flags) {
	if (!cur) return INVALID_CONTEXT;
	struct ipc_handle ih;
	memcpy(&ih, &h, sizeof ih);
	if (memcmp(ih.magic, ipc_magic, sizeof ih.magic) != 0) return INVALID_VALUE;
	if (ih.pid == getpid()) return INVALID_CONTEXT; // as the real driver: not in the exporting process
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/fd/%d", ih.pid, ih.fd);
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) return INVALID_VALUE;
	struct stat st;
	if (fstat(fd, &st) != 0 || st.st_ino != ih.ino) { close(fd); return INVALID_VALUE; } // freed since
	void *m = mmap(NULL, ih.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) { close(fd); return OUT_OF_MEMORY; }
	pthread_mutex_lock(&mu);
	struct alloc *a = slot();
	if (a) *a = (struct alloc){(uint64_t)(uintptr_t)m, ih.size, fd, 1};
	pthread_mutex_unlock(&mu);
	if (!a) { munmap(m, ih.size); close(fd); return OUT_OF_MEMORY; }
	*p = (uint64_t)(uintptr_t)m;
	return OK;
}
CUresult cuIpcCloseMemHandle(uint64_t p) {
	if (!cur) return INVALID_CONTEXT;
	pthread_mutex_lock(&mu);
	struct alloc *a = find(p);
	if (!a || !a->ipc || a->base != p) { pthread_mutex_unlock(&mu); return INVALID_VALUE; }
	munmap((void *)(uintptr_t)a->base, a->size);
	close(a->fd);
	memset(a, 0, sizeof *a);
	pthread_mutex_unlock(&mu);
	return OK;
}

// Modules: the .entry names of a PTX text.
#define MAX_ENTRIES 256
struct module { int n; char *names[MAX_ENTRIES]; };
struct function { int host; };

CUresult cuModuleLoadData(uintptr_t *m, const void *image) {
	if (!cur) return INVALID_CONTEXT;
	const char *s = image;
	if (!strstr(s, ".version") || !strstr(s, ".target")) return INVALID_PTX;
	struct module *mod = calloc(1, sizeof *mod);
	for (const char *e = strstr(s, ".entry "); e && mod->n < MAX_ENTRIES; e = strstr(e + 1, ".entry ")) {
		e += 7;
		size_t k = strcspn(e, "( \t\n");
		mod->names[mod->n++] = strndup(e, k);
	}
	*m = (uintptr_t)mod;
	return OK;
}
CUresult cuModuleUnload(uintptr_t m) {
	struct module *mod = (struct module *)m;
	if (!mod) return INVALID_HANDLE;
	for (int i = 0; i < mod->n; i++) free(mod->names[i]);
	free(mod);
	return OK;
}
CUresult cuModuleGetFunction(uintptr_t *f, uintptr_t m, const char *name) {
	struct module *mod = (struct module *)m;
	if (!cur) return INVALID_CONTEXT;
	if (!mod) return INVALID_HANDLE;
	for (int i = 0; i < mod->n; i++) {
		if (strcmp(mod->names[i], name) != 0) continue;
		struct function *fn = calloc(1, sizeof *fn);
#ifdef GCCL_HOSTEMU
		fn->host = gccl_host_kernel_find(name);
#else
		fn->host = -1;
#endif
		*f = (uintptr_t)fn;
		return OK;
	}
	return NOT_FOUND;
}
#ifndef OMIT_LAUNCH
CUresult cuLaunchKernel(uintptr_t f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, uintptr_t s, void **params, void **extra) {
	struct function *fn = (struct function *)f;
	if (!cur) return INVALID_CONTEXT;
	if (!fn) return INVALID_HANDLE;
	if (gx == 0 || bx == 0 || bx > 1024 || gy != 1 || gz != 1 || by != 1 || bz != 1 || !params) return INVALID_VALUE;
	if (fn->host < 0) return LAUNCH_FAILED;
#ifdef GCCL_HOSTEMU
	gccl_host_kernel_launch(fn->host, gx, bx, params);
#endif
	return OK;
}
#endif
