//go:build linux && cgo

package topo

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gccl/gccl/internal/nvml"
)

// fakeNVML is an NVML server in memory: n GPUs of one compute capability,
// each with `links` NVLinks spread over the switches in turn, as an HGX
// board is wired. Tests change its fields to inject failures.
type fakeNVML struct {
	n, links     int
	major, minor int
	switches     []string
	countRet     nvml.Return
	emptyBusID   bool
}

func newFakeNVML(major, minor, n, links int, switches []string) *fakeNVML {
	return &fakeNVML{n: n, links: links, major: major, minor: minor, switches: switches}
}

func (f *fakeNVML) Shutdown() nvml.Return            { return nvml.Success }
func (f *fakeNVML) ErrorString(r nvml.Return) string { return fmt.Sprintf("NVML error %d", int(r)) }
func (f *fakeNVML) DeviceGetCount() (int, nvml.Return) {
	if f.countRet != nvml.Success {
		return 0, f.countRet
	}
	return f.n, nvml.Success
}
func (f *fakeNVML) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	if i < 0 || i >= f.n {
		return 0, nvml.ErrorInvalidArgument
	}
	return nvml.Device(i + 1), nvml.Success
}
func (f *fakeNVML) DeviceGetPCIBusID(d nvml.Device) (string, nvml.Return) {
	if f.emptyBusID {
		return "", nvml.Success
	}
	return fmt.Sprintf("00000000:%02x:00.0", 0x10+int(d)-1), nvml.Success
}
func (f *fakeNVML) DeviceGetCudaComputeCapability(nvml.Device) (int, int, nvml.Return) {
	return f.major, f.minor, nvml.Success
}
func (f *fakeNVML) DeviceGetNvLinkState(_ nvml.Device, link int) (bool, nvml.Return) {
	if link >= f.links {
		return false, nvml.ErrorInvalidArgument
	}
	return true, nvml.Success
}
func (f *fakeNVML) DeviceGetNvLinkRemotePCIBusID(_ nvml.Device, link int) (string, nvml.Return) {
	return f.switches[link%len(f.switches)], nvml.Success
}
func (f *fakeNVML) DeviceGetNvLinkRemoteDeviceType(nvml.Device, int) (nvml.NVLinkDeviceType, nvml.Return) {
	return nvml.NVLinkSwitch, nvml.Success
}

func TestNVMLFakeDGXH100(t *testing.T) {
	switches := []string{"0000:f3:00.0", "0000:f4:00.0", "0000:f5:00.0", "0000:f6:00.0"}
	s := newFakeNVML(9, 0, 8, 18, switches)
	gpus, err := gpusFromNVML(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != 8 {
		t.Fatalf("%d GPUs, want 8", len(gpus))
	}
	for _, g := range gpus {
		if g.SM != 90 {
			t.Errorf("GPU %d: sm %d, want 90 (H100)", g.Index, g.SM)
		}
		total := 0
		for _, l := range g.NVLinks {
			total += l.Count
			if l.Class != 0x068000 {
				t.Errorf("GPU %d: link to %s class 0x%06x, want NVSwitch", g.Index, l.BusID, l.Class)
			}
		}
		if total != 18 || len(g.NVLinks) != 4 {
			t.Errorf("GPU %d: %d lanes to %d peers, want 18 to 4", g.Index, total, len(g.NVLinks))
		}
	}
	// Through detection, on a fake sysfs: the whole graph.
	root := fakeSysfs(t)
	g, err := Detector{Root: root, GPUs: nvmlSource{lib: s}}.Detect()
	if err != nil {
		t.Fatal(err)
	}
	// The fake tree's NVIDIA function is not one of NVML's GPUs: with NVML
	// working, only NVML's eight are listed (straight under NUMA 0, as this
	// tree does not hold their bus ids).
	if len(g.Nodes[GPU]) != 8 || len(g.Nodes[NVS]) != 4 {
		t.Fatalf("%d GPUs and %d NVSwitches, want 8 and 4", len(g.Nodes[GPU]), len(g.Nodes[NVS]))
	}
	a, b := g.Nodes[GPU][0], g.Nodes[GPU][7]
	if p := g.Path(a, b); p.Type != PathNVL || !near(p.BW, 18*BWNVLinkSM90) {
		t.Errorf("GPU0 -> GPU7: %s %.1f, want NVL %.1f", p.Type, p.BW, 18*BWNVLinkSM90)
	}
}

func TestNVMLFakeDGXA100(t *testing.T) {
	s := newFakeNVML(8, 0, 8, 12, []string{"0000:c0:00.0", "0000:c1:00.0", "0000:c2:00.0", "0000:c3:00.0", "0000:c4:00.0", "0000:c5:00.0"})
	gpus, err := gpusFromNVML(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != 8 {
		t.Fatalf("%d GPUs, want 8", len(gpus))
	}
	for _, g := range gpus {
		if g.SM != 80 || len(g.NVLinks) != 6 {
			t.Errorf("GPU %d: sm %d, %d NVSwitches; want 80 and 6", g.Index, g.SM, len(g.NVLinks))
		}
	}
}

func TestNVMLErrors(t *testing.T) {
	s := newFakeNVML(8, 0, 8, 12, []string{"0000:c0:00.0"})
	s.countRet = nvml.ErrorUninitialized
	if _, err := gpusFromNVML(s); err == nil || !strings.Contains(err.Error(), "NVML error 1") {
		t.Errorf("NVML cannot count devices: %v, want its error", err)
	}
	s = newFakeNVML(8, 0, 1, 12, []string{"0000:c0:00.0"})
	s.emptyBusID = true
	// No bus id: a clear error, not a bogus node.
	if _, err := gpusFromNVML(s); err == nil {
		t.Error("no error for an empty bus id")
	}
	s = newFakeNVML(8, 0, 0, 0, nil)
	if _, err := gpusFromNVML(s); err == nil {
		t.Error("no error for zero GPUs")
	}
}

// TestInstalledNVMLLibrary loads a real NVML, GCCL_TEST_NVML_LIBRARY (CI
// fetches Debian's libnvidia-ml1 with .ci/nvidia-tools.sh): on a GPU
// machine it lists the GPUs; without one, or without the driver's kernel
// module, Init fails with NVML's own reason, not "not found".
func TestInstalledNVMLLibrary(t *testing.T) {
	path := os.Getenv("GCCL_TEST_NVML_LIBRARY")
	if path == "" {
		t.Skip("GCCL_TEST_NVML_LIBRARY names no NVML library (.ci/nvidia-tools.sh fetches one)")
	}
	t.Setenv("GCCL_NVML_LIBRARY", path)
	src, err := NewNVMLSource()
	if err == nil {
		gpus, err := src.GPUs()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("NVML lists %d GPUs", len(gpus))
		return
	}
	if strings.Contains(err.Error(), "not found") {
		t.Fatalf("NVML at %s did not load: %v", path, err)
	}
	t.Logf("NVML loaded; no GPU to list: %v", err)
	t.Setenv("GCCL_NVML_LIBRARY", filepath.Join(t.TempDir(), "libnvidia-ml.so.1"))
	if _, err := NewNVMLSource(); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("a missing NVML: %v, want \"not found\"", err)
	}
}
