//go:build linux && cgo

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gccl/gccl/gpu"
	"github.com/gccl/gccl/internal/cuda/cudatest"
)

// -M device against the fake CUDA driver (two GPUs; kernels run on the
// CPU; CUDA IPC across processes through memfd), or against the installed
// driver with GCCL_TEST_REAL_GPU=1.

// deviceDriver chooses the driver for t and returns the environment that
// gives it to gccl-perf, and how many devices it has.
func deviceDriver(t *testing.T) (env []string, devices int) {
	t.Helper()
	cudatest.Driver(t) // sets GCCL_CUDA_LIBRARY for this process
	n, err := gpu.DeviceCount()
	if err != nil {
		t.Fatalf("the driver the test chose: %v", err)
	}
	// runProcess strips GCCL_ variables: pass the fake on explicitly.
	if lib := os.Getenv("GCCL_CUDA_LIBRARY"); lib != "" {
		env = append(env, "GCCL_CUDA_LIBRARY="+lib)
	}
	return env, n
}

var gpuDeviceLine = regexp.MustCompile(`^#  Rank +(\d+) Group +0 Pid +(\d+) on +\S+ device +(\d+) \[([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\] (\S+)$`)

// checkGPUHeader checks that the header says the buffers are device memory
// and lists n ranks of this host, in order, rank r on device r % devices,
// in procs processes, using transport; it returns each rank's PCI address.
func checkGPUHeader(t *testing.T, out string, n, procs, devices int, transport string) []string {
	t.Helper()
	if !strings.Contains(out, "\n# Memory: device (CUDA)") {
		t.Errorf("the header does not say the buffers are in device memory:\n%s", out)
	}
	var busIDs []string
	pids := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		m := gpuDeviceLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		rank := len(busIDs) // every rank is on this host: its local rank is its rank
		if m[1] != strconv.Itoa(rank) || m[3] != strconv.Itoa(rank%devices) || m[5] != transport {
			t.Errorf("device line %q: want rank %d on device %d via %s", line, rank, rank%devices, transport)
		}
		pids[m[2]] = true
		busIDs = append(busIDs, m[4])
	}
	if len(busIDs) != n || len(pids) != procs {
		t.Errorf("header lists %d ranks on GPUs in %d processes, want %d in %d:\n%s", len(busIDs), len(pids), n, procs, out)
	}
	return busIDs
}

// checkOnDevices checks that every rank's log says its collectives ran on
// the devices, not through host staging.
func checkOnDevices(t *testing.T, stderr string, n int) {
	t.Helper()
	for r := range n {
		if !regexp.MustCompile(`collectives run on the devices.* rank=` + strconv.Itoa(r) + `\b`).MatchString(stderr) {
			t.Errorf("rank %d did not log that its collectives run on the devices:\n%s", r, stderr)
		}
	}
}

// Two ranks in one process, each on its own GPU: the all-reduce runs on
// the devices, every result checks, and the JSON says where the buffers
// were.
func TestDeviceMemoryInProcess(t *testing.T) {
	env, devices := deviceDriver(t)
	jsonPath := filepath.Join(t.TempDir(), "device.json")
	res := perf(t, append(env, "GCCL_DEBUG=INFO", "GCCL_DEBUG_SUBSYS=COLL"), "all_reduce -g 2 -M device -b 8 -e 64K -f 4 -c 1 -J "+jsonPath)
	if res.status != 0 {
		t.Fatalf("exit status %d\nstdout:\n%s\nstderr:\n%s", res.status, res.stdout, res.stderr)
	}
	busIDs := checkGPUHeader(t, res.stdout, 2, 1, devices, "INPROC")
	checkOneCleanTable(t, res.stdout, 7)
	checkOnDevices(t, res.stderr, 2)

	rep := readJSONReport(t, jsonPath)
	if rep.Memory != "device" || len(rep.Devices) != 2 || !rep.Passed {
		t.Fatalf("JSON report: memory %q, %d devices, passed %v", rep.Memory, len(rep.Devices), rep.Passed)
	}
	for r, d := range rep.Devices {
		if d.Device != r%devices || len(busIDs) == 2 && d.BusID != busIDs[r] {
			t.Errorf("JSON: rank %d on device %d at %q, want %d at %q (the header's)", r, d.Device, d.BusID, r%devices, busIDs)
		}
	}
}

