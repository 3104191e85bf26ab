/*
 * reduce.cu: gccl's element-wise GPU reduction kernels.
 *
 * One entry point per (element type, operator), named
 * gccl_reduce_<dtype>_<op> with
 *   dtype: int8 uint8 int32 uint32 int64 uint64 float16 bfloat16 float32
 *          float64 float8e4m3 float8e5m2
 *   op:    sum prod min max premulsum sumdiv
 * Each takes one struct gccl_reduce_args by value (gccl_kernels.h, 152
 * bytes): for every i < count, acc = in[0][i] op ... op in[nin-1][i] and acc
 * is written to out[0][i] ... out[nout-1][i]. Every element belongs to one
 * thread, which reads all its inputs before writing any output, so outputs
 * may be the same memory as inputs.
 *
 * Arithmetic (matching gccl's host kernels, internal/reduce):
 *   - Integers wrap (computed in unsigned arithmetic); min and max are exact.
 *   - float32 computes in float32, float64 in float64.
 *   - float16, bfloat16, float8e4m3 (OCP E4M3FN: no infinities, max 448,
 *     NaN = S.1111.111) and float8e5m2 widen to float32 exactly, accumulate
 *     in float32 across all nin inputs and round back to nearest-even ONCE at
 *     the end. The host ring rounds after every step, so a result can differ
 *     from the host's in the last bit. The conversions are bit-exact with
 *     internal/reduce/convert.go (NaNs included).
 *   - min/max of two zeros of different sign: max gives +0, min gives -0.
 *     With a NaN operand the result is unspecified.
 *   - premulsum: acc = sum over j of (x_j * m), each product rounded to the
 *     compute type, where m is scalar converted to the compute type; for
 *     integer types m = (long long)scalar (truncated), and arithmetic wraps.
 *   - sumdiv: integer average, acc = (sum over j of x_j, wrapped to the
 *     type) / (long long)scalar, truncating toward zero (signed types divide
 *     as signed 64-bit, unsigned as unsigned 64-bit). scalar must be >= 1.
 *     For float types sumdiv is sum then multiply by (C)(1.0/scalar) in the
 *     compute type C; gccl does not use it (it scales floats on the host
 *     side) but it exists so that every (dtype, op) has an entry.
 *   - scalar must be finite, and in int64 range for integer types.
 *   Floating-point contraction (FMA) must be off: build.sh passes
 *   -ffp-contract=off (clang) / --fmad=false (nvcc) so a product is
 *   rounded before it is added, as on the host.
 *
 * Shape: a grid-stride loop over the elements. When every pointer (all nin
 * inputs and nout outputs) is 16-byte aligned, each thread moves 16-byte
 * vectors and a scalar loop does the tail; otherwise everything goes through
 * the scalar loop. One pass over memory.
 *
 * Building: build.sh compiles the PTX of sm_70 sm_75 sm_80 sm_86 sm_89 and
 * sm_90 with nvcc when it is on PATH, otherwise with clang 19's NVPTX
 * backend and no CUDA headers or libraries, and writes ptx/reduce.ptx and
 * ptx/targets (one copy: the six differ only in .version and .target).
 *
 * This file is also valid C: hostemu.c includes it, with the thread and
 * block indices replaced by thread-local variables, to run the very same
 * code on the CPU (the fake CUDA driver of the tests). The PTX has been
 * assembled by NVIDIA's ptxas and its machine code read with nvdisasm
 * (TestPTXAssembles), and the C has been run on the host against a
 * reference, but the PTX has never run on a GPU where it was written.
 */
#include "gccl_kernels.h"

#if defined(__CUDA__) || defined(__CUDACC__)
#define GCCL_CUDA 1
#ifndef __global__
#define __global__ __attribute__((global))
#endif
#ifndef __device__
#define __device__ __attribute__((device))
#endif
#define GCCL_DEV static __device__ inline __attribute__((always_inline))
#define GCCL_ENTRY extern "C" __global__ void
#define GCCL_UNROLL _Pragma("unroll")
#if defined(__clang__)
#define GCCL_TID_X() __nvvm_read_ptx_sreg_tid_x()
#define GCCL_CTAID_X() __nvvm_read_ptx_sreg_ctaid_x()
#define GCCL_NTID_X() __nvvm_read_ptx_sreg_ntid_x()
#define GCCL_NCTAID_X() __nvvm_read_ptx_sreg_nctaid_x()
#else /* nvcc */
#define GCCL_TID_X() threadIdx.x
#define GCCL_CTAID_X() blockIdx.x
#define GCCL_NTID_X() blockDim.x
#define GCCL_NCTAID_X() gridDim.x
#endif
#else /* plain C: host emulation */
#if !defined(GCCL_TID_X) || !defined(GCCL_CTAID_X) || !defined(GCCL_NTID_X) || !defined(GCCL_NCTAID_X)
#error "reduce.cu compiled as C needs GCCL_TID_X() etc.; include hostemu.c instead"
#endif
#define GCCL_DEV static inline
#define GCCL_ENTRY static void
#define GCCL_UNROLL
#endif

