package launch

import "syscall"

// rankProcAttr puts each rank in a process group of its own, so that
// stopping a rank also stops what it started, and so that a terminal's
// Ctrl-C reaches only the launcher, which forwards it.
//
// Pdeathsig kills a rank if the launcher dies without cleaning up (kill
// -9, OOM killer), so ranks never outlive their launcher and spin waiting
// for peers. Linux sends it when the thread that started the child exits;
// Go only ends threads whose goroutine exits while locked to its thread,
// so Run must not be called from such a goroutine.
func rankProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
