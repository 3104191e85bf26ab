package main

import (
	"fmt"

	"github.com/gccl/gccl/internal/units"
)

// checkHostMemory refuses a run whose send and receive buffers could not
// fit in the host's physical memory (total bytes; 0: unknown, no check):
// allocating them would crash the Go runtime with a fatal out-of-memory
// error instead of an error message. Every rank holds two buffers of
// maxBytes (under -M device, their host mirrors). The ranks that count are
// this process's (-g), or all those -np starts on this host; a rank of a
// launcher's job counts only its own.
func checkHostMemory(cfg *config, inJob bool, total uint64) error {
	if total == 0 || cfg.simulate {
		return nil
	}
	ranks := cfg.ranks
	if !inJob {
		ranks *= cfg.procs
	}
	// The flags' caps (-e 1T, -g and -np 65536, not both) keep this below
	// 2^58: no overflow.
	need := uint64(ranks) * 2 * uint64(cfg.maxBytes)
	if need <= total {
		return nil
	}
	return usagef("-e %s: the send and receive buffers of %d rank(s) on this host need %s of memory, "+
		"more than its %s; lower -e, -g or -np", units.FormatBytes(cfg.maxBytes), ranks, formatSize(need), formatSize(total))
}

// formatSize writes n bytes in GiB, MiB or KiB with one decimal.
func formatSize(n uint64) string {
	for _, u := range []struct {
		suffix string
		size   uint64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.size {
			return fmt.Sprintf("%.1f %s", float64(n)/float64(u.size), u.suffix)
		}
	}
	return fmt.Sprintf("%d bytes", n)
}