/* GCCL_VEC16(p) is p as a vector pointer. Host emulation defines
 * GCCL_CHECK_ALIGNED16 to trap, as the GPU would, on a misaligned one. */
#ifdef GCCL_CHECK_ALIGNED16
#define GCCL_VEC16(p) ((gccl_vec16 *)GCCL_CHECK_ALIGNED16(p))
#else
#define GCCL_VEC16(p) ((gccl_vec16 *)(p))
#endif

/* 16 bytes, the unit of the vectorized loop. may_alias: it moves bytes of
 * any element type. */
typedef struct __attribute__((aligned(16), may_alias)) {
	unsigned int x, y, z, w;
} gccl_vec16;

/* gccl_store16 stores one vector in one 16-byte instruction. Written as
 * plain C, clang 19 splits the vectors of 1-byte types into four 4-byte
 * stores (nvdisasm shows STG.E per word), so the GPU build says it in PTX;
 * the memory clobber keeps it ordered with every other access, as a plain
 * store would be. */
#ifdef GCCL_CUDA
GCCL_DEV void gccl_store16(gccl_vec16 *p, gccl_vec16 v)
{
	asm volatile("{ .reg .u64 g; cvta.to.global.u64 g, %0; st.global.v4.u32 [g], {%1, %2, %3, %4}; }"
		     :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
#else
GCCL_DEV void gccl_store16(gccl_vec16 *p, gccl_vec16 v) { *p = v; }
#endif

/* ---- float bit patterns -------------------------------------------------- */

typedef union { float f; unsigned int u; } gccl_f32u;
typedef union { double f; unsigned long long u; } gccl_f64u;

GCCL_DEV float gccl_f32_frombits(unsigned int u) { gccl_f32u x; x.u = u; return x.f; }
GCCL_DEV unsigned int gccl_f32_bits(float f) { gccl_f32u x; x.f = f; return x.u; }
GCCL_DEV int gccl_f32_signbit(float f) { return (int)(gccl_f32_bits(f) >> 31); }
GCCL_DEV int gccl_f64_signbit(double f) { gccl_f64u x; x.f = f; return (int)(x.u >> 63); }

/* ---- conversions, bit-exact with internal/reduce/convert.go ------------- */

/* gccl_narrow_magnitude rounds the non-negative finite float32 pattern x to
 * a format with mant_bits fraction bits and the given bias, ties to even; the
 * caller has handled overflow. */
GCCL_DEV unsigned int gccl_narrow_magnitude(unsigned int x, unsigned int mant_bits, unsigned int bias)
{
	unsigned int shift = 23u - mant_bits;
	unsigned int min_normal = 127u - bias + 1u;
	unsigned int exp = x >> 23;
	if (exp >= min_normal) {
		x += (1u << (shift - 1u)) - 1u + ((x >> shift) & 1u);
		return (x - ((127u - bias) << 23)) >> shift;
	}
	unsigned int s = shift + min_normal - exp;
	if (s > 24u)
		return 0;
	unsigned int m = (x & 0x7fffffu) | 0x800000u;
	unsigned int r = m >> s;
	unsigned int rem = m & ((1u << s) - 1u);
	unsigned int half = 1u << (s - 1u);
	if (rem > half || (rem == half && (r & 1u) == 1u))
		r++;
	return r;
}

/* IEEE binary16 -> float32, exact; a signalling NaN comes back quiet. */
GCCL_DEV float gccl_f16_to_f32(unsigned short h)
{
	unsigned int e = h & 0x7c00u;
	unsigned int sign = (unsigned int)(h & 0x8000u) << 16;
	unsigned int mant = h & 0x3ffu;
	if (e != 0 && e != 0x7c00u)
		return gccl_f32_frombits(sign | (((unsigned int)(h & 0x7fffu) << 13) + ((127u - 15u) << 23)));
	if (e != 0) {
		if (mant == 0)
			return gccl_f32_frombits(sign | 0x7f800000u);
		return gccl_f32_frombits(sign | 0x7fc00000u | (mant << 13));
	}
	float f = (float)mant * gccl_f32_frombits(0x33800000u); /* mant * 2^-24, exact */
	return sign ? -f : f;
}

/* float32 -> IEEE binary16, nearest even; overflow gives infinity, NaN
 * stays a quiet NaN. */
GCCL_DEV unsigned short gccl_f32_to_f16(float f)
{
	unsigned int x = gccl_f32_bits(f);
	unsigned int sign = (x >> 16) & 0x8000u;
	x &= 0x7fffffffu;
	if (x - 0x38800000u < 0x477ff000u - 0x38800000u) { /* normal result */
		x += 0xfffu + ((x >> 13) & 1u);
		return (unsigned short)(sign | ((x - ((127u - 15u) << 23)) >> 13));
	}
	if (x > 0x7f800000u)
		return (unsigned short)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
	if (x >= 0x477ff000u)
		return (unsigned short)(sign | 0x7c00u);
	return (unsigned short)(sign | gccl_narrow_magnitude(x, 10, 15));
}

GCCL_DEV float gccl_bf16_to_f32(unsigned short h) { return gccl_f32_frombits((unsigned int)h << 16); }

/* float32 -> bfloat16, nearest even; a NaN stays a (quiet) NaN. */
GCCL_DEV unsigned short gccl_f32_to_bf16(float f)
{
	unsigned int x = gccl_f32_bits(f);
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (unsigned short)((x >> 16) | 0x0040u);
	x += 0x7fffu + ((x >> 16) & 1u);
	return (unsigned short)(x >> 16);
}

/* OCP FP8 E4M3FN -> float32, exact. */
GCCL_DEV float gccl_e4m3_to_f32(unsigned char b)
{
	unsigned int sign = (unsigned int)(b & 0x80u) << 24;
	unsigned int exp = (b >> 3) & 0xfu;
	unsigned int mant = b & 7u;
	if (exp == 0xfu && mant == 7u)
		return gccl_f32_frombits(sign | 0x7fc00000u);
	if (exp == 0) {
		float f = (float)mant * gccl_f32_frombits(0x3b000000u); /* mant * 2^-9 */
		return sign ? -f : f;
	}
	return gccl_f32_frombits(sign | ((exp + 127u - 7u) << 23) | (mant << 20));
}

/* float32 -> E4M3FN, nearest even; overflow, infinities and NaNs give NaN. */
GCCL_DEV unsigned char gccl_f32_to_e4m3(float f)
{
	unsigned int x = gccl_f32_bits(f);
	unsigned int sign = (x >> 24) & 0x80u;
	x &= 0x7fffffffu;
	if (x > 0x43e80000u) /* above 464, the midpoint of 448 and NaN */
		return (unsigned char)(sign | 0x7fu);
	return (unsigned char)(sign | gccl_narrow_magnitude(x, 3, 7));
}

/* OCP FP8 E5M2 -> float32: the top byte of a binary16. */
GCCL_DEV float gccl_e5m2_to_f32(unsigned char b) { return gccl_f16_to_f32((unsigned short)((unsigned int)b << 8)); }

/* float32 -> E5M2, nearest even; overflow gives infinity, NaN stays NaN. */
GCCL_DEV unsigned char gccl_f32_to_e5m2(float f)
{
	unsigned int x = gccl_f32_bits(f);
	unsigned int sign = (x >> 24) & 0x80u;
	x &= 0x7fffffffu;
	if (x > 0x7f800000u)
		return (unsigned char)(sign | 0x7eu | ((x >> 21) & 3u));
	if (x >= 0x47700000u) /* >= 61440 = max 57344 + half an ulp */
		return (unsigned char)(sign | 0x7cu);
	return (unsigned char)(sign | gccl_narrow_magnitude(x, 2, 15));
}

/* ---- per-type element helpers -------------------------------------------
 * For each dtype: its storage type gccl_T_<dt>, compute type gccl_C_<dt>,
 * gccl_ld_/gccl_st_ (storage <-> compute), add, mul, min, max, scale (the
 * premulsum multiplier from scalar) and div (the sumdiv finish). */

/* Integers compute in an unsigned type at least as wide as int (so nothing
 * is promoted to a signed int and every wrap is defined); S is the type
 * min/max compare in, D the type sumdiv divides in. */
#define GCCL_INT_HELPERS(dt, T, C, S, D) \
	typedef T gccl_T_##dt; \
	typedef C gccl_C_##dt; \
	GCCL_DEV C gccl_ld_##dt(T v) { return (C)(S)v; } \
	GCCL_DEV T gccl_st_##dt(C v) { return (T)v; } \
	GCCL_DEV C gccl_add_##dt(C a, C b) { return a + b; } \
	GCCL_DEV C gccl_mul_##dt(C a, C b) { return a * b; } \
	GCCL_DEV C gccl_min_##dt(C a, C b) { return (S)b < (S)a ? b : a; } \
	GCCL_DEV C gccl_max_##dt(C a, C b) { return (S)b > (S)a ? b : a; } \
	GCCL_DEV C gccl_scale_##dt(double s) { return (C)(long long)s; } \
	GCCL_DEV C gccl_div_##dt(C acc, double s) { return (C)(S)(T)((D)(T)acc / (D)(long long)s); }

GCCL_INT_HELPERS(int8, signed char, unsigned int, int, long long)
GCCL_INT_HELPERS(uint8, unsigned char, unsigned int, unsigned int, unsigned long long)
GCCL_INT_HELPERS(int32, int, unsigned int, int, long long)
GCCL_INT_HELPERS(uint32, unsigned int, unsigned int, unsigned int, unsigned long long)
GCCL_INT_HELPERS(int64, long long, unsigned long long, long long, long long)
GCCL_INT_HELPERS(uint64, unsigned long long, unsigned long long, unsigned long long, unsigned long long)

/* Floats: LD/ST widen/narrow (identity for float32/float64), SB the sign
 * bit of C. On equal operands (only zeros of different sign can differ) max
 * takes +0 and min -0; with a NaN the result is b. */
#define GCCL_FLOAT_HELPERS(dt, T, C, LD, ST, SB) \
	typedef T gccl_T_##dt; \
	typedef C gccl_C_##dt; \
	GCCL_DEV C gccl_ld_##dt(T v) { return LD(v); } \
	GCCL_DEV T gccl_st_##dt(C v) { return ST(v); } \
	GCCL_DEV C gccl_add_##dt(C a, C b) { return a + b; } \
	GCCL_DEV C gccl_mul_##dt(C a, C b) { return a * b; } \
	GCCL_DEV C gccl_min_##dt(C a, C b) { return a < b ? a : b < a ? b : a == b ? (SB(a) ? a : b) : b; } \
	GCCL_DEV C gccl_max_##dt(C a, C b) { return a > b ? a : b > a ? b : a == b ? (SB(a) ? b : a) : b; } \
	GCCL_DEV C gccl_scale_##dt(double s) { return (C)s; } \
	GCCL_DEV C gccl_div_##dt(C acc, double s) { return acc * (C)(1.0 / s); }

#define GCCL_ID(v) (v)
GCCL_FLOAT_HELPERS(float16, unsigned short, float, gccl_f16_to_f32, gccl_f32_to_f16, gccl_f32_signbit)
GCCL_FLOAT_HELPERS(bfloat16, unsigned short, float, gccl_bf16_to_f32, gccl_f32_to_bf16, gccl_f32_signbit)
GCCL_FLOAT_HELPERS(float32, float, float, GCCL_ID, GCCL_ID, gccl_f32_signbit)
GCCL_FLOAT_HELPERS(float64, double, double, GCCL_ID, GCCL_ID, gccl_f64_signbit)
GCCL_FLOAT_HELPERS(float8e4m3, unsigned char, float, gccl_e4m3_to_f32, gccl_f32_to_e4m3, gccl_f32_signbit)
GCCL_FLOAT_HELPERS(float8e5m2, unsigned char, float, gccl_e5m2_to_f32, gccl_f32_to_e5m2, gccl_f32_signbit)

/* ---- operators: PRE maps an input, COMB folds it in, FIN finishes ------- */

#define GCCL_PRE_sum(dt, x, m) (x)
#define GCCL_PRE_prod(dt, x, m) (x)
#define GCCL_PRE_min(dt, x, m) (x)
#define GCCL_PRE_max(dt, x, m) (x)
#define GCCL_PRE_premulsum(dt, x, m) gccl_mul_##dt(x, m)
#define GCCL_PRE_sumdiv(dt, x, m) (x)

#define GCCL_COMB_sum(dt, a, b) gccl_add_##dt(a, b)
#define GCCL_COMB_prod(dt, a, b) gccl_mul_##dt(a, b)
#define GCCL_COMB_min(dt, a, b) gccl_min_##dt(a, b)
#define GCCL_COMB_max(dt, a, b) gccl_max_##dt(a, b)
#define GCCL_COMB_premulsum(dt, a, b) gccl_add_##dt(a, b)
#define GCCL_COMB_sumdiv(dt, a, b) gccl_add_##dt(a, b)

#define GCCL_FIN_sum(dt, a, s) (a)
#define GCCL_FIN_prod(dt, a, s) (a)
#define GCCL_FIN_min(dt, a, s) (a)
#define GCCL_FIN_max(dt, a, s) (a)
#define GCCL_FIN_premulsum(dt, a, s) (a)
#define GCCL_FIN_sumdiv(dt, a, s) gccl_div_##dt(a, s)

/* gccl_all_aligned16 reports whether every input and output is 16-byte
 * aligned. */
GCCL_DEV int gccl_all_aligned16(const struct gccl_reduce_args *a)
{
	unsigned long long bits = 0;
	for (int j = 0; j < a->nin; j++)
		bits |= (unsigned long long)a->in[j];
	for (int o = 0; o < a->nout; o++)
		bits |= (unsigned long long)a->out[o];
	return (bits & 15u) == 0;
}

#define GCCL_REDUCE_KERNEL(dt, op) \
	GCCL_ENTRY gccl_reduce_##dt##_##op(struct gccl_reduce_args a) \
	{ \
		typedef gccl_T_##dt T; \
		typedef gccl_C_##dt C; \
		enum { V = 16 / sizeof(T) }; \
		const C m = gccl_scale_##dt(a.scalar); \
		const double s = a.scalar; \
		const unsigned long long n = a.count; \
		const int nin = a.nin, nout = a.nout; \
		const unsigned long long tid = (unsigned long long)(unsigned int)GCCL_CTAID_X() * (unsigned int)GCCL_NTID_X() + (unsigned int)GCCL_TID_X(); \
		const unsigned long long stride = (unsigned long long)(unsigned int)GCCL_NTID_X() * (unsigned int)GCCL_NCTAID_X(); \
		unsigned long long start = 0; \
		(void)m; \
		(void)s; \
		if (gccl_all_aligned16(&a)) { \
			const unsigned long long nv = n / V; \
			for (unsigned long long v = tid; v < nv; v += stride) { \
				union { gccl_vec16 v; T e[V]; } x; \
				C acc[V]; \
				x.v = GCCL_VEC16(a.in[0])[v]; \
				GCCL_UNROLL for (int k = 0; k < V; k++) \
					acc[k] = GCCL_PRE_##op(dt, gccl_ld_##dt(x.e[k]), m); \
				for (int j = 1; j < nin; j++) { \
					x.v = GCCL_VEC16(a.in[j])[v]; \
					GCCL_UNROLL for (int k = 0; k < V; k++) \
						acc[k] = GCCL_COMB_##op(dt, acc[k], GCCL_PRE_##op(dt, gccl_ld_##dt(x.e[k]), m)); \
				} \
				GCCL_UNROLL for (int k = 0; k < V; k++) \
					x.e[k] = gccl_st_##dt(GCCL_FIN_##op(dt, acc[k], s)); \
				for (int o = 0; o < nout; o++) \
					gccl_store16(GCCL_VEC16(a.out[o]) + v, x.v); \
			} \
			start = nv * V; \
		} \
		for (unsigned long long i = start + tid; i < n; i += stride) { \
			C acc = GCCL_PRE_##op(dt, gccl_ld_##dt(((const T *)a.in[0])[i]), m); \
			for (int j = 1; j < nin; j++) \
				acc = GCCL_COMB_##op(dt, acc, GCCL_PRE_##op(dt, gccl_ld_##dt(((const T *)a.in[j])[i]), m)); \
			const T r = gccl_st_##dt(GCCL_FIN_##op(dt, acc, s)); \
			for (int o = 0; o < nout; o++) \
				((T *)a.out[o])[i] = r; \
		} \
	}

GCCL_REDUCE_KERNELS(GCCL_REDUCE_KERNEL)