// Every test, in and out of place, on 3 in-process ranks sharing 2 GPUs,
// blocking and not: the collectives gccl runs through host staging copy
// ranges of the device buffers (in place, one rank's block), and their
// results check too.
func TestDeviceMemoryEveryTest(t *testing.T) {
	env, devices := deviceDriver(t)
	for i, coll := range collectives {
		args := fmt.Sprintf("%s -g 3 -M device -b 8 -e 1K -f 8 -n 2 -w 1 -z %d", coll.name, i%2)
		res := perf(t, env, args)
		if res.status != 0 {
			t.Errorf("%s: exit status %d\nstdout:\n%s\nstderr:\n%s", args, res.status, res.stdout, res.stderr)
			continue
		}
		checkGPUHeader(t, res.stdout, 3, 1, devices, "INPROC")
		checkOneCleanTable(t, res.stdout, 3)
	}
}

// Two processes, one rank and one GPU each, mapping each other's device
// buffers through CUDA IPC.
func TestDeviceMemoryMultiProcess(t *testing.T) {
	env, devices := deviceDriver(t)
	for _, test := range []string{"all_reduce", "reduce_scatter"} {
		res := perf(t, append(env, "GCCL_DEBUG=INFO", "GCCL_DEBUG_SUBSYS=COLL"), test+" -np 2 -M device -b 8 -e 64K -f 4 -c 1")
		if res.status != 0 {
			t.Fatalf("%s: exit status %d\nstdout:\n%s\nstderr:\n%s", test, res.status, res.stdout, res.stderr)
		}
		checkGPUHeader(t, res.stdout, 2, 2, devices, "SHM")
		checkOneCleanTable(t, res.stdout, 7)
		checkOnDevices(t, res.stderr, 2)
	}
}

// -M device -R 2: the device buffers are windows every rank registered,
// each rank's views bound to its stream: every call is queued on the
// stream (stream-ordered, logged), each loop ends with a synchronize, and
// every result checks, in one process and across two, with the fake
// driver's streams slowed so that a loop timed or checked before its
// stream finished reads stale results.
func TestDeviceWindows(t *testing.T) {
	env, devices := deviceDriver(t)
	env = append(env, "GCCL_DEBUG=INFO", "GCCL_DEBUG_SUBSYS=COLL", "FAKECUDA_STREAM_DELAY_US=100")
	for _, tc := range []struct{ args, transport string }{
		{"all_reduce -g 2 -M device -R 2 -b 8 -e 64K -f 8 -c 1 -n 5 -w 1", "INPROC"},
		{"all_gather -np 2 -M device -R 2 -b 8 -e 64K -f 8 -c 1 -n 5 -w 1 -z 1", "SHM"},
	} {
		res := perf(t, env, tc.args)
		if res.status != 0 {
			t.Fatalf("%s: exit status %d\nstdout:\n%s\nstderr:\n%s", tc.args, res.status, res.stdout, res.stderr)
		}
		procs := 1
		if tc.transport == "SHM" {
			procs = 2
		}
		checkGPUHeader(t, res.stdout, 2, procs, devices, tc.transport)
		checkOneCleanTable(t, res.stdout, 5)
		if !strings.Contains(res.stdout, "\n# Registered device windows") {
			t.Errorf("%s: the header does not say the buffers are windows:\n%s", tc.args, res.stdout)
		}
		for r := range 2 {
			if !regexp.MustCompile(`collectives queued on the stream.* rank=` + strconv.Itoa(r) + `\b`).MatchString(res.stderr) {
				t.Errorf("%s: rank %d did not log stream-ordered calls:\n%s", tc.args, r, res.stderr)
			}
		}
	}
	if res := perf(t, env, "all_reduce -g 2 -M device -R 1"); res.status == 0 || !strings.Contains(res.stderr, "use -R 2") {
		t.Errorf("-M device -R 1: exit status %d, stderr:\n%s", res.status, res.stderr)
	}
}
