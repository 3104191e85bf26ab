package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The test binary is also the target process: setupTarget starts
// os.Executable().
func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) != "" {
		if err := target(); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"-op", "read", "-b", "4K", "-e", "1M", "-f", "16", "-batch", "1,8", "-max", "4M"})
	if err != nil {
		t.Fatal(err)
	}
	// 4K, 64K, 1M x batches 1, 8, under 4 MiB each.
	want := [][2]int{{4096, 1}, {4096, 8}, {65536, 1}, {65536, 8}, {1 << 20, 1}}
	if got := o.points(); len(got) != len(want) {
		t.Fatalf("points %v, want %v", got, want)
	} else {
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("points %v, want %v", got, want)
			}
		}
	}
	if o.regionSize() != 1<<20 {
		t.Fatalf("region size %d", o.regionSize())
	}
	for _, bad := range [][]string{
		{"-op", "copy"}, {"-target", "gpu"}, {"-target", "file"}, {"-b", "1M", "-e", "4K"},
		{"-batch", "0"}, {"-b", "x"}, {"-backend", "rdma"}, {"-f", "1"},
		{"-notif-poll", "1ms"}, {"-notif", "-notif-poll", "-1ms"},
	} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	if n, err := parseSize("2G"); err != nil || n != 2<<30 {
		t.Fatalf("parseSize(2G) = %d, %v", n, err)
	}
}

// -backend rdma between two processes of this host: where there is an RDMA
// device (the rxe VM), else it says why not.
func TestRunRDMA(t *testing.T) {
	for _, k := range []string{"GCCL_SHM_DISABLE", "GCCL_P2P_PVM_DISABLE", "GCCL_P2P_RDMA_SAME_HOST"} {
		t.Setenv(k, os.Getenv(k)) // run sets them; restored after the test
	}
	for _, op := range []string{"write", "read"} {
		o, err := parseFlags([]string{"-op", op, "-target", "dram", "-backend", "rdma", "-b", "4K", "-e", "1M", "-f", "16", "-batch", "1,3", "-n", "3", "-w", "1"})
		if err != nil {
			t.Fatal(err)
		}
		err = run(o)
		if err != nil && os.Getenv("GCCL_TEST_REQUIRE_RDMA") != "1" && strings.Contains(err.Error(), "-backend rdma") {
			t.Skipf("no RDMA device: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestRun runs small sweeps end to end, with the data checked, against a
// second process and against a file.
func TestRun(t *testing.T) {
	for _, args := range [][]string{
		{"-op", "write", "-target", "shm", "-b", "4K", "-e", "64K", "-f", "16", "-batch", "1,4", "-n", "3"},
		{"-op", "write", "-target", "dram", "-b", "4K", "-e", "4K", "-batch", "2", "-n", "2", "-backend", "tcp"},
		{"-op", "read", "-target", "dram", "-b", "4K", "-e", "4K", "-n", "3", "-backend", "tcp", "-notif"},
		{"-op", "write", "-target", "dram", "-b", "4K", "-e", "4K", "-n", "3", "-backend", "tcp", "-notif", "-notif-poll", "1ms"},
		{"-op", "read", "-target", "file", "-file", filepath.Join(t.TempDir(), "f"), "-b", "64K", "-e", "64K", "-batch", "3", "-n", "2"},
		{"-op", "write", "-target", "file", "-file", filepath.Join(t.TempDir(), "g"), "-b", "8K", "-e", "8K", "-batch", "5", "-n", "2", "-direct", "-qd", "2", "-bs", "4K"},
	} {
		o, err := parseFlags(args)
		if err != nil {
			t.Fatal(err)
		}
		if err := run(o); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
}
