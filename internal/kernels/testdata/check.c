/*
 * check.c: checks the host emulation of reduce.cu (and so the C that the
 * PTX is compiled from). Built and run by kernels_test.go:
 *
 *   gcc -O2 -o check check.c && ./check CONVFILE SEED
 *
 * 1. Conversions, bit-exact against the Go converters of internal/reduce:
 *    CONVFILE holds the Go results of widening every float16, bfloat16,
 *    float8e4m3 and float8e5m2 bit pattern, then a count and records
 *    {u32 float32 bits; u16 f16; u16 bf16; u8 e4m3; u8 e5m2; u16 pad} of
 *    narrowing (little-endian).
 * 2. Every kernel on fresh random data (seeded by SEED) against a 64-bit
 *    reference: nin in {1,2,3,8}, nout in {1,3}, in place and not, aligned,
 *    unaligned, and aligned but for the last output or the last input
 *    (a misaligned vector access aborts in host emulation), several counts and launch shapes; bytes
 *    around the outputs and unaliased inputs must stay untouched.
 * Prints failures and exits 1 if any.
 */
#include "../hostemu.c"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define FAIL(...) \
	do { \
		if (failures++ < 30) \
			fprintf(stderr, __VA_ARGS__); \
	} while (0)

/* ---- 1. conversions ------------------------------------------------------ */

static uint32_t rd32(const unsigned char *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint16_t rd16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }

static long check_conversions(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL) {
		perror(path);
		exit(2);
	}
	fseek(f, 0, SEEK_END);
	long size = ftell(f);
	fseek(f, 0, SEEK_SET);
	unsigned char *buf = malloc((size_t)size);
	if (buf == NULL || fread(buf, 1, (size_t)size, f) != (size_t)size) {
		fprintf(stderr, "%s: short read\n", path);
		exit(2);
	}
	fclose(f);
	long want = (65536 + 65536 + 256 + 256 + 1) * 4;
	if (size < want) {
		fprintf(stderr, "%s: too short\n", path);
		exit(2);
	}
	const unsigned char *p = buf;
	long checked = 0;
	for (uint32_t h = 0; h < 65536; h++, p += 4, checked++)
		if (gccl_f32_bits(gccl_f16_to_f32((unsigned short)h)) != rd32(p))
			FAIL("f16 %04x widens to %08x, Go %08x\n", h, gccl_f32_bits(gccl_f16_to_f32((unsigned short)h)), rd32(p));
	for (uint32_t h = 0; h < 65536; h++, p += 4, checked++)
		if (gccl_f32_bits(gccl_bf16_to_f32((unsigned short)h)) != rd32(p))
			FAIL("bf16 %04x widens to %08x, Go %08x\n", h, gccl_f32_bits(gccl_bf16_to_f32((unsigned short)h)), rd32(p));
	for (uint32_t b = 0; b < 256; b++, p += 4, checked++)
		if (gccl_f32_bits(gccl_e4m3_to_f32((unsigned char)b)) != rd32(p))
			FAIL("e4m3 %02x widens to %08x, Go %08x\n", b, gccl_f32_bits(gccl_e4m3_to_f32((unsigned char)b)), rd32(p));
	for (uint32_t b = 0; b < 256; b++, p += 4, checked++)
		if (gccl_f32_bits(gccl_e5m2_to_f32((unsigned char)b)) != rd32(p))
			FAIL("e5m2 %02x widens to %08x, Go %08x\n", b, gccl_f32_bits(gccl_e5m2_to_f32((unsigned char)b)), rd32(p));
	uint32_t n = rd32(p);
	p += 4;
	if (size != want + (long)n * 12) {
		fprintf(stderr, "%s: size %ld, want %ld\n", path, size, want + (long)n * 12);
		exit(2);
	}
	for (uint32_t i = 0; i < n; i++, p += 12) {
		uint32_t x = rd32(p);
		float v = gccl_f32_frombits(x);
		unsigned short h = gccl_f32_to_f16(v), bh = gccl_f32_to_bf16(v);
		unsigned char e4 = gccl_f32_to_e4m3(v), e5 = gccl_f32_to_e5m2(v);
		if (h != rd16(p + 4))
			FAIL("f32 %08x narrows to f16 %04x, Go %04x\n", x, h, rd16(p + 4));
		if (bh != rd16(p + 6))
			FAIL("f32 %08x narrows to bf16 %04x, Go %04x\n", x, bh, rd16(p + 6));
		if (e4 != p[8])
			FAIL("f32 %08x narrows to e4m3 %02x, Go %02x\n", x, e4, p[8]);
		if (e5 != p[9])
			FAIL("f32 %08x narrows to e5m2 %02x, Go %02x\n", x, e5, p[9]);
		checked += 4;
	}
	free(buf);
	return checked;
}

