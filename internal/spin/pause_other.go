//go:build !amd64 && !arm64

package spin

// Pause is a short busy loop on architectures without an assembly hint. It
// touches no shared variable: ranks spin on many cores at once, and a
// global counter would be a data race and a cache line they all write.
func Pause(n int) {
	for i := 0; i < n; i++ {
	}
}
