//go:build !amd64 || purego

package memops

import "unsafe"

const haveNT = false

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func copyNT(dst, src []byte) { copy(dst, src) }
