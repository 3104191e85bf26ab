//go:build amd64 || arm64

package spin

// Pause executes the CPU's spin-wait hint n times: PAUSE on amd64, YIELD on
// arm64.
//
//go:noescape
func Pause(n int)
