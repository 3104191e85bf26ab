//go:build unix

package launch

import (
	"errors"
	"syscall"
)

// signalGroup sends sig to the process group that child pid leads, which
// holds the rank and every process it started that did not move away.
// A group that is already empty is not an error.
func signalGroup(pid int, sig syscall.Signal) error {
	err := syscall.Kill(-pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// groupAlive reports whether any process (zombies included) is still in
// the group that pid led.
func groupAlive(pid int) bool {
	return syscall.Kill(-pid, 0) == nil
}
