//go:build amd64 && !purego

#include "textflag.h"

// Element-wise kernels, all with the Go signature
//
//	func k(dst, a, b *byte, n int, stream bool)
//
// where n is a byte count. The AVX-512 kernels take any n (a multiple of the
// element size) and finish with one masked vector. The AVX2 kernels take an n
// that is a multiple of their step (32 bytes, 16 for float16); the Go wrapper
// runs the generic kernel on the rest.
//
// With stream set, whole unrolled blocks are written with non-temporal
// stores (VMOVNTDQ, then SFENCE), which skip the read-for-ownership of dst
// and leave the caches to the inputs; the caller sets it only for large,
// distinct buffers and has aligned dst to the vector size.
//
// Register use: DI dst, SI a, DX b, CX n, BX byte offset, AX scratch.
// An operation macro OP(b, a, r) leaves a op b in r, where r may be neither
// a nor b. Reading both inputs of a vector before storing its result keeps
// dst == a and dst == b (exact aliasing) correct. The operand order matters
// for Min/Max: VMAXPS b, a, r returns b when either is NaN, as the generic
// code does.

#define LOAD_ARGS \
	MOVQ dst+0(FP), DI; \
	MOVQ a+8(FP), SI; \
	MOVQ b+16(FP), DX; \
	MOVQ n+24(FP), CX; \
	XORQ BX, BX; \
	MOVBLZX stream+32(FP), AX; \
	TESTL AX, AX

// TAIL_MASK sets K1 to the low CX bits (CX < 64): the bytes left for the
// final, masked vector.
#define TAIL_MASK \
	MOVQ $1, AX; \
	SHLQ CX, AX; \
	DECQ AX; \
	KMOVQ AX, K1

// ---- Operations -------------------------------------------------------

#define OP_ADDPS(b, a, r) VADDPS b, a, r
#define OP_MULPS(b, a, r) VMULPS b, a, r
#define OP_ADDPD(b, a, r) VADDPD b, a, r
#define OP_MULPD(b, a, r) VMULPD b, a, r
#define OP_PADDB(b, a, r) VPADDB b, a, r
#define OP_PADDD(b, a, r) VPADDD b, a, r
#define OP_PADDQ(b, a, r) VPADDQ b, a, r
#define OP_PMULLD(b, a, r) VPMULLD b, a, r
#define OP_PMULLQ(b, a, r) VPMULLQ b, a, r
#define OP_PMINSB(b, a, r) VPMINSB b, a, r
#define OP_PMAXSB(b, a, r) VPMAXSB b, a, r
#define OP_PMINUB(b, a, r) VPMINUB b, a, r
#define OP_PMAXUB(b, a, r) VPMAXUB b, a, r
#define OP_PMINSD(b, a, r) VPMINSD b, a, r
#define OP_PMAXSD(b, a, r) VPMAXSD b, a, r
#define OP_PMINUD(b, a, r) VPMINUD b, a, r
#define OP_PMAXUD(b, a, r) VPMAXUD b, a, r
#define OP_PMINSQ(b, a, r) VPMINSQ b, a, r
#define OP_PMAXSQ(b, a, r) VPMAXSQ b, a, r
#define OP_PMINUQ(b, a, r) VPMINUQ b, a, r
#define OP_PMAXUQ(b, a, r) VPMAXUQ b, a, r

// Byte multiply (there is no instruction for it): multiply 16-bit lanes
// twice. The low byte of a word product depends only on the low bytes, so
// VPMULLW b, a gives the even bytes' products in the low bytes; a's odd
// byte shifted down times b's odd byte left in place gives the odd
// bytes' products in the high bytes, with zero low bytes. The constant
// 0xff00 in every word is in Z28 (AVX-512) or Y13 (AVX2); 0xDC is
// VPTERNLOG's (A &^ C) | B.
#define OP_PMULLB512(b, a, r) \
	VPSRLW $8, a, Z12; \
	VPANDD Z28, b, Z13; \
	VPMULLW Z13, Z12, Z13; \
	VPMULLW b, a, r; \
	VPTERNLOGD $0xDC, Z28, Z13, r
#define OP_PMULLB256(b, a, r) \
	VPSRLW $8, a, Y14; \
	VPAND Y13, b, Y15; \
	VPMULLW Y15, Y14, Y15; \
	VPMULLW b, a, r; \
	VPANDN r, Y13, r; \
	VPOR Y15, r, r

// Float min/max: MAXPS returns b unless a > b. Where a == b (which includes
// +0 == -0) the result is a&b for max and a|b for min, so max(+0,-0) = +0 and
// min(+0,-0) = -0 whatever the operand order. The generic kernels do the same.
#define OP_MAXPS512(b, a, r) VCMPPS $0, b, a, K2; VMAXPS b, a, r; VPANDD b, a, K2, r
#define OP_MINPS512(b, a, r) VCMPPS $0, b, a, K2; VMINPS b, a, r; VPORD b, a, K2, r
#define OP_MAXPD512(b, a, r) VCMPPD $0, b, a, K2; VMAXPD b, a, r; VPANDQ b, a, K2, r
#define OP_MINPD512(b, a, r) VCMPPD $0, b, a, K2; VMINPD b, a, r; VPORQ b, a, K2, r

// The AVX2 forms blend through Y14 (equal mask) and Y15 (a&b or a|b).
#define OP_MAXPS256(b, a, r) VCMPPS $0, b, a, Y14; VANDPS b, a, Y15; VMAXPS b, a, r; VBLENDVPS Y14, Y15, r, r
#define OP_MINPS256(b, a, r) VCMPPS $0, b, a, Y14; VORPS b, a, Y15; VMINPS b, a, r; VBLENDVPS Y14, Y15, r, r
#define OP_MAXPD256(b, a, r) VCMPPD $0, b, a, Y14; VANDPD b, a, Y15; VMAXPD b, a, r; VBLENDVPD Y14, Y15, r, r
#define OP_MINPD256(b, a, r) VCMPPD $0, b, a, Y14; VORPD b, a, Y15; VMINPD b, a, r; VBLENDVPD Y14, Y15, r, r

// ---- Same-width kernels (integers, float32, float64) ------------------

// PLAIN512: 4 x 64 bytes per iteration, then 64 at a time, then a masked
// vector for the last n%64 bytes (byte-granular mask, so one body serves
// every element size).
#define PLAIN512(OP) \
	LOAD_ARGS; \
	JNZ nt; \
	CMPQ CX, $256; \
	JB one; \
four: \
	VMOVDQU64 (SI)(BX*1), Z0; \
	VMOVDQU64 64(SI)(BX*1), Z1; \
	VMOVDQU64 128(SI)(BX*1), Z2; \
	VMOVDQU64 192(SI)(BX*1), Z3; \
	VMOVDQU64 (DX)(BX*1), Z4; \
	VMOVDQU64 64(DX)(BX*1), Z5; \
	VMOVDQU64 128(DX)(BX*1), Z6; \
	VMOVDQU64 192(DX)(BX*1), Z7; \
	OP(Z4, Z0, Z8); \
	OP(Z5, Z1, Z9); \
	OP(Z6, Z2, Z10); \
	OP(Z7, Z3, Z11); \
	VMOVDQU64 Z8, (DI)(BX*1); \
	VMOVDQU64 Z9, 64(DI)(BX*1); \
	VMOVDQU64 Z10, 128(DI)(BX*1); \
	VMOVDQU64 Z11, 192(DI)(BX*1); \
	ADDQ $256, BX; \
	LEAQ 256(BX), AX; \
	CMPQ AX, CX; \
	JBE four; \
one: \
	LEAQ 64(BX), AX; \
	CMPQ AX, CX; \
	JA tail; \
	VMOVDQU64 (SI)(BX*1), Z0; \
	VMOVDQU64 (DX)(BX*1), Z4; \
	OP(Z4, Z0, Z8); \
	VMOVDQU64 Z8, (DI)(BX*1); \
	MOVQ AX, BX; \
	JMP one; \
