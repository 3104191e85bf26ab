package p2p

import (
	"os"
	"path/filepath"
	"strings"
)

// pinMapped pins a mapped shared region for CUDA copies, once; unmap
// unpins it.
func (ra *remoteAgent) pinMapped(id uint32, dev int) {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	m := ra.maps[id]
	if m == nil || ra.pins[id] {
		return
	}
	ra.pins[id] = true
	ra.a.gpu.pin(m.Bytes(), dev)
}

// validSegment accepts only the names Agent.Alloc makes, in a shared-memory
// directory, so that metadata cannot make this agent map or remove any
// other file.
func validSegment(name string) bool {
	base := filepath.Base(name)
	return filepath.IsAbs(name) && filepath.Clean(name) == name &&
		strings.HasPrefix(base, "gccl-p2p-") && strings.Contains(base, "-buf") && !strings.ContainsAny(base, "/\\")
}

// removeSegment unlinks a dead peer's shared segment.
func removeSegment(name string) {
	if validSegment(name) {
		os.Remove(name)
	}
}
