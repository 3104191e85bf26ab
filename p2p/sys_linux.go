package p2p

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// processGone reports whether pid no longer runs on this host: it does not
// exist, it is a zombie waiting for its parent, or it is exiting.
func processGone(pid int) bool {
	if pid <= 0 {
		return false
	}
	if unix.Kill(pid, 0) == unix.ESRCH {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	return statGone(b)
}

// pfExiting is the kernel's PF_EXITING task flag: set at the start of
// exit, before the process closes its files and long before it is a
// zombie (unmapping a large address space on a loaded host took over a
// second in a CI run's fault soak, past reapSegments' wait).
const pfExiting = 0x4

// statGone reads /proc/PID/stat: "pid (comm) S ppid pgrp session tty_nr
// tpgid flags ...". The process is gone once a zombie (Z, X) or exiting.
func statGone(b []byte) bool {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	if b[i+2] == 'Z' || b[i+2] == 'X' {
		return true
	}
	f := strings.Fields(string(b[i+2:]))
	if len(f) < 7 {
		return false
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	return err == nil && flags&pfExiting != 0
}