tail: \
	SUBQ BX, CX; \
	JZ done; \
	TAIL_MASK; \
	VMOVDQU8.Z (SI)(BX*1), K1, Z0; \
	VMOVDQU8.Z (DX)(BX*1), K1, Z4; \
	OP(Z4, Z0, Z8); \
	VMOVDQU8 Z8, K1, (DI)(BX*1); \
done: \
	VZEROUPPER; \
	RET; \
nt: \
	LEAQ 256(BX), AX; \
	CMPQ AX, CX; \
	JA ntdone; \
	VMOVDQU64 (SI)(BX*1), Z0; \
	VMOVDQU64 64(SI)(BX*1), Z1; \
	VMOVDQU64 128(SI)(BX*1), Z2; \
	VMOVDQU64 192(SI)(BX*1), Z3; \
	VMOVDQU64 (DX)(BX*1), Z4; \
	VMOVDQU64 64(DX)(BX*1), Z5; \
	VMOVDQU64 128(DX)(BX*1), Z6; \
	VMOVDQU64 192(DX)(BX*1), Z7; \
	OP(Z4, Z0, Z8); \
	OP(Z5, Z1, Z9); \
	OP(Z6, Z2, Z10); \
	OP(Z7, Z3, Z11); \
	VMOVNTDQ Z8, (DI)(BX*1); \
	VMOVNTDQ Z9, 64(DI)(BX*1); \
	VMOVNTDQ Z10, 128(DI)(BX*1); \
	VMOVNTDQ Z11, 192(DI)(BX*1); \
	MOVQ AX, BX; \
	JMP nt; \
ntdone: \
	SFENCE; \
	JMP one

// PLAIN256: 4 x 32 bytes per iteration, then 32 at a time; n % 32 == 0.
// Uses Y0-Y11 and leaves Y14/Y15 to the operation.
#define PLAIN256(OP) \
	LOAD_ARGS; \
	JNZ nt; \
	CMPQ CX, $128; \
	JB one; \
four: \
	VMOVDQU (SI)(BX*1), Y0; \
	VMOVDQU 32(SI)(BX*1), Y1; \
	VMOVDQU 64(SI)(BX*1), Y2; \
	VMOVDQU 96(SI)(BX*1), Y3; \
	VMOVDQU (DX)(BX*1), Y4; \
	VMOVDQU 32(DX)(BX*1), Y5; \
	VMOVDQU 64(DX)(BX*1), Y6; \
	VMOVDQU 96(DX)(BX*1), Y7; \
	OP(Y4, Y0, Y8); \
	OP(Y5, Y1, Y9); \
	OP(Y6, Y2, Y10); \
	OP(Y7, Y3, Y11); \
	VMOVDQU Y8, (DI)(BX*1); \
	VMOVDQU Y9, 32(DI)(BX*1); \
	VMOVDQU Y10, 64(DI)(BX*1); \
	VMOVDQU Y11, 96(DI)(BX*1); \
	ADDQ $128, BX; \
	LEAQ 128(BX), AX; \
	CMPQ AX, CX; \
	JBE four; \
one: \
	CMPQ BX, CX; \
	JAE done; \
	VMOVDQU (SI)(BX*1), Y0; \
	VMOVDQU (DX)(BX*1), Y4; \
	OP(Y4, Y0, Y8); \
	VMOVDQU Y8, (DI)(BX*1); \
	ADDQ $32, BX; \
	JMP one; \
done: \
	VZEROUPPER; \
	RET; \
nt: \
	LEAQ 128(BX), AX; \
	CMPQ AX, CX; \
	JA ntdone; \
	VMOVDQU (SI)(BX*1), Y0; \
	VMOVDQU 32(SI)(BX*1), Y1; \
	VMOVDQU 64(SI)(BX*1), Y2; \
	VMOVDQU 96(SI)(BX*1), Y3; \
	VMOVDQU (DX)(BX*1), Y4; \
	VMOVDQU 32(DX)(BX*1), Y5; \
	VMOVDQU 64(DX)(BX*1), Y6; \
	VMOVDQU 96(DX)(BX*1), Y7; \
	OP(Y4, Y0, Y8); \
	OP(Y5, Y1, Y9); \
	OP(Y6, Y2, Y10); \
	OP(Y7, Y3, Y11); \
	VMOVNTDQ Y8, (DI)(BX*1); \
	VMOVNTDQ Y9, 32(DI)(BX*1); \
	VMOVNTDQ Y10, 64(DI)(BX*1); \
	VMOVNTDQ Y11, 96(DI)(BX*1); \
	MOVQ AX, BX; \
	JMP nt; \
ntdone: \
	SFENCE; \
	JMP one

// ---- float16 (F16C): widen with VCVTPH2PS, narrow with VCVTPS2PH $0 (round
// to nearest even, independent of MXCSR) -------------------------------

// HALF512: 16 elements (32 bytes) per vector, 4 per iteration, masked tail.
#define HALF512(OP) \
	LOAD_ARGS; \
	JNZ nt; \
	CMPQ CX, $128; \
	JB one; \
four: \
	VCVTPH2PS (SI)(BX*1), Z0; \
	VCVTPH2PS 32(SI)(BX*1), Z1; \
	VCVTPH2PS 64(SI)(BX*1), Z2; \
	VCVTPH2PS 96(SI)(BX*1), Z3; \
	VCVTPH2PS (DX)(BX*1), Z4; \
	VCVTPH2PS 32(DX)(BX*1), Z5; \
	VCVTPH2PS 64(DX)(BX*1), Z6; \
	VCVTPH2PS 96(DX)(BX*1), Z7; \
	OP(Z4, Z0, Z8); \
	OP(Z5, Z1, Z9); \
	OP(Z6, Z2, Z10); \
	OP(Z7, Z3, Z11); \
	VCVTPS2PH $0, Z8, (DI)(BX*1); \
	VCVTPS2PH $0, Z9, 32(DI)(BX*1); \
	VCVTPS2PH $0, Z10, 64(DI)(BX*1); \
	VCVTPS2PH $0, Z11, 96(DI)(BX*1); \
	ADDQ $128, BX; \
	LEAQ 128(BX), AX; \
	CMPQ AX, CX; \
	JBE four; \
one: \
	LEAQ 32(BX), AX; \
	CMPQ AX, CX; \
	JA tail; \
	VCVTPH2PS (SI)(BX*1), Z0; \
	VCVTPH2PS (DX)(BX*1), Z4; \
	OP(Z4, Z0, Z8); \
	VCVTPS2PH $0, Z8, (DI)(BX*1); \
	MOVQ AX, BX; \
	JMP one; \
tail: \
	SUBQ BX, CX; \
	JZ done; \
	TAIL_MASK; \
	VMOVDQU8.Z (SI)(BX*1), K1, Y0; \
	VMOVDQU8.Z (DX)(BX*1), K1, Y4; \
	VCVTPH2PS Y0, Z0; \
	VCVTPH2PS Y4, Z4; \
	OP(Z4, Z0, Z8); \
	VCVTPS2PH $0, Z8, Y8; \
	VMOVDQU8 Y8, K1, (DI)(BX*1); \
done: \
	VZEROUPPER; \
	RET; \
nt: \
	LEAQ 128(BX), AX; \
	CMPQ AX, CX; \
	JA ntdone; \
	VCVTPH2PS (SI)(BX*1), Z0; \
	VCVTPH2PS 32(SI)(BX*1), Z1; \
	VCVTPH2PS 64(SI)(BX*1), Z2; \
	VCVTPH2PS 96(SI)(BX*1), Z3; \
	VCVTPH2PS (DX)(BX*1), Z4; \
	VCVTPH2PS 32(DX)(BX*1), Z5; \
	VCVTPH2PS 64(DX)(BX*1), Z6; \
	VCVTPH2PS 96(DX)(BX*1), Z7; \
	OP(Z4, Z0, Z8); \
	OP(Z5, Z1, Z9); \
	OP(Z6, Z2, Z10); \
	OP(Z7, Z3, Z11); \
	VCVTPS2PH $0, Z8, Y8; \
	VCVTPS2PH $0, Z9, Y9; \
	VCVTPS2PH $0, Z10, Y10; \
	VCVTPS2PH $0, Z11, Y11; \
	VMOVNTDQ Y8, (DI)(BX*1); \
	VMOVNTDQ Y9, 32(DI)(BX*1); \
	VMOVNTDQ Y10, 64(DI)(BX*1); \
	VMOVNTDQ Y11, 96(DI)(BX*1); \
	MOVQ AX, BX; \
	JMP nt; \