/* ---- 2. kernels ---------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rnd(void)
{
	/* xorshift64* */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1DULL;
}

static double rnd_unit(void) { return (double)(rnd() >> 11) * 0x1p-53; } /* [0, 1) */

enum { K_SINT, K_UINT, K_FLOAT };

static const struct dtype {
	const char *name;
	int size;
	int kind;
	double range; /* floats: inputs in [-range, range] */
	double eps_t; /* unit roundoff of the type */
	double eps_c; /* unit roundoff of the compute type */
	double tiny;  /* smallest positive subnormal of the type */
} dtypes[] = {
	{"int8", 1, K_SINT, 0, 0, 0, 0},
	{"uint8", 1, K_UINT, 0, 0, 0, 0},
	{"int32", 4, K_SINT, 0, 0, 0, 0},
	{"uint32", 4, K_UINT, 0, 0, 0, 0},
	{"int64", 8, K_SINT, 0, 0, 0, 0},
	{"uint64", 8, K_UINT, 0, 0, 0, 0},
	{"float16", 2, K_FLOAT, 1000, 0x1p-11, 0x1p-24, 0x1p-24},
	{"bfloat16", 2, K_FLOAT, 1e4, 0x1p-8, 0x1p-24, 0x1p-133},
	{"float32", 4, K_FLOAT, 1e6, 0x1p-24, 0x1p-24, 0x1p-149},
	{"float64", 8, K_FLOAT, 1e6, 0x1p-53, 0x1p-53, 0x1p-1074},
	{"float8e4m3", 1, K_FLOAT, 48, 0x1p-4, 0x1p-24, 0x1p-9},
	{"float8e5m2", 1, K_FLOAT, 4096, 0x1p-3, 0x1p-24, 0x1p-16},
};
#define NDTYPES ((int)(sizeof dtypes / sizeof dtypes[0]))

enum { OP_SUM, OP_PROD, OP_MIN, OP_MAX, OP_PREMULSUM, OP_SUMDIV, NOPS };
static const char *const opnames[NOPS] = {"sum", "prod", "min", "max", "premulsum", "sumdiv"};

/* ld_int loads an integer element, sign- or zero-extended to 64 bits. */
static uint64_t ld_int(int dt, const unsigned char *p)
{
	switch (dt) {
	case 0: return (uint64_t)(int64_t)(int8_t)p[0];
	case 1: return p[0];
	case 2: { int32_t v; memcpy(&v, p, 4); return (uint64_t)(int64_t)v; }
	case 3: { uint32_t v; memcpy(&v, p, 4); return v; }
	default: { uint64_t v; memcpy(&v, p, 8); return v; }
	}
}

static void st_int(int dt, unsigned char *p, uint64_t v)
{
	switch (dtypes[dt].size) {
	case 1: p[0] = (unsigned char)v; break;
	case 4: { uint32_t w = (uint32_t)v; memcpy(p, &w, 4); break; }
	default: memcpy(p, &v, 8);
	}
}

/* ld_f widens a float element exactly (the converters are checked
 * bit-exact against Go before the kernels run). */
