//go:build unix && !linux

package launch

import "syscall"

// rankProcAttr puts each rank in a process group of its own, so that
// stopping a rank also stops what it started, and so that a terminal's
// Ctrl-C reaches only the launcher, which forwards it. (There is no
// Pdeathsig outside Linux: ranks may outlive a launcher killed with -9.)
func rankProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
