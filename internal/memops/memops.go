// Package memops holds memory primitives of the hot path that Go's copy does
// not offer. CopyNT copies with non-temporal stores: the destination lines go
// to memory without first being read into the cache (no read-for-ownership)
// and without evicting what the cache holds. A large copy into memory that
// will not be read soon, such as a peer's output buffer in the
// symmetric-memory all-reduce, then moves two bytes per byte copied instead
// of three. Prefault readies memory a hot path will use, so that its first
// access to each page costs nothing there.
package memops

// ntMinBytes is the smallest copy worth the non-temporal path: below it the
// alignment head and tail dominate and the data may well be read back soon.
const ntMinBytes = 4 << 10

// CopyNT copies min(len(dst), len(src)) bytes from src to dst, like copy, but
// with non-temporal stores where the CPU has them. The stores are fenced
// before CopyNT returns, so a later ordinary store (a flag, a message) is not
// seen before the data. dst and src must not overlap. It returns the number
// of bytes copied.
func CopyNT(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n < ntMinBytes || !haveNT {
		return copy(dst, src)
	}
	dst, src = dst[:n], src[:n]
	// Align the destination to 32 bytes; the kernel moves 128-byte blocks.
	head := int((32 - uintptrOf(dst)%32) % 32)
	copy(dst[:head], src[:head])
	body := (n - head) &^ 127
	copyNT(dst[head:head+body], src[head:head+body])
	copy(dst[head+body:], src[head+body:])
	return n
}
