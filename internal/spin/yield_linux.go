package spin

import "syscall"

// osYield gives up the core to any other runnable thread of the machine.
func osYield() { syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }
