// A fake CUDA driver for internal/cuda's tests: it exports the entry points
// gccl resolves, with cuda.h's C signatures, backs "device memory" with
// malloc, keeps the current context per thread as the real driver does, and
// fails where the tests need it to. Built by the tests with gcc -shared.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
static int inited;
static int ctxs[2];
static __thread void *cur; // the calling thread's current context

CUresult cuInit(unsigned flags) {
	if (getenv("FAKECUDA_NO_DEVICE")) return 100;
	inited = 1;
	return 0;
}
CUresult cuDriverGetVersion(int *v) { *v = 12040; return 0; }
CUresult cuGetErrorName(CUresult r, const char **s) {
	switch (r) {
	case 1: *s = "CUDA_ERROR_INVALID_VALUE"; return 0;
	case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
	case 100: *s = "CUDA_ERROR_NO_DEVICE"; return 0;
	}
	return 1; // unknown to this fake: the binding falls back to its table
}
CUresult cuDeviceGetCount(int *n) { if (!inited) return 3; *n = 2; return 0; }
CUresult cuDeviceGet(int *d, int ordinal) { if (ordinal < 0 || ordinal >= 2) return 101; *d = ordinal; return 0; }
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) { *v = 0; return 0; }
CUresult cuDeviceGetPCIBusId(char *buf, int len, int dev) { snprintf(buf, len, "0000:%02X:00.0", 0x3B + dev); return 0; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { *ctx = &ctxs[dev]; return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(int dev) { return 0; }
CUresult cuCtxSetCurrent(void *ctx) { cur = ctx; return 0; }
CUresult cuMemAlloc_v2(uint64_t *p, size_t n) {
	if (!cur) return 201;
	if (n > ((size_t)1 << 30)) return 2;
	*p = (uint64_t)(uintptr_t)malloc(n);
	return 0;
}
CUresult cuMemFree_v2(uint64_t p) { if (!cur) return 201; free((void *)(uintptr_t)p); return 0; }
CUresult cuMemcpyHtoDAsync_v2(uint64_t dst, const void *src, size_t n, void *s) {
	if (!cur) return 201;
	memcpy((void *)(uintptr_t)dst, src, n);
	return 0;
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, uint64_t src, size_t n, void *s) {
	if (!cur) return 201;
	memcpy(dst, (void *)(uintptr_t)src, n);
	return 0;
}
CUresult cuStreamSynchronize(void *s) { return cur ? 0 : 201; }
CUresult cuIpcGetMemHandle(void *h, uint64_t p) { memset(h, 0, 64); memcpy(h, &p, sizeof p); return 0; }

// Resolved by the binding but not exercised by the fake's tests.
CUresult cuStreamCreate(void) { return 0; }
CUresult cuStreamDestroy_v2(void) { return 0; }
CUresult cuEventCreate(void) { return 0; }
CUresult cuEventRecord(void) { return 0; }
CUresult cuEventSynchronize(void) { return 0; }
CUresult cuEventDestroy_v2(void) { return 0; }
CUresult cuMemAllocHost_v2(void) { return 0; }
CUresult cuMemFreeHost(void) { return 0; }
CUresult cuMemHostRegister_v2(void) { return 0; }
CUresult cuMemHostUnregister(void) { return 0; }
CUresult cuMemcpyDtoDAsync_v2(void) { return 0; }
CUresult cuMemsetD8Async(void) { return 0; }
CUresult cuIpcOpenMemHandle_v2(void) { return 0; }
CUresult cuIpcCloseMemHandle(void) { return 0; }
CUresult cuModuleLoadData(void) { return 0; }
CUresult cuModuleGetFunction(void) { return 0; }
#ifndef OMIT_LAUNCH
CUresult cuLaunchKernel(void) { return 0; }
#endif
