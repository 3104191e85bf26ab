//go:build !linux

package memops

// populate does nothing where the kernel offers no way to populate a range
// ahead of use: Prefault's touches map the pages.
func populate(b []byte, write bool) error { return nil }
