package ibverbs

import "fmt"

// memlockShort says why n more bytes cannot be registered under a
// locked-memory limit of limit bytes (unlimited: none), or "" when they
// can: registering pins memory, and without CAP_IPC_LOCK the kernel
// refuses to pin more than RLIMIT_MEMLOCK allows.
func memlockShort(n uint64, limit uint64, unlimited, capIPCLock bool) string {
	if unlimited || capIPCLock || n <= limit {
		return ""
	}
	return fmt.Sprintf("RLIMIT_MEMLOCK is %d bytes, and the slot rings need %d bytes registered (pinned): "+
		"raise it with `ulimit -l unlimited` (a container: `--ulimit memlock=-1`; or /etc/security/limits.conf)", limit, n)
}
