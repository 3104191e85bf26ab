//go:build unix

package p2p

import "syscall"

// rawIOSupported: the connection's descriptor can be read and written
// directly (see spinReader, writeDirect).
const rawIOSupported = true

func rawRead(fd uintptr, b []byte) (int, error) { return syscall.Read(int(fd), b) }

func rawWrite(fd uintptr, b []byte) (int, error) { return syscall.Write(int(fd), b) }
