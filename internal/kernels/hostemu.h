/*
 * hostemu.h: run gccl's GPU reduction kernels (reduce.cu) on the CPU.
 *
 * hostemu.c compiles reduce.cu as plain C, so the emulated kernels are the
 * very code the PTX comes from. It is meant to be #included into one C
 * translation unit (for example a fake CUDA driver); every symbol is
 * prefixed gccl_ and everything but the two functions below is static.
 */
#ifndef GCCL_HOSTEMU_H
#define GCCL_HOSTEMU_H

#include "gccl_kernels.h"

/* gccl_host_kernel_find returns the index of the kernel with the given
 * entry name (e.g. "gccl_reduce_float32_sum"), or -1 if there is none. */
int gccl_host_kernel_find(const char *name);

/* gccl_host_kernel_launch runs kernel index over a gridX x blockX launch,
 * serially, every thread of every block to completion in turn. params is
 * laid out as cuLaunchKernel's kernelParams: params[0] points to the
 * struct gccl_reduce_args. An invalid index, or a zero grid or block, does
 * nothing. Concurrent launches from different host threads are safe. A
 * 16-byte vector access through a misaligned pointer, which would fault on
 * the GPU, prints a message and aborts the process. */
void gccl_host_kernel_launch(int index, unsigned gridX, unsigned blockX, void **params);

#endif /* GCCL_HOSTEMU_H */