ntdone: \
	SFENCE; \
	JMP one

// HALF256: 8 elements (16 bytes) per vector, 4 per iteration; n % 16 == 0.
#define HALF256(OP) \
	LOAD_ARGS; \
	JNZ nt; \
	CMPQ CX, $64; \
	JB one; \
four: \
	VCVTPH2PS (SI)(BX*1), Y0; \
	VCVTPH2PS 16(SI)(BX*1), Y1; \
	VCVTPH2PS 32(SI)(BX*1), Y2; \
	VCVTPH2PS 48(SI)(BX*1), Y3; \
	VCVTPH2PS (DX)(BX*1), Y4; \
	VCVTPH2PS 16(DX)(BX*1), Y5; \
	VCVTPH2PS 32(DX)(BX*1), Y6; \
	VCVTPH2PS 48(DX)(BX*1), Y7; \
	OP(Y4, Y0, Y8); \
	OP(Y5, Y1, Y9); \
	OP(Y6, Y2, Y10); \
	OP(Y7, Y3, Y11); \
	VCVTPS2PH $0, Y8, (DI)(BX*1); \
	VCVTPS2PH $0, Y9, 16(DI)(BX*1); \
	VCVTPS2PH $0, Y10, 32(DI)(BX*1); \
	VCVTPS2PH $0, Y11, 48(DI)(BX*1); \
	ADDQ $64, BX; \
	LEAQ 64(BX), AX; \
	CMPQ AX, CX; \
	JBE four; \
one: \
	CMPQ BX, CX; \
	JAE done; \
	VCVTPH2PS (SI)(BX*1), Y0; \
	VCVTPH2PS (DX)(BX*1), Y4; \
	OP(Y4, Y0, Y8); \
	VCVTPS2PH $0, Y8, (DI)(BX*1); \
	ADDQ $16, BX; \
	JMP one; \
done: \
	VZEROUPPER; \
	RET; \
nt: \
	LEAQ 64(BX), AX; \
	CMPQ AX, CX; \
	JA ntdone; \
	VCVTPH2PS (SI)(BX*1), Y0; \
	VCVTPH2PS 16(SI)(BX*1), Y1; \
	VCVTPH2PS 32(SI)(BX*1), Y2; \
	VCVTPH2PS 48(SI)(BX*1), Y3; \
	VCVTPH2PS (DX)(BX*1), Y4; \
	VCVTPH2PS 16(DX)(BX*1), Y5; \
	VCVTPH2PS 32(DX)(BX*1), Y6; \
	VCVTPH2PS 48(DX)(BX*1), Y7; \
	OP(Y4, Y0, Y8); \
	OP(Y5, Y1, Y9); \
	OP(Y6, Y2, Y10); \
	OP(Y7, Y3, Y11); \
	VCVTPS2PH $0, Y8, X8; \
	VCVTPS2PH $0, Y9, X9; \
	VCVTPS2PH $0, Y10, X10; \
	VCVTPS2PH $0, Y11, X11; \
	VMOVNTDQ X8, (DI)(BX*1); \
	VMOVNTDQ X9, 16(DI)(BX*1); \
	VMOVNTDQ X10, 32(DI)(BX*1); \
	VMOVNTDQ X11, 48(DI)(BX*1); \
	MOVQ AX, BX; \
	JMP nt; \
ntdone: \
	SFENCE; \
	JMP one

// ---- bfloat16 ---------------------------------------------------------
//
// A 32-bit lane holds two bfloat16 values, e0 in the low half and e1 in the
// high half. e0 widens to float32 by a left shift and e1 by masking off the
// low half, so no lane-crossing shuffles are needed. Results are rounded to
// nearest even with integer operations rather than VCVTNEPS2BF16, which
// would flush subnormals to zero; this keeps the kernels bit-identical to the
// generic code. NaN results of the float ops never have low bits set (inputs
// are widened bfloat16, and the default NaN has none), so rounding cannot
// carry a NaN into an infinity, and no NaN test is needed.
//
// The AVX-512 form rounds both halves at once in 16-bit lanes: P holds the
// truncated results (e0's high half in the low word, e1's in the high word),
// L the discarded low halves in the same positions. A word of P is
// incremented when its L word is above 0x8000, or equal and P's word is odd,
// i.e. when (L | (P & 1)) > 0x8000 unsigned.
//
// Constants: Z28 = 0xffff0000, Z29 = 0x0000ffff, Z30 = 0x00010001 and
// Z31 = 0x80008000 in every 32-bit lane. 0xF8 is the VPTERNLOG truth table of
// A | (B & C), with Go's operand order C, B, A.

// BF16_STEP512 reduces the 32 elements in registers a and b into r.
#define BF16_STEP512(OP, a, b, r) \
	VPSLLD $16, a, Z12; \
	VPANDD Z28, a, Z13; \
	VPSLLD $16, b, Z14; \
	VPANDD Z28, b, Z15; \
	OP(Z14, Z12, Z16); \
	OP(Z15, Z13, Z17); \
	VPSRLD $16, Z16, r; \
	VPTERNLOGD $0xF8, Z28, Z17, r; \
	VPSLLD $16, Z17, Z18; \
	VPTERNLOGD $0xF8, Z29, Z16, Z18; \
	VPTERNLOGD $0xF8, Z30, r, Z18; \
	VPCMPUW $6, Z31, Z18, K3; \
	VPADDW Z30, r, K3, r

// The constant loads leave the flags of LOAD_ARGS intact.
#define BF16_CONST512 \
	MOVL $0xffff0000, AX; \
	VPBROADCASTD AX, Z28; \
	MOVL $0x0000ffff, AX; \
	VPBROADCASTD AX, Z29; \
	MOVL $0x00010001, AX; \
	VPBROADCASTD AX, Z30; \
	MOVL $0x80008000, AX; \
	VPBROADCASTD AX, Z31

// BF16x512: 64 bytes per vector, 2 per iteration, masked tail.
#define BF16x512(OP) \
	LOAD_ARGS; \
	BF16_CONST512; \
	JNZ nt; \
	CMPQ CX, $128; \
	JB one; \
two: \
	VMOVDQU64 (SI)(BX*1), Z0; \
	VMOVDQU64 (DX)(BX*1), Z1; \
	VMOVDQU64 64(SI)(BX*1), Z2; \
	VMOVDQU64 64(DX)(BX*1), Z3; \
	BF16_STEP512(OP, Z0, Z1, Z8); \
	BF16_STEP512(OP, Z2, Z3, Z9); \
	VMOVDQU64 Z8, (DI)(BX*1); \
	VMOVDQU64 Z9, 64(DI)(BX*1); \
	ADDQ $128, BX; \
	LEAQ 128(BX), AX; \
	CMPQ AX, CX; \
	JBE two; \
one: \
	LEAQ 64(BX), AX; \
	CMPQ AX, CX; \
	JA tail; \
	VMOVDQU64 (SI)(BX*1), Z0; \
	VMOVDQU64 (DX)(BX*1), Z1; \
	BF16_STEP512(OP, Z0, Z1, Z8); \
	VMOVDQU64 Z8, (DI)(BX*1); \
	MOVQ AX, BX; \
	JMP one; \
tail: \
	SUBQ BX, CX; \
	JZ done; \
	TAIL_MASK; \
	VMOVDQU8.Z (SI)(BX*1), K1, Z0; \
	VMOVDQU8.Z (DX)(BX*1), K1, Z1; \
	BF16_STEP512(OP, Z0, Z1, Z8); \
	VMOVDQU8 Z8, K1, (DI)(BX*1); \