static double ld_f(int dt, const unsigned char *p)
{
	switch (dt) {
	case 6: return gccl_f16_to_f32((unsigned short)(p[0] | p[1] << 8));
	case 7: return gccl_bf16_to_f32((unsigned short)(p[0] | p[1] << 8));
	case 8: { float v; memcpy(&v, p, 4); return v; }
	case 9: { double v; memcpy(&v, p, 8); return v; }
	case 10: return gccl_e4m3_to_f32(p[0]);
	default: return gccl_e5m2_to_f32(p[0]);
	}
}

/* st_f stores v rounded to the type (through float32 for the narrow ones;
 * exact when v is representable). */
static void st_f(int dt, unsigned char *p, double v)
{
	switch (dt) {
	case 6: { unsigned short h = gccl_f32_to_f16((float)v); p[0] = (unsigned char)h; p[1] = (unsigned char)(h >> 8); break; }
	case 7: { unsigned short h = gccl_f32_to_bf16((float)v); p[0] = (unsigned char)h; p[1] = (unsigned char)(h >> 8); break; }
	case 8: { float f = (float)v; memcpy(p, &f, 4); break; }
	case 9: memcpy(p, &v, 8); break;
	case 10: p[0] = gccl_f32_to_e4m3((float)v); break;
	default: p[0] = gccl_f32_to_e5m2((float)v);
	}
}

static void fill_input(int dt, int op, unsigned char *p, unsigned long long count)
{
	const struct dtype *d = &dtypes[dt];
	for (unsigned long long i = 0; i < count; i++, p += d->size) {
		if (d->kind != K_FLOAT) {
			st_int(dt, p, rnd());
			continue;
		}
		double v;
		uint64_t r = rnd();
		if (op == OP_PROD) {
			v = 0.5 + 1.5 * rnd_unit();
			if (r & 1)
				v = -v;
		} else if ((r & 15) == 0) {
			v = (r & 16) ? -0.0 : 0.0; /* zeros of both signs for min/max */
		} else {
			v = (2 * rnd_unit() - 1) * d->range;
		}
		st_f(dt, p, v);
	}
}

static double scalar_for(int dt, int op)
{
	int isint = dtypes[dt].kind != K_FLOAT;
	if (op == OP_PREMULSUM)
		return isint ? -2.7 : 0.3; /* integer multiplier -2 */
	if (op == OP_SUMDIV)
		return isint ? 3.9 : 3.0; /* integer divisor 3 */
	return 12345.0; /* ignored */
}

/* fmin_z and fmax_z are the kernels' min and max on non-NaN values. */
static double fmin_z(double a, double b)
{
	if (a == b)
		return signbit(a) ? a : b;
	return a < b ? a : b;
}

static double fmax_z(double a, double b)
{
	if (a == b)
		return signbit(a) ? b : a;
	return a > b ? a : b;
}

/* check_element compares one result element against the reference computed
 * from the inputs' element values x[0..nin-1]. */
