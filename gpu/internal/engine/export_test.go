package engine

import "github.com/gccl/gccl/internal/reduce"

// LoadedModules says how many kernel modules e's context has loaded.
func LoadedModules(e *Engine) int {
	k := &e.shared.kernels
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.mods)
}

// DeferredFrees says how many frees e's context has left for the release
// of its last hold.
func DeferredFrees(e *Engine) int {
	c := e.shared
	c.syncMu.Lock()
	defer c.syncMu.Unlock()
	return len(c.freeing)
}

// LoadedFrom says what e's context loaded for dt's kernels: "sm_90
// machine code", "sm_90 PTX".
func LoadedFrom(e *Engine, dt reduce.DType) string {
	k := &e.shared.kernels
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.mods[dt].arch
}
