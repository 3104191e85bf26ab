package ibverbs

import (
	"bufio"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// capIPCLock is CAP_IPC_LOCK's bit in the capability sets.
const capIPCLock = 14

// memlockCheck is memlockShort for this process: its RLIMIT_MEMLOCK and
// whether it has CAP_IPC_LOCK (root usually has).
func memlockCheck(n uint64) string {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		return ""
	}
	return memlockShort(n, rl.Cur, rl.Cur == unix.RLIM_INFINITY, hasCap(capIPCLock))
}

// hasCap reports whether the process's effective capabilities include
// bit c (from /proc/self/status).
func hasCap(c uint) bool {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "CapEff:"); ok {
			m, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && m&(1<<c) != 0
		}
	}
	return false
}