static int check_element(int dt, int op, const unsigned char *const *x, int nin, double scalar,
			 const unsigned char *got, char *why, size_t whylen)
{
	const struct dtype *d = &dtypes[dt];
	unsigned char want[8];
	if (d->kind != K_FLOAT) {
		int sgn = d->kind == K_SINT;
		uint64_t acc = ld_int(dt, x[0]);
		uint64_t m = (uint64_t)(int64_t)scalar;
		if (op == OP_PREMULSUM)
			acc *= m;
		for (int j = 1; j < nin; j++) {
			uint64_t v = ld_int(dt, x[j]);
			switch (op) {
			case OP_SUM: case OP_SUMDIV: acc += v; break;
			case OP_PROD: acc *= v; break;
			case OP_PREMULSUM: acc += v * m; break;
			case OP_MIN: if (sgn ? (int64_t)v < (int64_t)acc : v < acc) acc = v; break;
			case OP_MAX: if (sgn ? (int64_t)v > (int64_t)acc : v > acc) acc = v; break;
			}
		}
		if (op == OP_SUMDIV) {
			unsigned char t[8];
			st_int(dt, t, acc);
			uint64_t w = ld_int(dt, t); /* wrapped to the type, re-extended */
			int64_t dv = (int64_t)scalar;
			acc = sgn ? (uint64_t)((int64_t)w / dv) : w / (uint64_t)dv;
		}
		st_int(dt, want, acc);
		if (memcmp(want, got, (size_t)d->size) != 0) {
			snprintf(why, whylen, "got %llx, want %llx", (unsigned long long)ld_int(dt, got), (unsigned long long)ld_int(dt, want));
			return 0;
		}
		return 1;
	}
	double ref = ld_f(dt, x[0]), mag, tol;
	switch (op) {
	case OP_MIN: case OP_MAX:
		for (int j = 1; j < nin; j++)
			ref = op == OP_MIN ? fmin_z(ref, ld_f(dt, x[j])) : fmax_z(ref, ld_f(dt, x[j]));
		st_f(dt, want, ref);
		if (memcmp(want, got, (size_t)d->size) != 0) {
			snprintf(why, whylen, "got %.17g, want %.17g (bits differ)", ld_f(dt, got), ref);
			return 0;
		}
		return 1;
	case OP_PROD:
		for (int j = 1; j < nin; j++)
			ref *= ld_f(dt, x[j]);
		tol = (nin + 1) * d->eps_c * fabs(ref) + d->eps_t * fabs(ref) + d->tiny;
		break;
	default: { /* sum, premulsum, sumdiv */
		double f = op == OP_PREMULSUM ? scalar : 1;
		ref = ref * f;
		mag = fabs(ref);
		for (int j = 1; j < nin; j++) {
			double t = ld_f(dt, x[j]) * f;
			ref += t;
			mag += fabs(t);
		}
		if (op == OP_SUMDIV) {
			ref /= scalar;
			mag /= scalar;
		}
		tol = (nin + 3) * d->eps_c * mag + d->eps_t * fabs(ref) + d->tiny;
	}
	}
	double g = ld_f(dt, got);
	if (!(fabs(g - ref) <= tol)) {
		snprintf(why, whylen, "got %.17g, want %.17g +- %.3g", g, ref, tol);
		return 0;
	}
	return 1;
}

