//go:build unix

package main

import (
	"os"
	"syscall"
)

// killSelf dies as kill -9 kills: no deferred work, no goodbye to peers.
func killSelf() { syscall.Kill(os.Getpid(), syscall.SIGKILL) }

// stopSelf stops the process (SIGSTOP), as a hung rank looks to its peers.
func stopSelf() { syscall.Kill(os.Getpid(), syscall.SIGSTOP) }
