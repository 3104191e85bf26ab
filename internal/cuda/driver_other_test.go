//go:build !linux || !cgo

package cuda

import (
	"errors"
	"testing"
)

// Without cgo on Linux, Load explains that it cannot load a driver at all.
func TestLoadUnsupportedBuild(t *testing.T) {
	if _, err := Load(); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("Load: %v", err)
	}
}
