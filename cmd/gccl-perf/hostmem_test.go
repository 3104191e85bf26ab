package main

import (
	"runtime"
	"strings"
	"testing"
)

func TestCheckHostMemory(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		args  string
		inJob bool
		total uint64
		want  string // "" for no error
	}{
		{"all_reduce -e 4G", false, 8 * gib, ""}, // 2 × 4 GiB fit exactly
		{"all_reduce -e 4G", false, 8*gib - 1, "need 8.0 GiB of memory, more than its 8.0 GiB"},
		{"all_reduce -e 64G", false, 23 * gib, "-e 64G: the send and receive buffers of 1 rank(s) on this host need 128.0 GiB"},
		{"all_reduce -e 1G -g 8", false, 8 * gib, "of 8 rank(s) on this host need 16.0 GiB"},
		{"all_reduce -e 1G -np 8", false, 8 * gib, "of 8 rank(s) on this host need 16.0 GiB"},
		{"all_reduce -e 1024G -np 65536", false, 1 << 50, "need 131072.0 TiB"}, // the largest flags allow
		{"all_reduce -e 1G -np 8", true, 8 * gib, ""},                          // a rank of a job counts its own
		{"all_reduce -e 64G", false, 0, ""},                                    // unknown memory: unchecked
		{"all_reduce -e 64G --simulate", false, gib, ""},
	} {
		cfg, err := parseArgs(strings.Fields(tc.args))
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		err = checkHostMemory(cfg, tc.inJob, tc.total)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q with %d bytes: %v", tc.args, tc.total, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q with %d bytes: error %v, want one saying %q", tc.args, tc.total, err, tc.want)
		}
	}
}

// TestOversizedBuffersAreRefused runs the program with more buffer memory
// than the host has: a usage error, where allocating would crash.
func TestOversizedBuffersAreRefused(t *testing.T) {
	env := testEnvironment()
	env.physMem = 16 << 30
	out, errOut, status := runMain(t, env, "all_reduce -b 8 -e 64G")
	if status != 2 || out != "" || !strings.Contains(errOut, "need 128.0 GiB of memory, more than its 16.0 GiB; lower -e") {
		t.Errorf("status %d, stdout %q, stderr %q; want status 2 and the memory needed", status, out, errOut)
	}
}

func TestPhysicalMemory(t *testing.T) {
	if runtime.GOOS != "linux" && runtime.GOOS != "darwin" {
		t.Skip("no way to ask on " + runtime.GOOS)
	}
	if n := physicalMemory(); n < 64<<20 {
		t.Errorf("physicalMemory() = %d bytes", n)
	}
}
