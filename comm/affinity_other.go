//go:build !linux

package comm

// Elsewhere the progress thread is left where the scheduler puts it.

func inheritedCPUs() ([]int, error) { return nil, ErrNotSupported }

func pinThread([]int) error { return ErrNotSupported }