done: \
	VZEROUPPER; \
	RET; \
nt: \
	LEAQ 128(BX), AX; \
	CMPQ AX, CX; \
	JA ntdone; \
	VMOVDQU64 (SI)(BX*1), Z0; \
	VMOVDQU64 (DX)(BX*1), Z1; \
	VMOVDQU64 64(SI)(BX*1), Z2; \
	VMOVDQU64 64(DX)(BX*1), Z3; \
	BF16_STEP512(OP, Z0, Z1, Z8); \
	BF16_STEP512(OP, Z2, Z3, Z9); \
	VMOVNTDQ Z8, (DI)(BX*1); \
	VMOVNTDQ Z9, 64(DI)(BX*1); \
	MOVQ AX, BX; \
	JMP nt; \
ntdone: \
	SFENCE; \
	JMP one

// The AVX2 form rounds each half on its own: r += 0x7fff + bit 16 of r, then
// the high half is kept. Constants: Y11 = 0xffff0000, Y12 = 1, Y13 = 0x7fff
// in every 32-bit lane; Y14/Y15 stay free for the operation.
#define BF16_ROUND256(r, t) VPSRLD $16, r, t; VPAND Y12, t, t; VPADDD Y13, t, t; VPADDD t, r, r

#define BF16_STEP256(OP, a, b, r) \
	VPSLLD $16, a, Y2; \
	VPAND Y11, a, Y3; \
	VPSLLD $16, b, Y4; \
	VPAND Y11, b, Y5; \
	OP(Y4, Y2, Y6); \
	OP(Y5, Y3, Y7); \
	BF16_ROUND256(Y6, Y8); \
	BF16_ROUND256(Y7, Y9); \
	VPSRLD $16, Y6, Y6; \
	VPAND Y11, Y7, Y7; \
	VPOR Y7, Y6, r

#define BF16_CONST256 \
	MOVL $0xffff0000, AX; \
	MOVD AX, X11; \
	VPBROADCASTD X11, Y11; \
	MOVL $1, AX; \
	MOVD AX, X12; \
	VPBROADCASTD X12, Y12; \
	MOVL $0x7fff, AX; \
	MOVD AX, X13; \
	VPBROADCASTD X13, Y13

// BF16x256: 32 bytes per vector; n % 32 == 0.
#define BF16x256(OP) \
	LOAD_ARGS; \
	BF16_CONST256; \
	JNZ nt; \
loop: \
	CMPQ BX, CX; \
	JAE done; \
	VMOVDQU (SI)(BX*1), Y0; \
	VMOVDQU (DX)(BX*1), Y1; \
	BF16_STEP256(OP, Y0, Y1, Y10); \
	VMOVDQU Y10, (DI)(BX*1); \
	ADDQ $32, BX; \
	JMP loop; \
done: \
	VZEROUPPER; \
	RET; \
nt: \
	LEAQ 32(BX), AX; \
	CMPQ AX, CX; \
	JA ntdone; \
	VMOVDQU (SI)(BX*1), Y0; \
	VMOVDQU (DX)(BX*1), Y1; \
	BF16_STEP256(OP, Y0, Y1, Y10); \
	VMOVNTDQ Y10, (DI)(BX*1); \
	MOVQ AX, BX; \
	JMP nt; \
ntdone: \
	SFENCE; \
	JMP loop

// ---- fp8 (AVX-512) ----------------------------------------------------
//
// 16 elements per vector, reduced in float32. An E4M3 byte is widened in a
// 32-bit lane (VPMOVZXBD) without a table: the magnitude bits m = b&0x7f
// placed at the top of a float32's fraction (m<<20) and the exponent bias
// difference added give a normal code's float32. A subnormal code gets the
// smallest normal's exponent instead, and that normal is then subtracted,
// exactly. (Multiplying m<<20, a float32 subnormal, by 2^120 is as exact,
// but a subnormal operand costs a microcode assist on Intel: 3x slower
// than the table on random codes.) The NaN code is blended in, then the
// sign. E5M2 widens through binary16 (WIDEN_E5M2H, below).
//
// Narrowing in 32-bit lanes (E4M3, and E5M2's Scale and Axpy) rounds to nearest even as narrowMagnitude does. A normal
// result rounds with integer ops on the float32 bits, as bfloat16's do.
// A result below the smallest normal is added to a float32 whose ulp is the
// smallest fp8 subnormal (2^14 for E4M3, 2^7 for E5M2): that add is the
// one, correctly rounded, step to the subnormal grid, and the sum's low bits
// are the code. Overflow (and, for E4M3, NaN) codes are blended last.
//
// Constants, in every 32-bit lane, loaded by FP8_CONST_E4M3 / _E5M2:
//
//	     E4M3        E5M2
//	Z16  8           -           first normal code
//	Z17  -           0x7e        NaN code without its low bit (E5M2)
//	Z18  0x80        0x80        sign of a code
//	Z19  1           1           rounding bit
//	Z20  0x7f        -           magnitude of a code, and the NaN's
//	Z23  0x7fc00000  0x7f800000  E4M3: the NaN's float32; E5M2: float32 exponent
//	Z24  0x7fffffff  0x7fffffff  float32 magnitude
//	Z25  2^14        2^7         subnormal rounding addend
//	Z26  0x3c800000  0x38800000  float32 bits of the smallest fp8 normal
//	Z28  0x7ffff     0xfffff     half a unit in the last place, less one
//	Z29  120<<23     112<<23     exponent bias difference
//	Z30  0x43e80000  0x476fffff  largest float32 that does not overflow
//	Z31  0x7f        0x7c        overflow code
//
// Z27 stays free for the scaling factor; a step uses Z0-Z5 and Z12-Z14.
// 0xF4 is VPTERNLOG's A | (B &^ C) and 0xF8 its A | (B & C) (Go's operand
// order C, B, A).

#define FP8_BCAST(v, z) MOVL $v, AX; VPBROADCASTD AX, z

#define FP8_CONST_E4M3 \
	FP8_BCAST(0x80, Z18); \
	FP8_BCAST(1, Z19); \
	FP8_BCAST(0x7f, Z20); \
	FP8_BCAST(8, Z16); \
	FP8_BCAST(0x7fc00000, Z23); \
	FP8_BCAST(0x7fffffff, Z24); \
	FP8_BCAST(0x46800000, Z25); \
	FP8_BCAST(0x3c800000, Z26); \
	FP8_BCAST(0x7ffff, Z28); \
	FP8_BCAST(0x3c000000, Z29); \
	FP8_BCAST(0x43e80000, Z30); \
	FP8_BCAST(0x7f, Z31)

#define FP8_CONST_E5M2 \
	FP8_BCAST(0x7e, Z17); \
	FP8_BCAST(0x80, Z18); \
	FP8_BCAST(1, Z19); \
	FP8_BCAST(0x7f800000, Z23); \
	FP8_BCAST(0x7fffffff, Z24); \
	FP8_BCAST(0x43000000, Z25); \
	FP8_BCAST(0x38800000, Z26); \
	FP8_BCAST(0xfffff, Z28); \
	FP8_BCAST(0x38000000, Z29); \
	FP8_BCAST(0x476fffff, Z30); \
	FP8_BCAST(0x7c, Z31)

// WIDEN_E4M3 turns the zero-extended codes in x into float32s in f: the
// magnitude bits (Z12) shifted into place (Z13) and rebiased, subnormal
// codes through the smallest normal, then the NaN code (its magnitude is
// 0x7f, Z20's value), then the sign. E5M2 widens through binary16
// (WIDEN_E5M2H below).
#define WIDEN_E4M3(x, f) \
	VPANDD Z20, x, Z12; \
	VPSLLD $20, Z12, Z13; \
	VPADDD Z29, Z13, f; \
	VPCMPUD $1, Z16, Z12, K3; \
	VPADDD Z26, Z13, K3, f; \
	VSUBPS Z26, f, K3, f; \
	VPCMPEQD Z20, Z12, K2; \
	VMOVDQA32 Z23, K2, f; \
	VPSLLD $24, x, Z12; \
	VPTERNLOGD $0xF4, Z24, Z12, f

