//go:build linux && cgo

package tests

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gccl/gccl/internal/cuda/cudatest"
)

// Collectives on device buffers across 2 and 4 processes, every type and
// op, through the fake CUDA driver: the processes map each other's device
// memory with IPC handles and reduce with the host build of gccl's
// kernels. (On a GPU machine the same program runs on the real driver:
// docs/HARDWARE.md.)
func TestDeviceCollectivesAcrossProcesses(t *testing.T) {
	lib := cudatest.Build(t)
	for _, np := range []int{2, 4} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			res := run(t, 3*time.Minute, []string{"GCCL_CUDA_LIBRARY=" + lib}, bins.run, "-np", fmt.Sprint(np), bins.devcheck, "-count", "1031")
			if res.code != 0 {
				t.Fatalf("exit %d:\n%s", res.code, res.out)
			}
			for r := 0; r < np; r++ {
				mustContain(t, res.out, fmt.Sprintf("devcheck: rank %d of %d ok", r, np))
			}
			mustContain(t, res.out, "on the devices: true; send/recv direct: true")
			mustNotContain(t, res.out, "on the devices: false")
			mustNotContain(t, res.out, "send/recv direct: false")
		})
	}
}

// The same checks with every call async on buffers bound to a CUDA stream,
// each result read through the stream alone (devcheck -stream), with the
// fake driver's streams slowed so that a stream running ahead of a call
// reads a stale result.
func TestDeviceCollectivesOnStreamsAcrossProcesses(t *testing.T) {
	lib := cudatest.Build(t)
	res := run(t, 3*time.Minute, []string{"GCCL_CUDA_LIBRARY=" + lib, "FAKECUDA_STREAM_DELAY_US=300"},
		bins.run, "-np", "2", bins.devcheck, "-count", "1031", "-stream")
	if res.code != 0 {
		t.Fatalf("exit %d:\n%s", res.code, res.out)
	}
	for r := 0; r < 2; r++ {
		mustContain(t, res.out, fmt.Sprintf("devcheck: rank %d of 2 ok", r))
	}
	mustContain(t, res.out, "on the devices: true; send/recv direct: true; on a stream: true")
	mustNotContain(t, res.out, "on the devices: false")
	mustNotContain(t, res.out, "send/recv direct: false")
}

// The same checks on views of one device window that every rank registered
// (devcheck -stream -window): the calls run stream-ordered, the devices
// waiting for each other on flags in host memory, with nothing but the
// queueing on the host; the fake driver's slowed streams, out of step
// across processes, make a flag written or waited for too early show as a
// wrong result.
func TestStreamOrderedDeviceCollectivesAcrossProcesses(t *testing.T) {
	lib := cudatest.Build(t)
	for _, np := range []int{2, 3} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			res := run(t, 3*time.Minute, []string{"GCCL_CUDA_LIBRARY=" + lib, "FAKECUDA_STREAM_DELAY_US=200", "FAKECUDA_STREAM_JITTER=1"},
				bins.run, "-np", fmt.Sprint(np), bins.devcheck, "-count", "1031", "-stream", "-window")
			if res.code != 0 {
				t.Fatalf("exit %d:\n%s", res.code, res.out)
			}
			for r := 0; r < np; r++ {
				mustContain(t, res.out, fmt.Sprintf("devcheck: rank %d of %d ok", r, np))
			}
			mustContain(t, res.out, "on a stream: true; stream-ordered: true")
			mustNotContain(t, res.out, "stream-ordered: false")
		})
	}
}

// Two processes on one GPU without MPS: each rank warns that the GPU
// time-slices them (every device collective waits for it); under MPS, or
// with a GPU each, none does.
func TestSharedGPUWithoutMPSWarns(t *testing.T) {
	lib := cudatest.Build(t)
	const warn = "without MPS: the GPU time-slices"
	for _, c := range []struct {
		name string
		env  []string
		warn bool
	}{
		{"one GPU", []string{"FAKECUDA_DEVICES=1"}, true},
		{"one GPU under MPS", []string{"FAKECUDA_DEVICES=1", "FAKECUDA_MPS=1"}, false},
		{"a GPU each", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := run(t, 3*time.Minute, append([]string{"GCCL_CUDA_LIBRARY=" + lib}, c.env...),
				bins.run, "-np", "2", bins.devcheck, "-count", "1031")
			if res.code != 0 {
				t.Fatalf("exit %d:\n%s", res.code, res.out)
			}
			mustContain(t, res.out, "on the devices: true")
			for r := range 2 {
				said := false
				for _, line := range strings.Split(res.out, "\n") {
					if strings.Contains(line, warn) && strings.Contains(line, fmt.Sprintf("rank=%d", r)) {
						said = true
					}
				}
				if said != c.warn {
					t.Errorf("rank %d warned of time slicing: %v, want %v:\n%s", r, said, c.warn, res.out)
				}
			}
		})
	}
}

// Without a driver, devcheck says so instead of failing obscurely.
func TestDevcheckWithoutDriver(t *testing.T) {
	res := run(t, time.Minute, []string{"GCCL_CUDA_LIBRARY=/nonexistent/libcuda.so.1"}, bins.run, "-np", "2", bins.devcheck)
	mustContain(t, res.out, "no GPU", "/nonexistent/libcuda.so.1")
}
