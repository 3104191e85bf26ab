//go:build !linux

package topo

func (d Detector) gather() (*hostFacts, []string, error) {
	return nil, nil, ErrNotSupported
}
