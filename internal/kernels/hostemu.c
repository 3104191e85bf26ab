//go:build ignore

// (The constraint above keeps the go tool, which rejects C files in a
// package without cgo, away from this file; C compilers read it as a comment.)

/*
 * hostemu.c: host emulation of reduce.cu; see hostemu.h. Build it as part
 * of one C translation unit, with -I pointing at this directory or by
 * #including this file.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hostemu.h"

/* The emulated special registers, per host thread. */
static __thread unsigned int gccl_emu_tid_x, gccl_emu_ctaid_x, gccl_emu_ntid_x, gccl_emu_nctaid_x;

#define GCCL_TID_X() gccl_emu_tid_x
#define GCCL_CTAID_X() gccl_emu_ctaid_x
#define GCCL_NTID_X() gccl_emu_ntid_x
#define GCCL_NCTAID_X() gccl_emu_nctaid_x

/* A vector access through a pointer that is not 16-byte aligned faults on
 * the GPU (CUDA_ERROR_MISALIGNED_ADDRESS); here it aborts. */
static void *gccl_emu_check_aligned16(const void *p)
{
	if (((uintptr_t)p & 15u) != 0) {
		fprintf(stderr, "gccl host emulation: misaligned 16-byte vector access at %p\n", p);
		abort();
	}
	return (void *)(uintptr_t)p;
}
#define GCCL_CHECK_ALIGNED16(p) gccl_emu_check_aligned16(p)

#include "reduce.cu"

#undef GCCL_TID_X
#undef GCCL_CTAID_X
#undef GCCL_NTID_X
#undef GCCL_NCTAID_X
#undef GCCL_CHECK_ALIGNED16

typedef void (*gccl_emu_kernel_fn)(struct gccl_reduce_args);

static const struct {
	const char *name;
	gccl_emu_kernel_fn fn;
} gccl_emu_kernels[] = {
#define GCCL_EMU_ENTRY(dt, op) {"gccl_reduce_" #dt "_" #op, gccl_reduce_##dt##_##op},
	GCCL_REDUCE_KERNELS(GCCL_EMU_ENTRY)
#undef GCCL_EMU_ENTRY
};

#define GCCL_EMU_NKERNELS ((int)(sizeof(gccl_emu_kernels) / sizeof(gccl_emu_kernels[0])))

int gccl_host_kernel_find(const char *name)
{
	if (name == NULL)
		return -1;
	for (int i = 0; i < GCCL_EMU_NKERNELS; i++)
		if (strcmp(gccl_emu_kernels[i].name, name) == 0)
			return i;
	return -1;
}

void gccl_host_kernel_launch(int index, unsigned gridX, unsigned blockX, void **params)
{
	if (index < 0 || index >= GCCL_EMU_NKERNELS || params == NULL || params[0] == NULL)
		return;
	struct gccl_reduce_args args;
	memcpy(&args, params[0], sizeof args);
	gccl_emu_kernel_fn fn = gccl_emu_kernels[index].fn;
	gccl_emu_nctaid_x = gridX;
	gccl_emu_ntid_x = blockX;
	for (unsigned b = 0; b < gridX; b++) {
		gccl_emu_ctaid_x = b;
		for (unsigned t = 0; t < blockX; t++) {
			gccl_emu_tid_x = t;
			fn(args);
		}
	}
}
