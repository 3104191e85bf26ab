//go:build !linux

package spin

import "runtime"

// osYield falls back to yielding within the Go scheduler.
func osYield() { runtime.Gosched() }
