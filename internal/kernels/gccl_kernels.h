/*
 * gccl_kernels.h: what gccl's GPU reduction kernels (reduce.cu) share with
 * their host emulation (hostemu.c) and with the Go launcher
 * (kernels.ReduceArgs, which must keep exactly this layout).
 */
#ifndef GCCL_KERNELS_H
#define GCCL_KERNELS_H

#define GCCL_MAX_INPUTS 8
#define GCCL_MAX_OUTPUTS 8

/*
 * The single by-value parameter of every gccl_reduce_<dtype>_<op> kernel:
 * 8 + 64 + 64 + 4 + 4 + 8 = 152 bytes, 8-byte aligned, no padding.
 *
 * For every element i < count:
 *   acc = in[0][i] op in[1][i] op ... op in[nin-1][i]   (in this order)
 *   out[0][i] = ... = out[nout-1][i] = acc
 * with 1 <= nin <= 8 and 1 <= nout <= 8. An output may be exactly the same
 * memory as an input (in place), never a partial overlap. scalar is the
 * multiplier of premulsum and the divisor of sumdiv; other ops ignore it.
 */
struct gccl_reduce_args {
	unsigned long long count;
	const void *in[GCCL_MAX_INPUTS];
	void *out[GCCL_MAX_OUTPUTS];
	int nin;
	int nout;
	double scalar;
};

/*
 * GCCL_REDUCE_DTYPES(X, op) calls X(dtype, op) for every element type and
 * GCCL_REDUCE_KERNELS(X) calls X(dtype, op) for every kernel, dtypes in the
 * order of reduce.DType and ops in the order of kernels.Op.
 */
#define GCCL_REDUCE_DTYPES(X, op) \
	X(int8, op) X(uint8, op) X(int32, op) X(uint32, op) \
	X(int64, op) X(uint64, op) X(float16, op) X(bfloat16, op) \
	X(float32, op) X(float64, op) X(float8e4m3, op) X(float8e5m2, op)

#define GCCL_REDUCE_KERNELS(X) \
	GCCL_REDUCE_DTYPES(X, sum) GCCL_REDUCE_DTYPES(X, prod) \
	GCCL_REDUCE_DTYPES(X, min) GCCL_REDUCE_DTYPES(X, max) \
	GCCL_REDUCE_DTYPES(X, premulsum) GCCL_REDUCE_DTYPES(X, sumdiv)

#endif /* GCCL_KERNELS_H */