// FP8_ROUND rounds the magnitudes of the float32s in r to codes in c,
// given the fraction's shift, overflow included, leaving the float32
// magnitudes in Z12 and the rounding bit in Z13; FP8_SIGN_CODE ORs the
// sign of r into c.
#define FP8_ROUND(r, c, shift) \
	VPANDD Z24, r, Z12; \
	VPSRLD $shift, Z12, Z13; \
	VPANDD Z19, Z13, Z13; \
	VPADDD Z28, Z12, c; \
	VPADDD Z13, c, c; \
	VPSUBD Z29, c, c; \
	VPSRLD $shift, c, c; \
	VPCMPUD $1, Z26, Z12, K2; \
	VADDPS Z25, Z12, Z14; \
	VPSUBD Z25, Z14, K2, c; \
	VPCMPUD $6, Z30, Z12, K3; \
	VMOVDQA32 Z31, K3, c

#define FP8_SIGN_CODE(r, c) \
	VPSRLD $24, r, Z13; \
	VPTERNLOGD $0xF8, Z18, Z13, c

// NARROW_E4M3 / _E5M2 round the float32s in r to codes in c's lanes.
#define NARROW_E4M3(r, c) \
	FP8_ROUND(r, c, 20); \
	FP8_SIGN_CODE(r, c)

#define NARROW_E5M2(r, c) \
	FP8_ROUND(r, c, 21); \
	VPCMPUD $6, Z23, Z12, K3; \
	VPORD Z17, Z13, K3, c; \
	FP8_SIGN_CODE(r, c)

// E5M2 is the top byte of a binary16, so with F16C its codes also widen
// in two steps: shift each into the high byte of a 16-bit lane, then
// VCVTPH2PS, which is exact (and quiets a signalling NaN, as the generic
// E5M2ToF32 does). WIDEN_E5M2H takes the codes zero-extended into the words
// of a Y register. NARROW_E5M2H rounds a reduction's float32 results with
// VCVTPS2PH $0 (to nearest even) and then the binary16s to their high
// byte, to nearest even with integer ops, leaving the codes in the words
// of c. Rounding twice gives what one rounding gives here: the float32 is
// the rounding to 24 bits of one sum, product, min or max of two numbers of
// 3 significant bits, and rounding such a result first to p bits and then
// to q gives the one rounding to q when p >= 2q+2 (24 >= 2*11+2, then
// 11 >= 2*3+2). That argument is for normal numbers; with the subnormal
// ranges and overflow included, TestFP8KernelsRoundAsTheFloat32Op checks
// every pair of codes. It is
// not so for Scale and Axpy, whose factor has 24 bits (a float32 just above
// an E5M2 midpoint can round to the midpoint as a binary16, and from there
// to the even side), so they narrow with NARROW_E5M2.
//
// Constants in every 16-bit lane, loaded by E5M2H_CONST: Y8 1, Y9 0x7f,
// Y10 0x7fff, Y11 0x7c00 (below Y16: the narrowing is AVX2 code, shared
// with the AVX2 kernels); Y12-Y14 are temporaries.
#define E5M2H_CONST \
	FP8_BCAST(0x00010001, Z8); \
	FP8_BCAST(0x007f007f, Z9); \
	FP8_BCAST(0x7fff7fff, Z10); \
	FP8_BCAST(0x7c007c00, Z11)

#define WIDEN_E5M2H(x, f) \
	VPSLLW $8, x, x; \
	VCVTPH2PS x, f

// E5M2H_ROUND is the narrowing in registers of either width: h, t and m
// are temporaries, the rest the constants. A NaN keeps its (quiet)
// binary16's high byte, as F32ToE5M2 keeps the payload's top bits:
// rounding could carry it into the sign.
#define E5M2H_ROUND(r, c, h, t, m, one, half, abs, inf) \
	VCVTPS2PH $0, r, h; \
	VPSRLW $8, h, t; \
	VPAND one, t, c; \
	VPADDW half, c, c; \
	VPADDW h, c, c; \
	VPSRLW $8, c, c; \
	VPAND abs, h, m; \
	VPCMPGTW inf, m, m; \
	VPBLENDVB m, t, c, c

#define NARROW_E5M2H(r, c) E5M2H_ROUND(r, c, Y12, Y13, Y14, Y8, Y9, Y10, Y11)

// FP8_OP reduces the widened codes in x (a) and y (b) into codes in r.
#define FP8_OP(WIDEN, OP, NARROW, x, y, r) \
	WIDEN(x, Z2); \
	WIDEN(y, Z3); \
	OP(Z3, Z2, Z4); \
	NARROW(Z4, r)

#define FP8_STEP(EXT, PACK, x, y, r, WIDEN, OP, NARROW, off) \
	EXT off(SI)(BX*1), x; \
	EXT off(DX)(BX*1), y; \
	FP8_OP(WIDEN, OP, NARROW, x, y, r); \
	PACK r, off(DI)(BX*1)

#define FP8_NTSTEP(EXT, PACK, x, y, r, WIDEN, OP, NARROW, off) \
	EXT off(SI)(BX*1), x; \
	EXT off(DX)(BX*1), y; \
	FP8_OP(WIDEN, OP, NARROW, x, y, r); \
	PACK r, X5; \
	VMOVNTDQ X5, off(DI)(BX*1)

// FP8x512: 16 bytes per vector, 4 per iteration, masked tail. EXT loads
// 16 codes zero-extended into x and y (VPMOVZXBD into Z0/Z1 for the 32-bit
// lanes of WIDEN_E4M3, VPMOVZXBW into Y0/Y1 for the 16-bit
// lanes of WIDEN_E5M2H); PACK stores the codes in r (Z5 or Y5) as bytes.
// Streamed stores are 16 bytes wide; the caller aligns dst to 16 at least.
#define FP8x512(CONST, EXT, PACK, x, y, r, WIDEN, OP, NARROW) \
	LOAD_ARGS; \
	CONST; \
	JNZ nt; \
	CMPQ CX, $64; \
	JB one; \
four: \
	FP8_STEP(EXT, PACK, x, y, r, WIDEN, OP, NARROW, 0); \
	FP8_STEP(EXT, PACK, x, y, r, WIDEN, OP, NARROW, 16); \
	FP8_STEP(EXT, PACK, x, y, r, WIDEN, OP, NARROW, 32); \
	FP8_STEP(EXT, PACK, x, y, r, WIDEN, OP, NARROW, 48); \
	ADDQ $64, BX; \
	LEAQ 64(BX), AX; \
	CMPQ AX, CX; \
	JBE four; \
one: \
	LEAQ 16(BX), AX; \
	CMPQ AX, CX; \
	JA tail; \
	FP8_STEP(EXT, PACK, x, y, r, WIDEN, OP, NARROW, 0); \
	MOVQ AX, BX; \
	JMP one; \
tail: \
	SUBQ BX, CX; \
	JZ done; \
	TAIL_MASK; \
	VMOVDQU8.Z (SI)(BX*1), K1, X0; \
	VMOVDQU8.Z (DX)(BX*1), K1, X1; \
	EXT X0, x; \
	EXT X1, y; \
	FP8_OP(WIDEN, OP, NARROW, x, y, r); \
	PACK r, K1, (DI)(BX*1); \
done: \
	VZEROUPPER; \
	RET; \
nt: \
	LEAQ 64(BX), AX; \
	CMPQ AX, CX; \
	JA ntdone; \
	FP8_NTSTEP(EXT, PACK, x, y, r, WIDEN, OP, NARROW, 0); \
	FP8_NTSTEP(EXT, PACK, x, y, r, WIDEN, OP, NARROW, 16); \
	FP8_NTSTEP(EXT, PACK, x, y, r, WIDEN, OP, NARROW, 32); \
	FP8_NTSTEP(EXT, PACK, x, y, r, WIDEN, OP, NARROW, 48); \
	MOVQ AX, BX; \
	JMP nt; \
