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
//   - Streams run asynchronously, as on a GPU: each stream made by
//     cuStreamCreate has a worker thread that runs its queued copies,
//     memsets, kernel launches, event records, value writes and waits in
//     order, after the call that queued them returned.
//     FAKECUDA_STREAM_DELAY_US, read when a stream is made, delays every
//     operation queued on it but the waits, so that a missing
//     synchronization shows as wrong data rather than passing by luck;
//     with FAKECUDA_STREAM_JITTER=1 each delay is drawn from [0, twice
//     it), differently in each process, so that streams of different
//     processes do not run in step either.
//     The legacy default stream (0) runs its work before the call returns.
//     cuMemFree, cuMemFreeHost, cuMemHostUnregister and cuIpcCloseMemHandle
//     first wait for every stream, as the real driver's frees synchronize.
//   - cuStreamWaitValue32_v2 makes a stream wait for a 32-bit word of host
//     memory (cuMemHostAlloc or cuMemHostRegister, then
//     cuMemHostGetDevicePointer_v2, which returns the host address: unified
//     addressing) that the host writes; cuStreamWriteValue32_v2 stores such
//     a word when the stream reaches it, after a full fence (the default
//     flags' memory barrier), so the stream's earlier work is visible
//     first; cuStreamBatchMemOp_v2 queues such waits and writes in order,
//     refusing the whole batch if one is wrong. Built with
//     -DOMIT_WRITE_VALUE, the library lacks cuStreamWriteValue32_v2 and
//     cuStreamBatchMemOp_v2, as drivers before CUDA 11.7 do.
//   - cuMemHostRegister_v2 refuses a range that overlaps one already
//     registered or pinned (CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED), as
//     the real driver does: a range registers once per process.
//   - Modules are PTX text or cubins (64-bit ELF for EM_CUDA);
//     cuModuleGetFunction finds only the kernels the PTX declares (.entry)
//     or the cubin defines (STT_FUNC symbols), and cuLaunchKernel runs the same kernel
//     source compiled for the host (internal/kernels/hostemu.c), serially
//     over the grid. Built without -DGCCL_HOSTEMU, launches fail.
//   - Device 0 and 1 report compute capability 9.0 and 4 multiprocessors,
//     and MPS (CU_DEVICE_ATTRIBUTE_MPS_ENABLED) only with FAKECUDA_MPS=1.
//   - cuMemGetHandleForAddressRange exports an allocation as a "dma-buf": a
//     duplicate of its memfd, so a fake verbs library can map it at the
//     offset ibv_reg_dmabuf_mr names. Offset 0 of the real driver's dma-buf is
//     the range's start; the fake's is the allocation's, so it takes ranges
//     that start at an allocation's base only. FAKECUDA_NO_DMABUF=1 (read at
//     each call) makes the device say it has no dma-buf support, as drivers
//     before R515 do.
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
	NOT_FOUND = 500, NOT_READY = 600, LAUNCH_FAILED = 719,
};

static int inited;
static int ctxs[2];
static __thread void *cur; // the calling thread's current context

