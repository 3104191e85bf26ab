#include "textflag.h"

// func Pause(n int)
TEXT ·Pause(SB), NOSPLIT, $0-8
	MOVQ n+0(FP), CX
	TESTQ CX, CX
	JLE done
loop:
	PAUSE
	DECQ CX
	JNZ loop
done:
	RET