ntdone: \
	SFENCE; \
	JMP one

// The kernels' three forms: codes in 32-bit lanes (E4M3, and the E5M2
// scaling kernels' narrowing), E5M2 widened through binary16 and narrowed
// in 32-bit lanes (Scale, Axpy), and E5M2 through binary16 both ways
// (the reductions).
#define FP8D512(CONST, WIDEN, OP, NARROW) FP8x512(CONST, VPMOVZXBD, VPMOVDB, Z0, Z1, Z5, WIDEN, OP, NARROW)
#define E5M2HD512(OP) FP8x512(FP8_CONST_E5M2, VPMOVZXBW, VPMOVDB, Y0, Y1, Z5, WIDEN_E5M2H, OP, NARROW_E5M2)
#define E5M2H512(OP) FP8x512(E5M2H_CONST, VPMOVZXBW, VPMOVWB, Y0, Y1, Y5, WIDEN_E5M2H, OP, NARROW_E5M2H)

// ---- fp8 (AVX2) -------------------------------------------------------
//
// Axpy only (the reductions and Scale with AVX2 were no faster than the
// generic tables). The same steps as the AVX-512 kernels, 8 elements per
// vector, with most constants in memory (AVX2 has 16 vector registers) and
// blends instead of masks; the compares are signed, which is exact on
// magnitudes. Results are packed to bytes through the 128-bit lanes and
// stored 8 bytes at a time, so these kernels never stream (the caller never
// asks them to).
// Registers: Y0-Y5 data, Y6-Y9 temporaries, Y10-Y13 constants, Y14/Y15
// the operation's.

// CONST32 defines a 32-byte constant, v in every 32-bit lane.
#define CONST32(name, v) \
	DATA name<>+0(SB)/4, $v; \
	DATA name<>+4(SB)/4, $v; \
	DATA name<>+8(SB)/4, $v; \
	DATA name<>+12(SB)/4, $v; \
	DATA name<>+16(SB)/4, $v; \
	DATA name<>+20(SB)/4, $v; \
	DATA name<>+24(SB)/4, $v; \
	DATA name<>+28(SB)/4, $v; \
	GLOBL name<>(SB), RODATA|NOPTR, $32

CONST32(byteHigh, 0xff00ff00)
CONST32(fp8Mag, 0x7f)
CONST32(fp8Sign, 0x80000000)
CONST32(fp8Abs, 0x7fffffff)
CONST32(fp8One, 0x1)
CONST32(fp8SignCode, 0x80)
CONST32(e4m3NaN, 0x7fc00000)
CONST32(e4m3Half, 0x7ffff)
CONST32(e4m3Bias, 0x3c000000)
CONST32(e4m3Sub, 0x46800000)
CONST32(e4m3MinNormal, 0x3c800000)
CONST32(e4m3Max, 0x43e80000)
CONST32(e5m2Exp, 0x7f800000)
CONST32(e5m2Half, 0xfffff)
CONST32(e5m2Bias, 0x38000000)
CONST32(e5m2Sub, 0x43000000)
CONST32(e5m2MinNormal, 0x38800000)
CONST32(e5m2Max, 0x476fffff)
CONST32(e5m2InfCode, 0x7c)
CONST32(e5m2NaNCode, 0x7e)
CONST32(e4m3FirstNormal, 0x8)
CONST32(e5m2hOne, 0x00010001)
CONST32(e5m2hHalf, 0x007f007f)
CONST32(e5m2hAbs, 0x7fff7fff)
CONST32(e5m2hInf, 0x7c007c00)

// FP8_CONST256_E4M3 / _E5M2 load the most used constants: Y10 the
// smallest normal's float32 bits, Y12 the exponent bias difference, and
// for E4M3's widening Y11 0x7f and Y13 the first normal code.
#define FP8_CONST256_E4M3 \
	VMOVDQU e4m3MinNormal<>(SB), Y10; \
	VMOVDQU fp8Mag<>(SB), Y11; \
	VMOVDQU e4m3Bias<>(SB), Y12; \
	VMOVDQU e4m3FirstNormal<>(SB), Y13

#define FP8_CONST256_E5M2 \
	VMOVDQU e5m2MinNormal<>(SB), Y10; \
	VMOVDQU e5m2Bias<>(SB), Y12

// WIDEN256_E4M3, FP8_ROUND256 and FP8_SIGN_CODE256 are the AVX-512
// macros' steps. FP8_ROUND256 leaves the float32 magnitudes in Y6 and the
// rounding bit in Y7. half, sub and max are the format's constants in
// memory, over its overflow code.
#define FP8_ROUND256(r, c, shift, half, sub, max, over) \
	VPAND fp8Abs<>(SB), r, Y6; \
	VPSRLD $shift, Y6, Y7; \
	VPAND fp8One<>(SB), Y7, Y7; \
	VPADDD half, Y6, c; \
	VPADDD Y7, c, c; \
	VPSUBD Y12, c, c; \
	VPSRLD $shift, c, c; \
	VADDPS sub, Y6, Y9; \
	VPSUBD sub, Y9, Y9; \
	VPCMPGTD Y6, Y10, Y8; \
	VBLENDVPS Y8, Y9, c, c; \
	VPCMPGTD max, Y6, Y8; \
	VBLENDVPS Y8, over, c, c

#define FP8_SIGN_CODE256(r, c) \
	VPSRLD $24, r, Y9; \
	VPAND fp8SignCode<>(SB), Y9, Y9; \
	VPOR Y9, c, c

#define WIDEN256_E4M3(x, f) \
	VPAND Y11, x, Y6; \
	VPSLLD $20, Y6, Y7; \
	VPADDD Y12, Y7, f; \
	VPADDD Y10, Y7, Y9; \
	VSUBPS Y10, Y9, Y9; \
	VPCMPGTD Y6, Y13, Y8; \
	VBLENDVPS Y8, Y9, f, f; \
	VPCMPEQD Y11, Y6, Y8; \
	VBLENDVPS Y8, e4m3NaN<>(SB), f, f; \
	VPSLLD $24, x, Y6; \
	VPAND fp8Sign<>(SB), Y6, Y6; \
	VPOR Y6, f, f

#define NARROW256_E4M3(r, c) \
	FP8_ROUND256(r, c, 20, e4m3Half<>(SB), e4m3Sub<>(SB), e4m3Max<>(SB), Y11); \
	FP8_SIGN_CODE256(r, c)

#define NARROW256_E5M2(r, c) \
	FP8_ROUND256(r, c, 21, e5m2Half<>(SB), e5m2Sub<>(SB), e5m2Max<>(SB), e5m2InfCode<>(SB)); \
	VPOR e5m2NaNCode<>(SB), Y7, Y7; \
	VPCMPGTD e5m2Exp<>(SB), Y6, Y8; \
	VBLENDVPS Y8, Y7, c, c; \
	FP8_SIGN_CODE256(r, c)

// E5M2H_CONST256, WIDEN256_E5M2H and NARROW256_E5M2H are the AVX2 forms
// of the binary16 path (E5M2H_CONST, WIDEN_E5M2H, NARROW_E5M2H): 8 codes in
// the words of an X register, constants in Y10-Y13, temporaries Y6-Y8.
#define E5M2H_CONST256 \
	VMOVDQU e5m2hOne<>(SB), Y10; \
	VMOVDQU e5m2hHalf<>(SB), Y11; \
	VMOVDQU e5m2hAbs<>(SB), Y12; \
	VMOVDQU e5m2hInf<>(SB), Y13

#define WIDEN256_E5M2H(x, f) \
	VPSLLW $8, x, x; \
	VCVTPH2PS x, f

#define NARROW256_E5M2H(r, c) E5M2H_ROUND(r, c, X6, X7, X8, X10, X11, X12, X13)