// Allocations: device memory (fd >= 0, owned) and opened IPC mappings.
struct alloc { uint64_t base; size_t size; int fd; int ipc; int dev; };
#define MAX_ALLOCS 4096
static struct alloc allocs[MAX_ALLOCS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static struct alloc *find(uint64_t p) {
	for (int i = 0; i < MAX_ALLOCS; i++)
		if (allocs[i].base && p >= allocs[i].base && p < allocs[i].base + allocs[i].size) return &allocs[i];
	return NULL;
}
// The device of the calling thread's current context.
static int cur_dev(void) { return (int)((int *)cur - ctxs); }
static struct alloc *slot(void) {
	for (int i = 0; i < MAX_ALLOCS; i++)
		if (!allocs[i].base) return &allocs[i];
	return NULL;
}

// Streams and events.
//
// An event counts its records: cuEventRecord takes the next generation, and
// the record operation, when its stream reaches it, marks that generation
// done. Waiting for an event waits for the generation recorded last when
// the wait was asked for, as the real driver does.
struct event { uint64_t recorded, done; };
static pthread_mutex_t evmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t evcv = PTHREAD_COND_INITIALIZER;

enum { OP_COPY, OP_SET, OP_LAUNCH, OP_RECORD, OP_WAIT_EVENT, OP_WAIT_VALUE, OP_WRITE_VALUE };
struct op {
	struct op *next;
	int kind;
	void *dst;
	const void *src;
	size_t n;
	unsigned char v;
	int fn;
	unsigned gx, bx;
#ifdef GCCL_HOSTEMU
	struct gccl_reduce_args arg; // the driver copies kernel parameters at launch
#endif
	struct event *ev;
	uint64_t gen;
	volatile uint32_t *word;
	uint32_t value;
	unsigned flags;
};
struct stream {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct op *head, *tail;
	uint64_t queued, done;
	int quit;
	long delay_us; // FAKECUDA_STREAM_DELAY_US when the stream was made
	int jitter;    // FAKECUDA_STREAM_JITTER=1: each delay drawn from [0, 2*delay_us)
	unsigned seed;
	pthread_t thr;
	struct stream *next;
};
static struct stream *streams; // every live stream, under mu

static void event_done(struct event *e, uint64_t gen) {
	pthread_mutex_lock(&evmu);
	if (gen > e->done) e->done = gen;
	pthread_cond_broadcast(&evcv);
	pthread_mutex_unlock(&evmu);
}
static void event_wait(struct event *e, uint64_t gen) {
	pthread_mutex_lock(&evmu);
	while (e->done < gen) pthread_cond_wait(&evcv, &evmu);
	pthread_mutex_unlock(&evmu);
}
// value_ok is cuStreamWaitValue32's test: GEQ (0, in wrapping order), EQ
// (1), AND (2), NOR (3).
static int value_ok(uint32_t have, uint32_t want, unsigned flags) {
	switch (flags & 3) {
	case 0: return (int32_t)(have - want) >= 0;
	case 1: return have == want;
	case 2: return (have & want) != 0;
	default: return ~(have | want) != 0;
	}
}
static void run_op(struct op *o) {
	switch (o->kind) {
	case OP_COPY: memmove(o->dst, o->src, o->n); break;
	case OP_SET: memset(o->dst, o->v, o->n); break;
	case OP_LAUNCH: {
#ifdef GCCL_HOSTEMU
		void *params[1] = {&o->arg};
		gccl_host_kernel_launch(o->fn, o->gx, o->bx, params);
#endif
		break;
	}
	case OP_RECORD: event_done(o->ev, o->gen); break;
	case OP_WAIT_EVENT: event_wait(o->ev, o->gen); break;
	case OP_WAIT_VALUE:
		while (!value_ok(__atomic_load_n(o->word, __ATOMIC_ACQUIRE), o->value, o->flags)) usleep(20);
		break;
	case OP_WRITE_VALUE:
		// The earlier ops' writes (memmove, memset, kernels) are plain
		// stores: the fence orders them before the word's, as the real
		// driver's barrier does.
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
		__atomic_store_n(o->word, o->value, __ATOMIC_RELEASE);
		break;
	}
}
static void *stream_main(void *arg) {
	struct stream *st = arg;
	pthread_mutex_lock(&st->mu);
	for (;;) {
		while (!st->head && !st->quit) pthread_cond_wait(&st->cv, &st->mu);
		if (!st->head) break;
		struct op *o = st->head;
		pthread_mutex_unlock(&st->mu);
		if (st->delay_us > 0 && o->kind != OP_WAIT_EVENT && o->kind != OP_WAIT_VALUE)
			usleep(st->jitter ? (useconds_t)(rand_r(&st->seed) % (2 * st->delay_us)) : (useconds_t)st->delay_us);
		run_op(o);
		pthread_mutex_lock(&st->mu);
		st->head = o->next;
		if (!st->head) st->tail = NULL;
		st->done++;
		pthread_cond_broadcast(&st->cv);
		free(o);
	}
	pthread_mutex_unlock(&st->mu);
	return NULL;
}
// submit queues o on stream s, or runs it now on the legacy default stream.
static CUresult submit(uintptr_t s, struct op *o) {
	if (!s) {
		run_op(o);
		free(o);
		return OK;
	}
	struct stream *st = (struct stream *)s;
	o->next = NULL;
	pthread_mutex_lock(&st->mu);
	if (st->tail) st->tail->next = o; else st->head = o;
	st->tail = o;
	st->queued++;
	pthread_cond_broadcast(&st->cv);
	pthread_mutex_unlock(&st->mu);
	return OK;
}
static struct op *new_op(int kind) {
	struct op *o = calloc(1, sizeof *o);
	if (o) o->kind = kind;
	return o;
}
static void stream_sync(struct stream *st) {
	pthread_mutex_lock(&st->mu);
	uint64_t target = st->queued;
	while (st->done < target) pthread_cond_wait(&st->cv, &st->mu);
	pthread_mutex_unlock(&st->mu);
}
// sync_all waits for the work queued on every stream so far.
static void sync_all(void) {
	pthread_mutex_lock(&mu);
	int n = 0;
	for (struct stream *st = streams; st; st = st->next) n++;
	struct stream **all = calloc(n ? n : 1, sizeof *all);
	n = 0;
	for (struct stream *st = streams; st; st = st->next) all[n++] = st;
	pthread_mutex_unlock(&mu);
	// Streams are never freed (cuStreamDestroy), so the pointers stay valid.
	for (int i = 0; i < n; i++) stream_sync(all[i]);
	free(all);
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
// devices is how many GPUs the fake has: 2, or 1 with FAKECUDA_DEVICES=1
// (to rehearse what runs on a one-GPU machine).
static int devices(void) {
	const char *n = getenv("FAKECUDA_DEVICES");
	return n && n[0] == '1' && !n[1] ? 1 : 2;
}
CUresult cuDeviceGetCount(int *n) { if (!inited) return NOT_INITIALIZED; *n = devices(); return OK; }
CUresult cuDeviceGet(int *d, int ordinal) { if (ordinal < 0 || ordinal >= devices()) return INVALID_DEVICE; *d = ordinal; return OK; }
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
	switch (attr) {
	case 16: *v = 4; break;  // multiprocessors
	case 75: *v = 9; break;  // compute capability major
	case 76: *v = 0; break;  // minor
	case 33: *v = 0x3B + dev; break; // PCI bus
	case 124: { const char *e = getenv("FAKECUDA_NO_DMABUF"); *v = !(e && e[0] == '1'); break; } // dma-buf supported
	case 133: { const char *e = getenv("FAKECUDA_MPS"); *v = e && e[0] == '1'; break; } // MPS
	default: *v = 0;
	}
	return OK;
}
CUresult cuDeviceGetPCIBusId(char *buf, int len, int dev) { snprintf(buf, len, "0000:%02X:00.0", 0x3B + dev); return OK; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { *ctx = &ctxs[dev]; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(int dev) { return OK; }
CUresult cuCtxSetCurrent(void *ctx) { cur = ctx; return OK; }
// Not one of gccl's entry points: the fake cuFile library (internal/cufile)
// asks it, as the real one needs a current context.
CUresult cuCtxGetCurrent(void **ctx) { *ctx = cur; return OK; }

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
	if (a) *a = (struct alloc){(uint64_t)(uintptr_t)m, n, fd, 0, cur_dev()};
	pthread_mutex_unlock(&mu);
	if (!a) { munmap(m, n); close(fd); return OUT_OF_MEMORY; }
	*p = (uint64_t)(uintptr_t)m;
	return OK;
}
CUresult cuMemFree_v2(uint64_t p) {
	if (!cur) return INVALID_CONTEXT;
	sync_all();
	pthread_mutex_lock(&mu);
	struct alloc *a = find(p);
	if (!a || a->base != p || a->ipc) { pthread_mutex_unlock(&mu); return INVALID_VALUE; }
	munmap((void *)(uintptr_t)a->base, a->size);
	close(a->fd);
	memset(a, 0, sizeof *a);
	pthread_mutex_unlock(&mu);
	return OK;
}
#ifndef OMIT_DMABUF
CUresult cuMemGetHandleForAddressRange(void *handle, uint64_t p, size_t n, int type, unsigned long long flags) {
	if (!cur) return INVALID_CONTEXT;
	const char *e = getenv("FAKECUDA_NO_DMABUF");
	if (e && e[0] == '1') return 801; // CUDA_ERROR_NOT_SUPPORTED
	if (type != 1 || flags != 0 || n == 0 || p % 4096 != 0) return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	struct alloc *a = find(p);
	int fd = -1;
	if (a && !a->ipc && a->base == p && n <= ((a->size + 4095) & ~(size_t)4095)) fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
	pthread_mutex_unlock(&mu);
	if (fd < 0) return INVALID_VALUE;
	*(int *)handle = fd;
	return OK;
}
#endif
CUresult cuMemGetAddressRange_v2(uint64_t *base, size_t *size, uint64_t p) {
	if (!cur) return INVALID_CONTEXT;
	pthread_mutex_lock(&mu);
	struct alloc *a = find(p);
	if (a) { *base = a->base; *size = a->size; }
	pthread_mutex_unlock(&mu);
	return a ? OK : NOT_FOUND;
}

static CUresult queue_copy(void *dst, const void *src, size_t n, uintptr_t s) {
	if (!cur) return INVALID_CONTEXT;
	struct op *o = new_op(OP_COPY);
	if (!o) return OUT_OF_MEMORY;
	o->dst = dst;
	o->src = src;
	o->n = n;
	return submit(s, o);
}
CUresult cuMemcpyHtoDAsync_v2(uint64_t dst, const void *src, size_t n, uintptr_t s) {
	return queue_copy((void *)(uintptr_t)dst, src, n, s);
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, uint64_t src, size_t n, uintptr_t s) {
	return queue_copy(dst, (const void *)(uintptr_t)src, n, s);
}
CUresult cuMemcpyDtoDAsync_v2(uint64_t dst, uint64_t src, size_t n, uintptr_t s) {
	return queue_copy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, s);
}
CUresult cuMemsetD8Async(uint64_t dst, unsigned char v, size_t n, uintptr_t s) {
	if (!cur) return INVALID_CONTEXT;
	struct op *o = new_op(OP_SET);
	if (!o) return OUT_OF_MEMORY;
	o->dst = (void *)(uintptr_t)dst;
	o->v = v;
	o->n = n;
	return submit(s, o);
}
// Pinned host memory: allocated here or registered, kept in a table of its
// own for cuPointerGetAttribute.
#define MAX_HOST 1024
static struct { void *p; size_t n; int dev; } hosts[MAX_HOST];
static void host_track(void *p, size_t n) {
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAX_HOST; i++)
		if (!hosts[i].p) { hosts[i].p = p, hosts[i].n = n, hosts[i].dev = cur_dev(); break; }
	pthread_mutex_unlock(&mu);
}
static void host_untrack(void *p) {
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAX_HOST; i++)
		if (hosts[i].p == p) hosts[i].p = NULL;
	pthread_mutex_unlock(&mu);
}
CUresult cuMemAllocHost_v2(void **p, size_t n) {
	if (!cur) return INVALID_CONTEXT;
	*p = malloc(n);
	if (!*p) return OUT_OF_MEMORY;
	host_track(*p, n);
	return OK;
}
CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags) { return cuMemAllocHost_v2(p, n); }
CUresult cuMemHostGetDevicePointer_v2(uint64_t *d, void *p, unsigned flags) {
	if (!cur) return INVALID_CONTEXT;
	if (!p || flags) return INVALID_VALUE;
	*d = (uint64_t)(uintptr_t)p; // unified addressing: the same address
	return OK;
}
CUresult cuMemFreeHost(void *p) { sync_all(); host_untrack(p); free(p); return OK; }
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags) {
	if (!cur) return INVALID_CONTEXT;
	// As the real driver: a range registers once per process.
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAX_HOST; i++) {
		char *h = hosts[i].p;
		if (h && (char *)p < h + hosts[i].n && h < (char *)p + n) {
			pthread_mutex_unlock(&mu);
			return 712; // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
		}
	}
	pthread_mutex_unlock(&mu);
	host_track(p, n);
	return OK;
}
CUresult cuMemHostUnregister(void *p) {
	if (!cur) return INVALID_CONTEXT;
	sync_all();
	host_untrack(p);
	return OK;
}

