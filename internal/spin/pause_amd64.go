package spin

// Pause executes the CPU's spin-wait hint n times.
//
//go:noescape
func Pause(n int)
