//go:build !linux || !cgo

package verbs

// RegisterDmabuf reports why this build cannot register memory.
func (pd *PD) RegisterDmabuf(uint64, int, uint64, int, Access) (*MR, error) { return nil, errNoLoader }
