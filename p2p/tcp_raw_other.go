//go:build !unix

package p2p

import "syscall"

// rawIOSupported: no direct descriptor I/O here; connections use plain
// reads and the buffered write path.
const rawIOSupported = false

func rawRead(uintptr, []byte) (int, error) { return 0, syscall.EINVAL }

func rawWrite(uintptr, []byte) (int, error) { return 0, syscall.EINVAL }

func rawPeek(uintptr) bool { return true }