// PACKD256 / PACKW256 store the 8 codes in the 32-bit lanes of Y5 / the
// 16-bit lanes of X5 as 8 bytes.
#define PACKD256(off) \
	VEXTRACTI128 $1, Y5, X6; \
	VPACKUSDW X6, X5, X5; \
	VPACKUSWB X5, X5, X5; \
	VMOVQ X5, off(DI)(BX*1)

#define PACKW256(off) \
	VPACKUSWB X5, X5, X5; \
	VMOVQ X5, off(DI)(BX*1)

// FP8_STEP256 as FP8_STEP: EXT loads 8 codes into x and y (VPMOVZXBD into
// Y0/Y1 or VPMOVZXBW into X0/X1), and the result lands in Y5 or X5.
#define FP8_STEP256(EXT, PACK, x, y, r, WIDEN, OP, NARROW, off) \
	EXT off(SI)(BX*1), x; \
	EXT off(DX)(BX*1), y; \
	WIDEN(x, Y2); \
	WIDEN(y, Y3); \
	OP(Y3, Y2, Y4); \
	NARROW(Y4, r); \
	PACK(off)

// FP8x256: 8 bytes per vector, 4 per iteration; n % 8 == 0.
#define FP8x256(CONST, EXT, PACK, x, y, r, WIDEN, OP, NARROW) \
	CONST; \
	MOVQ dst+0(FP), DI; \
	MOVQ a+8(FP), SI; \
	MOVQ b+16(FP), DX; \
	MOVQ n+24(FP), CX; \
	XORQ BX, BX; \
	CMPQ CX, $32; \
	JB one; \
four: \
	FP8_STEP256(EXT, PACK, x, y, r, WIDEN, OP, NARROW, 0); \
	FP8_STEP256(EXT, PACK, x, y, r, WIDEN, OP, NARROW, 8); \
	FP8_STEP256(EXT, PACK, x, y, r, WIDEN, OP, NARROW, 16); \
	FP8_STEP256(EXT, PACK, x, y, r, WIDEN, OP, NARROW, 24); \
	ADDQ $32, BX; \
	LEAQ 32(BX), AX; \
	CMPQ AX, CX; \
	JBE four; \
one: \
	CMPQ BX, CX; \
	JAE done; \
	FP8_STEP256(EXT, PACK, x, y, r, WIDEN, OP, NARROW, 0); \
	ADDQ $8, BX; \
	JMP one; \
done: \
	VZEROUPPER; \
	RET

#define FP8D256(CONST, WIDEN, OP, NARROW) FP8x256(CONST, VPMOVZXBD, PACKD256, Y0, Y1, Y5, WIDEN, OP, NARROW)
#define E5M2HD256(OP) FP8x256(FP8_CONST256_E5M2, VPMOVZXBW, PACKD256, X0, X1, Y5, WIDEN256_E5M2H, OP, NARROW256_E5M2)
#define E5M2H256(OP) FP8x256(E5M2H_CONST256, VPMOVZXBW, PACKW256, X0, X1, X5, WIDEN256_E5M2H, OP, NARROW256_E5M2H)

// ---- Scaling (Axpy and Scale of PreMulSum and Avg) ---------------------
//
// These kernels take a sixth argument, the float32 factor s, which the TEXT
// broadcasts before the body into Z27 (AVX-512) or Y15 (AVX2): registers no
// body uses (Y14/Y15 are left to the operation). Axpy computes a + (b*s),
// the product rounded to float32 before the add, as the generic loops do;
// it overwrites b's register, which holds a widened or loaded copy of b.
// The product is the add's first source, as in the compiled Go loops: of
// two NaNs it is the one returned, so even a NaN's sign matches theirs.
// Scale computes a*s; it is called with b == a and ignores b.
#define OP_AXPYPS512(b, a, r) VMULPS Z27, b, b; VADDPS a, b, r
#define OP_SCALEPS512(b, a, r) VMULPS Z27, a, r
#define OP_AXPYPS256(b, a, r) VMULPS Y15, b, b; VADDPS a, b, r
#define OP_SCALEPS256(b, a, r) VMULPS Y15, a, r

// ---- Kernels ----------------------------------------------------------

// AVX-512 (F, BW, VL, DQ).
TEXT ·sumF32AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_ADDPS)
TEXT ·prodF32AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_MULPS)
TEXT ·minF32AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_MINPS512)
TEXT ·maxF32AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_MAXPS512)
TEXT ·sumF64AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_ADDPD)
TEXT ·prodF64AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_MULPD)
TEXT ·minF64AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_MINPD512)
TEXT ·maxF64AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_MAXPD512)
TEXT ·prod8AVX512(SB), NOSPLIT, $0-33
	MOVL $0xff00ff00, AX
	VPBROADCASTD AX, Z28
	PLAIN512(OP_PMULLB512)
TEXT ·sum8AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_PADDB)
TEXT ·minI8AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_PMINSB)
TEXT ·maxI8AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_PMAXSB)
TEXT ·minU8AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_PMINUB)
TEXT ·maxU8AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_PMAXUB)
TEXT ·sum32AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_PADDD)
TEXT ·prod32AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_PMULLD)
TEXT ·minI32AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_PMINSD)
TEXT ·maxI32AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_PMAXSD)
TEXT ·minU32AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_PMINUD)
TEXT ·maxU32AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_PMAXUD)
TEXT ·sum64AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_PADDQ)
TEXT ·prod64AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_PMULLQ)
TEXT ·minI64AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_PMINSQ)
TEXT ·maxI64AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_PMAXSQ)
TEXT ·minU64AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_PMINUQ)
TEXT ·maxU64AVX512(SB), NOSPLIT, $0-33
	PLAIN512(OP_PMAXUQ)
TEXT ·sumF16AVX512(SB), NOSPLIT, $0-33
	HALF512(OP_ADDPS)
TEXT ·prodF16AVX512(SB), NOSPLIT, $0-33
	HALF512(OP_MULPS)
TEXT ·minF16AVX512(SB), NOSPLIT, $0-33
	HALF512(OP_MINPS512)
TEXT ·maxF16AVX512(SB), NOSPLIT, $0-33
	HALF512(OP_MAXPS512)
TEXT ·sumBF16AVX512(SB), NOSPLIT, $0-33
	BF16x512(OP_ADDPS)
TEXT ·prodBF16AVX512(SB), NOSPLIT, $0-33
	BF16x512(OP_MULPS)
TEXT ·minBF16AVX512(SB), NOSPLIT, $0-33
	BF16x512(OP_MINPS512)
TEXT ·maxBF16AVX512(SB), NOSPLIT, $0-33
	BF16x512(OP_MAXPS512)
TEXT ·sumE4M3AVX512(SB), NOSPLIT, $0-33
	FP8D512(FP8_CONST_E4M3, WIDEN_E4M3, OP_ADDPS, NARROW_E4M3)
TEXT ·prodE4M3AVX512(SB), NOSPLIT, $0-33
	FP8D512(FP8_CONST_E4M3, WIDEN_E4M3, OP_MULPS, NARROW_E4M3)
TEXT ·minE4M3AVX512(SB), NOSPLIT, $0-33
	FP8D512(FP8_CONST_E4M3, WIDEN_E4M3, OP_MINPS512, NARROW_E4M3)
TEXT ·maxE4M3AVX512(SB), NOSPLIT, $0-33
	FP8D512(FP8_CONST_E4M3, WIDEN_E4M3, OP_MAXPS512, NARROW_E4M3)
TEXT ·sumE5M2AVX512(SB), NOSPLIT, $0-33
	E5M2H512(OP_ADDPS)
TEXT ·prodE5M2AVX512(SB), NOSPLIT, $0-33
	E5M2H512(OP_MULPS)
TEXT ·minE5M2AVX512(SB), NOSPLIT, $0-33
	E5M2H512(OP_MINPS512)
TEXT ·maxE5M2AVX512(SB), NOSPLIT, $0-33
	E5M2H512(OP_MAXPS512)

