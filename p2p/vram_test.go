package p2p

import (
	"errors"
	"path/filepath"
	"testing"
)

// Without a CUDA driver (none installed, or a build without cgo),
// RegisterVRAM says why and wraps ErrNotSupported; VRAM descriptors then
// name no region.
func TestRegisterVRAMWithoutDriver(t *testing.T) {
	t.Setenv("GCCL_CUDA_LIBRARY", filepath.Join(t.TempDir(), "libcuda-absent.so"))
	a := newAgent(t, "a", Config{ListenAddr: "-"})
	if _, err := a.RegisterVRAM(1<<40, 10, 0); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("RegisterVRAM without a driver: %v", err)
	} else {
		t.Log(err)
	}
	if _, err := a.RegisterVRAM(1<<40, 0, 0); err == nil || errors.Is(err, ErrNotSupported) {
		t.Fatalf("zero length: %v", err)
	}
	if _, err := a.PrepareLocal(DescList{Type: VRAM, Descs: []Desc{{Addr: 1 << 40, Len: 10}}}); !errors.Is(err, ErrOutOfBounds) {
		t.Fatalf("VRAM descriptor without a region: %v", err)
	}
}
