//go:build unix

package p2p

import "syscall"

// rawIOSupported: the connection's descriptor can be read and written
// directly (see tcpConn, writeDirect).
const rawIOSupported = true

func rawWrite(fd uintptr, b []byte) (int, error) { return syscall.Write(int(fd), b) }