// cuPointerGetAttribute answers the memory type (CU_MEMORYTYPE_HOST 1,
// DEVICE 2), the device ordinal and the allocation's range, as an unsigned,
// an int, a CUdeviceptr and a size_t.
CUresult cuPointerGetAttribute(void *data, int attr, uint64_t p) {
	uint64_t base = 0, size = 0;
	int type = 0, dev = 0;
	pthread_mutex_lock(&mu);
	struct alloc *a = find(p);
	if (a) base = a->base, size = a->size, type = 2, dev = a->dev;
	for (int i = 0; !a && i < MAX_HOST; i++) {
		uint64_t h = (uint64_t)(uintptr_t)hosts[i].p;
		if (h && p >= h && p < h + hosts[i].n) { base = h, size = hosts[i].n, type = 1, dev = hosts[i].dev; break; }
	}
	pthread_mutex_unlock(&mu);
	if (!type) return INVALID_VALUE;
	switch (attr) {
	case 2: *(unsigned *)data = type; return OK;
	case 9: *(int *)data = dev; return OK;
	case 11: *(uint64_t *)data = base; return OK;
	case 12: *(size_t *)data = size; return OK;
	}
	return INVALID_VALUE;
}

// The stream and event API.
CUresult cuStreamCreate(uintptr_t *s, unsigned flags) {
	if (!cur) return INVALID_CONTEXT;
	struct stream *st = calloc(1, sizeof *st);
	if (!st) return OUT_OF_MEMORY;
	pthread_mutex_init(&st->mu, NULL);
	pthread_cond_init(&st->cv, NULL);
	const char *d = getenv("FAKECUDA_STREAM_DELAY_US");
	st->delay_us = d ? atol(d) : 0;
	const char *j = getenv("FAKECUDA_STREAM_JITTER");
	st->jitter = j && j[0] == '1';
	st->seed = (unsigned)getpid() * 2654435761u ^ (unsigned)(uintptr_t)st;
	if (pthread_create(&st->thr, NULL, stream_main, st) != 0) { free(st); return OUT_OF_MEMORY; }
	pthread_mutex_lock(&mu);
	st->next = streams;
	streams = st;
	pthread_mutex_unlock(&mu);
	*s = (uintptr_t)st;
	return OK;
}
CUresult cuStreamDestroy_v2(uintptr_t s) {
	if (!s) return INVALID_HANDLE;
	struct stream *st = (struct stream *)s;
	pthread_mutex_lock(&mu);
	struct stream **pp = &streams;
	while (*pp && *pp != st) pp = &(*pp)->next;
	if (!*pp) { pthread_mutex_unlock(&mu); return INVALID_HANDLE; }
	*pp = st->next;
	pthread_mutex_unlock(&mu);
	// The queued work still runs, as with the real driver.
	pthread_mutex_lock(&st->mu);
	st->quit = 1;
	pthread_cond_broadcast(&st->cv);
	pthread_mutex_unlock(&st->mu);
	pthread_join(st->thr, NULL);
	// Not freed: another thread's sync_all may still be looking at it (it
	// finds no work left). The test processes are short-lived.
	return OK;
}
CUresult cuStreamSynchronize(uintptr_t s) {
	if (!cur) return INVALID_CONTEXT;
	if (s) stream_sync((struct stream *)s);
	return OK;
}
CUresult cuStreamQuery(uintptr_t s) {
	if (!cur) return INVALID_CONTEXT;
	if (!s) return OK;
	struct stream *st = (struct stream *)s;
	pthread_mutex_lock(&st->mu);
	int busy = st->done < st->queued;
	pthread_mutex_unlock(&st->mu);
	return busy ? NOT_READY : OK;
}
CUresult cuCtxSynchronize(void) {
	if (!cur) return INVALID_CONTEXT;
	sync_all();
	return OK;
}
CUresult cuEventCreate(uintptr_t *e, unsigned flags) {
	if (!cur) return INVALID_CONTEXT;
	struct event *ev = calloc(1, sizeof *ev);
	if (!ev) return OUT_OF_MEMORY;
	*e = (uintptr_t)ev;
	return OK;
}
CUresult cuEventRecord(uintptr_t e, uintptr_t s) {
	if (!e) return INVALID_HANDLE;
	struct op *o = new_op(OP_RECORD);
	if (!o) return OUT_OF_MEMORY;
	o->ev = (struct event *)e;
	pthread_mutex_lock(&evmu);
	o->gen = ++o->ev->recorded;
	pthread_mutex_unlock(&evmu);
	return submit(s, o);
}
static uint64_t recorded(struct event *ev) {
	pthread_mutex_lock(&evmu);
	uint64_t g = ev->recorded;
	pthread_mutex_unlock(&evmu);
	return g;
}
CUresult cuEventSynchronize(uintptr_t e) {
	if (!e) return INVALID_HANDLE;
	struct event *ev = (struct event *)e;
	event_wait(ev, recorded(ev));
	return OK;
}
CUresult cuEventQuery(uintptr_t e) {
	if (!e) return INVALID_HANDLE;
	struct event *ev = (struct event *)e;
	pthread_mutex_lock(&evmu);
	int ready = ev->done >= ev->recorded;
	pthread_mutex_unlock(&evmu);
	return ready ? OK : NOT_READY;
}
CUresult cuStreamWaitEvent(uintptr_t s, uintptr_t e, unsigned flags) {
	if (!e) return INVALID_HANDLE;
	struct op *o = new_op(OP_WAIT_EVENT);
	if (!o) return OUT_OF_MEMORY;
	o->ev = (struct event *)e;
	o->gen = recorded(o->ev);
	return submit(s, o);
}
// Events are never freed: a queued wait may still read one. The test
// processes are short-lived.
CUresult cuEventDestroy_v2(uintptr_t e) { return e ? OK : INVALID_HANDLE; }
CUresult cuStreamWaitValue32_v2(uintptr_t s, uint64_t addr, uint32_t value, unsigned flags) {
	if (!cur) return INVALID_CONTEXT;
	if (!addr || (addr & 3) || (flags & ~3u)) return INVALID_VALUE;
	struct op *o = new_op(OP_WAIT_VALUE);
	if (!o) return OUT_OF_MEMORY;
	o->word = (volatile uint32_t *)(uintptr_t)addr;
	o->value = value;
	o->flags = flags;
	return submit(s, o);
}
#ifndef OMIT_WRITE_VALUE
// flags: CU_STREAM_WRITE_VALUE_DEFAULT (0) or _NO_MEMORY_BARRIER (1); the
// fake fences either way.
CUresult cuStreamWriteValue32_v2(uintptr_t s, uint64_t addr, uint32_t value, unsigned flags) {
	if (!cur) return INVALID_CONTEXT;
	if (!addr || (addr & 3) || (flags & ~1u)) return INVALID_VALUE;
	struct op *o = new_op(OP_WRITE_VALUE);
	if (!o) return OUT_OF_MEMORY;
	o->word = (volatile uint32_t *)(uintptr_t)addr;
	o->value = value;
	o->flags = flags;
	return submit(s, o);
}
// CUstreamBatchMemOpParams: 48 bytes; the fake takes the 32-bit wait and
// write, checks every operation before it queues any (as the driver
// refuses a batch whole) and queues them in order.
typedef struct {
	uint32_t op, pad0;
	uint64_t addr, value;
	uint32_t flags, pad1;
	uint64_t alias, pad2;
} batch_op;
_Static_assert(sizeof(batch_op) == 48, "CUstreamBatchMemOpParams is 48 bytes");
CUresult cuStreamBatchMemOp_v2(uintptr_t s, unsigned count, const batch_op *ops, unsigned flags) {
	if (!cur) return INVALID_CONTEXT;
	if (count == 0 || count >= 256 || !ops || flags) return INVALID_VALUE;
	for (unsigned i = 0; i < count; i++) {
		const batch_op *b = &ops[i];
		if (!b->addr || (b->addr & 3)) return INVALID_VALUE;
		if (b->op == 1 && (b->flags & ~3u) == 0) continue;  // WAIT_VALUE_32
		if (b->op == 2 && (b->flags & ~1u) == 0) continue;  // WRITE_VALUE_32
		return INVALID_VALUE;
	}
	for (unsigned i = 0; i < count; i++) {
		const batch_op *b = &ops[i];
		CUresult r = b->op == 1 ? cuStreamWaitValue32_v2(s, b->addr, (uint32_t)b->value, b->flags)
		                        : cuStreamWriteValue32_v2(s, b->addr, (uint32_t)b->value, b->flags);
		if (r != OK) return r;
	}
	return OK;
}
#endif

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
	if (a) *a = (struct alloc){(uint64_t)(uintptr_t)m, ih.size, fd, 1, cur_dev()};
	pthread_mutex_unlock(&mu);
	if (!a) { munmap(m, ih.size); close(fd); return OUT_OF_MEMORY; }
	*p = (uint64_t)(uintptr_t)m;
	return OK;
}
CUresult cuIpcCloseMemHandle(uint64_t p) {
	if (!cur) return INVALID_CONTEXT;
	sync_all();
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

// cubin_entries adds the functions (STT_FUNC symbols) of a cubin, a
// little-endian 64-bit ELF for EM_CUDA, to mod.
static CUresult cubin_entries(struct module *mod, const unsigned char *img) {
#define U16(p) ((uint16_t)((p)[0] | (p)[1] << 8))
#define U32(p) ((uint32_t)U16(p) | (uint32_t)U16((p) + 2) << 16)
#define U64(p) ((uint64_t)U32(p) | (uint64_t)U32((p) + 4) << 32)
	if (img[4] != 2 || img[5] != 1 || U16(img + 18) != 190) return INVALID_PTX;
	uint64_t shoff = U64(img + 40);
	unsigned shentsize = U16(img + 58), shnum = U16(img + 60);
	for (unsigned i = 0; i < shnum; i++) {
		const unsigned char *h = img + shoff + (uint64_t)i * shentsize;
		if (U32(h + 4) != 2) continue; // SHT_SYMTAB
		const unsigned char *strh = img + shoff + (uint64_t)U32(h + 40) * shentsize;
		const char *strs = (const char *)img + U64(strh + 24);
		for (uint64_t o = 0; o + 24 <= U64(h + 32) && mod->n < MAX_ENTRIES; o += 24) {
			const unsigned char *sym = img + U64(h + 24) + o;
			if ((sym[4] & 0xf) == 2) mod->names[mod->n++] = strdup(strs + U32(sym)); // STT_FUNC
		}
	}
	return OK;
#undef U16
#undef U32
#undef U64
}

CUresult cuModuleLoadData(uintptr_t *m, const void *image) {
	if (!cur) return INVALID_CONTEXT;
	const char *s = image;
	if (memcmp(s, "\x7f" "ELF", 4) == 0) {
		struct module *mod = calloc(1, sizeof *mod);
		CUresult r = cubin_entries(mod, image);
		if (r != OK) {
			free(mod);
			return r;
		}
		*m = (uintptr_t)mod;
		return OK;
	}
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
	struct op *o = new_op(OP_LAUNCH);
	if (!o) return OUT_OF_MEMORY;
	o->fn = fn->host;
	o->gx = gx;
	o->bx = bx;
#ifdef GCCL_HOSTEMU
	memcpy(&o->arg, params[0], sizeof o->arg);
#endif
	return submit(s, o);
}
#endif

// Unloading the library (the last Driver.Close) must not leave a stream's
// thread in code that is about to be unmapped: a Device closed with a live
// Stream (TestCloseTwiceAndUseAfterClose) left one that, on a loaded
// machine, had not even started yet, and crashed the test process when it
// did. Stop and join them, as a driver that owns its threads would.
__attribute__((destructor)) static void fake_unload(void) {
	pthread_mutex_lock(&mu);
	struct stream *live = streams;
	streams = NULL;
	pthread_mutex_unlock(&mu);
	for (struct stream *st = live; st; st = st->next) {
		pthread_mutex_lock(&st->mu);
		st->quit = 1;
		pthread_cond_broadcast(&st->cv);
		pthread_mutex_unlock(&st->mu);
		pthread_join(st->thr, NULL);
	}
}