static long run_case(int dt, int op, int nin, int nout, int inplace, int align, unsigned long long count,
		     unsigned grid, unsigned block)
{
	const struct dtype *d = &dtypes[dt];
	const size_t es = (size_t)d->size, pad = 64;
	const size_t bytes = count * es + 2 * pad;
	enum { MAXB = GCCL_MAX_INPUTS + GCCL_MAX_OUTPUTS };
	unsigned char *bufs[MAXB], *snap[MAXB], *ptr[MAXB];
	int nbuf = 0;
	int inbuf[GCCL_MAX_INPUTS], outbuf[GCCL_MAX_OUTPUTS], isout[MAXB];
	for (int j = 0; j < nin; j++)
		inbuf[j] = nbuf++;
	for (int o = 0; o < nout; o++) {
		if (inplace && o == 0)
			outbuf[o] = inbuf[0];
		else if (inplace && o == 1 && nin > 1)
			outbuf[o] = inbuf[nin - 1];
		else
			outbuf[o] = nbuf++;
	}
	memset(isout, 0, sizeof isout);
	for (int o = 0; o < nout; o++)
		isout[outbuf[o]] = 1;
	for (int b = 0; b < nbuf; b++) {
		bufs[b] = aligned_alloc(64, (bytes + 63) / 64 * 64);
		snap[b] = malloc(bytes);
		if (bufs[b] == NULL || snap[b] == NULL) {
			fprintf(stderr, "out of memory\n");
			exit(2);
		}
		for (size_t i = 0; i < bytes; i += 8) {
			uint64_t r = rnd();
			memcpy(bufs[b] + i, &r, bytes - i < 8 ? bytes - i : 8);
		}
		size_t off = pad;
		if (align == 1 || (align == 2 && b == outbuf[nout - 1]) || (align == 3 && b == inbuf[nin - 1]))
			off += es;
		ptr[b] = bufs[b] + off;
	}
	for (int j = 0; j < nin; j++)
		fill_input(dt, op, ptr[inbuf[j]], count);
	for (int b = 0; b < nbuf; b++)
		memcpy(snap[b], bufs[b], bytes);

	struct gccl_reduce_args args;
	memset(&args, 0, sizeof args);
	args.count = count;
	for (int j = 0; j < nin; j++)
		args.in[j] = ptr[inbuf[j]];
	for (int o = 0; o < nout; o++)
		args.out[o] = ptr[outbuf[o]];
	args.nin = nin;
	args.nout = nout;
	args.scalar = scalar_for(dt, op);
	char name[64];
	snprintf(name, sizeof name, "gccl_reduce_%s_%s", d->name, opnames[op]);
	int k = gccl_host_kernel_find(name);
	if (k < 0) {
		FAIL("%s: not found\n", name);
		return 0;
	}
	void *params[1] = {&args};
	gccl_host_kernel_launch(k, grid, block, params);

	char why[160];
	int bad = 0;
	for (int b = 0; b < nbuf && bad < 1; b++) {
		size_t lo = (size_t)(ptr[b] - bufs[b]), hi = lo + count * es;
		if (!isout[b])
			lo = hi = bytes;
		if (memcmp(bufs[b], snap[b], lo) != 0 || memcmp(bufs[b] + hi, snap[b] + hi, bytes - hi) != 0) {
			FAIL("%s nin=%d nout=%d inplace=%d align=%d count=%llu: buffer %d changed outside the output\n",
			     name, nin, nout, inplace, align, count, b);
			bad++;
		}
	}
	for (unsigned long long i = 0; i < count && bad < 1; i++) {
		const unsigned char *x[GCCL_MAX_INPUTS];
		for (int j = 0; j < nin; j++)
			x[j] = snap[inbuf[j]] + (ptr[inbuf[j]] - bufs[inbuf[j]]) + i * es;
		for (int o = 0; o < nout; o++) {
			const unsigned char *got = ptr[outbuf[o]] + i * es;
			if (!check_element(dt, op, x, nin, args.scalar, got, why, sizeof why)) {
				FAIL("%s nin=%d nout=%d inplace=%d align=%d count=%llu grid=%u block=%u: element %llu of output %d: %s\n",
				     name, nin, nout, inplace, align, count, grid, block, i, o, why);
				bad++;
				break;
			}
		}
	}
	for (int b = 0; b < nbuf; b++) {
		free(bufs[b]);
		free(snap[b]);
	}
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: check CONVFILE SEED\n");
		return 2;
	}
	long conv = check_conversions(argv[1]);
	rng_state = strtoull(argv[2], NULL, 0) | 1;

	if (gccl_host_kernel_find("gccl_reduce_float32_avg") != -1 || gccl_host_kernel_find(NULL) != -1)
		FAIL("gccl_host_kernel_find accepts a bogus name\n");
	static const int nins[] = {1, 2, 3, 8}, nouts[] = {1, 3};
	static const unsigned long long counts[] = {0, 1, 7, 33, 1000, 4099};
	static const unsigned shapes[][2] = {{1, 1}, {3, 32}, {2, 128}, {5, 7}};
	long runs = 0;
	unsigned shape = 0;
	for (int dt = 0; dt < NDTYPES; dt++)
		for (int op = 0; op < NOPS; op++)
			for (size_t a = 0; a < sizeof nins / sizeof nins[0]; a++)
				for (size_t b = 0; b < sizeof nouts / sizeof nouts[0]; b++)
					for (int inplace = 0; inplace < 2; inplace++)
						for (int align = 0; align < 4; align++)
							for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
								const unsigned *s = shapes[shape++ % 4];
								runs += run_case(dt, op, nins[a], nouts[b], inplace, align, counts[c], s[0], s[1]);
							}
	if (failures > 0) {
		fprintf(stderr, "%d failures\n", failures);
		return 1;
	}
	printf("ok: %ld conversions, %ld kernel runs\n", conv, runs);
	return 0;
}
