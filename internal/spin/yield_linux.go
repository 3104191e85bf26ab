package spin

import "syscall"

// osYield gives up the core to any other runnable thread of the machine.
// The call is raw: through entersyscall, a yield that let another process
// run for a while left the P in a system call, which the runtime's monitor
// took away, and the thread paid a context switch to get one back
// (docs/PERFORMANCE.md, "Raw system calls on the TCP data path").
func osYield() { syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }
