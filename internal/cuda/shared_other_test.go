//go:build !linux || !cgo

package cuda

import (
	"errors"
	"testing"
)

// Without cgo on Linux there is no driver to share.
func TestOpenSharedUnsupportedBuild(t *testing.T) {
	if _, err := OpenShared(); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("OpenShared: %v", err)
	}
}
