//go:build !race

#include "textflag.h"

// func write(s *Slot, even uint64, w *[Words]uint64, count *atomic.Uint64, c uint64)
// Stores in program order, which x86 keeps: the odd sequence, the words,
// the even sequence, the count (unless nil).
TEXT ·write(SB), NOSPLIT, $0-40
	MOVQ s+0(FP), DI
	MOVQ even+8(FP), AX
	MOVQ w+16(FP), SI
	LEAQ -1(AX), CX
	MOVQ CX, 0(DI)
	MOVQ 0(SI), CX
	MOVQ CX, 8(DI)
	MOVQ 8(SI), CX
	MOVQ CX, 16(DI)
	MOVQ 16(SI), CX
	MOVQ CX, 24(DI)
	MOVQ 24(SI), CX
	MOVQ CX, 32(DI)
	MOVQ 32(SI), CX
	MOVQ CX, 40(DI)
	MOVQ AX, 0(DI)
	MOVQ count+24(FP), DI
	TESTQ DI, DI
	JZ done
	MOVQ c+32(FP), AX
	MOVQ AX, 0(DI)
done:
	RET
