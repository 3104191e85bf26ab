//go:build !amd64

package spin

// Pause is a short busy loop on architectures without an assembly hint.
func Pause(n int) {
	for i := 0; i < n; i++ {
		sink++
	}
}

var sink int
