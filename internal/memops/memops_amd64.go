//go:build !purego

package memops

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

var haveNT = cpu.X86.HasAVX2

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// copyNTAVX2 copies n bytes, n a multiple of 128 and dst 32-byte aligned,
// with VMOVNTDQ, then SFENCE.
//
//go:noescape
func copyNTAVX2(dst, src *byte, n int)

func copyNT(dst, src []byte) {
	if len(dst) > 0 {
		copyNTAVX2(unsafe.SliceData(dst), unsafe.SliceData(src), len(dst))
	}
}
