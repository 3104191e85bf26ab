//go:build !linux

package p2p

import "os"

func openDirect(f *os.File) (*os.File, error) { return nil, ErrNotSupported }

func fileIdentity(f *os.File, st os.FileInfo) string { return f.Name() }