// AVX2 (+F16C for float16).
TEXT ·sumF32AVX2(SB), NOSPLIT, $0-33
	PLAIN256(OP_ADDPS)
TEXT ·prodF32AVX2(SB), NOSPLIT, $0-33
	PLAIN256(OP_MULPS)
TEXT ·minF32AVX2(SB), NOSPLIT, $0-33
	PLAIN256(OP_MINPS256)
TEXT ·maxF32AVX2(SB), NOSPLIT, $0-33
	PLAIN256(OP_MAXPS256)
TEXT ·sumF64AVX2(SB), NOSPLIT, $0-33
	PLAIN256(OP_ADDPD)
TEXT ·prodF64AVX2(SB), NOSPLIT, $0-33
	PLAIN256(OP_MULPD)
TEXT ·minF64AVX2(SB), NOSPLIT, $0-33
	PLAIN256(OP_MINPD256)
TEXT ·maxF64AVX2(SB), NOSPLIT, $0-33
	PLAIN256(OP_MAXPD256)
TEXT ·prod8AVX2(SB), NOSPLIT, $0-33
	VMOVDQU byteHigh<>(SB), Y13
	PLAIN256(OP_PMULLB256)
TEXT ·sum8AVX2(SB), NOSPLIT, $0-33
	PLAIN256(OP_PADDB)
TEXT ·minI8AVX2(SB), NOSPLIT, $0-33
	PLAIN256(OP_PMINSB)
TEXT ·maxI8AVX2(SB), NOSPLIT, $0-33
	PLAIN256(OP_PMAXSB)
TEXT ·minU8AVX2(SB), NOSPLIT, $0-33
	PLAIN256(OP_PMINUB)
TEXT ·maxU8AVX2(SB), NOSPLIT, $0-33
	PLAIN256(OP_PMAXUB)
TEXT ·sum32AVX2(SB), NOSPLIT, $0-33
	PLAIN256(OP_PADDD)
TEXT ·prod32AVX2(SB), NOSPLIT, $0-33
	PLAIN256(OP_PMULLD)
TEXT ·minI32AVX2(SB), NOSPLIT, $0-33
	PLAIN256(OP_PMINSD)
TEXT ·maxI32AVX2(SB), NOSPLIT, $0-33
	PLAIN256(OP_PMAXSD)
TEXT ·minU32AVX2(SB), NOSPLIT, $0-33
	PLAIN256(OP_PMINUD)
TEXT ·maxU32AVX2(SB), NOSPLIT, $0-33
	PLAIN256(OP_PMAXUD)
TEXT ·sum64AVX2(SB), NOSPLIT, $0-33
	PLAIN256(OP_PADDQ)
TEXT ·sumF16AVX2(SB), NOSPLIT, $0-33
	HALF256(OP_ADDPS)
TEXT ·prodF16AVX2(SB), NOSPLIT, $0-33
	HALF256(OP_MULPS)
TEXT ·minF16AVX2(SB), NOSPLIT, $0-33
	HALF256(OP_MINPS256)
TEXT ·maxF16AVX2(SB), NOSPLIT, $0-33
	HALF256(OP_MAXPS256)
TEXT ·sumBF16AVX2(SB), NOSPLIT, $0-33
	BF16x256(OP_ADDPS)
TEXT ·prodBF16AVX2(SB), NOSPLIT, $0-33
	BF16x256(OP_MULPS)
TEXT ·minBF16AVX2(SB), NOSPLIT, $0-33
	BF16x256(OP_MINPS256)
TEXT ·maxBF16AVX2(SB), NOSPLIT, $0-33
	BF16x256(OP_MAXPS256)
TEXT ·sumE5M2AVX2(SB), NOSPLIT, $0-33
	E5M2H256(OP_ADDPS)
TEXT ·prodE5M2AVX2(SB), NOSPLIT, $0-33
	E5M2H256(OP_MULPS)
TEXT ·minE5M2AVX2(SB), NOSPLIT, $0-33
	E5M2H256(OP_MINPS256)
TEXT ·maxE5M2AVX2(SB), NOSPLIT, $0-33
	E5M2H256(OP_MAXPS256)

// Scaling kernels: func k(dst, a, b *byte, n int, stream bool, s float32).
TEXT ·axpyF32AVX512(SB), NOSPLIT, $0-40
	VBROADCASTSS s+36(FP), Z27
	PLAIN512(OP_AXPYPS512)
TEXT ·scaleF32AVX512(SB), NOSPLIT, $0-40
	VBROADCASTSS s+36(FP), Z27
	PLAIN512(OP_SCALEPS512)
TEXT ·axpyF16AVX512(SB), NOSPLIT, $0-40
	VBROADCASTSS s+36(FP), Z27
	HALF512(OP_AXPYPS512)
TEXT ·scaleF16AVX512(SB), NOSPLIT, $0-40
	VBROADCASTSS s+36(FP), Z27
	HALF512(OP_SCALEPS512)
TEXT ·axpyBF16AVX512(SB), NOSPLIT, $0-40
	VBROADCASTSS s+36(FP), Z27
	BF16x512(OP_AXPYPS512)
TEXT ·scaleBF16AVX512(SB), NOSPLIT, $0-40
	VBROADCASTSS s+36(FP), Z27
	BF16x512(OP_SCALEPS512)
TEXT ·axpyE4M3AVX512(SB), NOSPLIT, $0-40
	VBROADCASTSS s+36(FP), Z27
	FP8D512(FP8_CONST_E4M3, WIDEN_E4M3, OP_AXPYPS512, NARROW_E4M3)
TEXT ·scaleE4M3AVX512(SB), NOSPLIT, $0-40
	VBROADCASTSS s+36(FP), Z27
	FP8D512(FP8_CONST_E4M3, WIDEN_E4M3, OP_SCALEPS512, NARROW_E4M3)
TEXT ·axpyE5M2AVX512(SB), NOSPLIT, $0-40
	VBROADCASTSS s+36(FP), Z27
	E5M2HD512(OP_AXPYPS512)
TEXT ·scaleE5M2AVX512(SB), NOSPLIT, $0-40
	VBROADCASTSS s+36(FP), Z27
	E5M2HD512(OP_SCALEPS512)
TEXT ·axpyF32AVX2(SB), NOSPLIT, $0-40
	VBROADCASTSS s+36(FP), Y15
	PLAIN256(OP_AXPYPS256)
TEXT ·scaleF32AVX2(SB), NOSPLIT, $0-40
	VBROADCASTSS s+36(FP), Y15
	PLAIN256(OP_SCALEPS256)
TEXT ·axpyF16AVX2(SB), NOSPLIT, $0-40
	VBROADCASTSS s+36(FP), Y15
	HALF256(OP_AXPYPS256)
TEXT ·scaleF16AVX2(SB), NOSPLIT, $0-40
	VBROADCASTSS s+36(FP), Y15
	HALF256(OP_SCALEPS256)
TEXT ·axpyBF16AVX2(SB), NOSPLIT, $0-40
	VBROADCASTSS s+36(FP), Y15
	BF16x256(OP_AXPYPS256)
TEXT ·scaleBF16AVX2(SB), NOSPLIT, $0-40
	VBROADCASTSS s+36(FP), Y15
	BF16x256(OP_SCALEPS256)
TEXT ·axpyE4M3AVX2(SB), NOSPLIT, $0-40
	VBROADCASTSS s+36(FP), Y15
	FP8D256(FP8_CONST256_E4M3, WIDEN256_E4M3, OP_AXPYPS256, NARROW256_E4M3)
TEXT ·axpyE5M2AVX2(SB), NOSPLIT, $0-40
	VBROADCASTSS s+36(FP), Y15
	E5M2HD256(OP_AXPYPS256)

// func cpuidECX(leaf, subleaf uint32) uint32
TEXT ·cpuidECX(SB), NOSPLIT, $0-12
	MOVL leaf+0(FP), AX
	MOVL subleaf+4(FP), CX
	CPUID
	MOVL CX, ret+8(FP)
	RET
