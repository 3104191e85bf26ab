//go:build !unix

package tcp

import "syscall"

// The TCP transport reads and writes socket descriptors directly (see
// rawio_unix.go); elsewhere Listen reports that it is not supported.

func sockFD(syscall.RawConn) (int, error)                   { return -1, errUnsupportedOS }
func readFD(int, []byte) (int, error)                       { return 0, errUnsupportedOS }
func writeFD(int, []byte, []byte) (int, error)              { return 0, errUnsupportedOS }
func shutdownFD(int)                                        {}
func setSocketBuffers(_, _ string, _ syscall.RawConn) error { return nil }

const supported = false
