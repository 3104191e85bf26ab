//go:build linux && cgo

package topo

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
)

// mockServer builds an 8-GPU server from go-nvml's moq mocks and its GPU
// descriptions (gpus.H100_SXM5_80GB, gpus.A100_SXM4_40GB: the ones its
// dgxh100 and dgxa100 servers use). Those server packages themselves import
// github.com/google/uuid, a module gccl's go.mod does not carry, so the test
// assembles the same server from the parts. Every GPU gets a bus id and
// `links` NVLinks spread over the switches in turn, as an HGX board is
// wired; go-nvml's servers model no NVLink.
func mockServer(cfg gpus.Config, n, links int, switches []string) *mock.Interface {
	devs := make([]*mock.Device, n)
	for i := range devs {
		bus := fmt.Sprintf("0000:%02x:00.0", 0x10+i)
		devs[i] = &mock.Device{
			GetPciInfoFunc: func() (nvml.PciInfo, nvml.Return) {
				return nvml.PciInfo{BusId: busIDField(bus), PciDeviceId: cfg.PciDeviceId}, nvml.SUCCESS
			},
			GetCudaComputeCapabilityFunc: func() (int, int, nvml.Return) {
				return cfg.CudaMajor, cfg.CudaMinor, nvml.SUCCESS
			},
			GetNvLinkStateFunc: func(link int) (nvml.EnableState, nvml.Return) {
				if link >= links {
					return 0, nvml.ERROR_INVALID_ARGUMENT
				}
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			},
			GetNvLinkRemotePciInfoFunc: func(link int) (nvml.PciInfo, nvml.Return) {
				return nvml.PciInfo{BusId: busIDField(switches[link%len(switches)])}, nvml.SUCCESS
			},
			GetNvLinkRemoteDeviceTypeFunc: func(link int) (nvml.IntNvLinkDeviceType, nvml.Return) {
				return nvml.NVLINK_DEVICE_TYPE_SWITCH, nvml.SUCCESS
			},
		}
	}
	return &mock.Interface{
		DeviceGetCountFunc: func() (int, nvml.Return) { return n, nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= n {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return devs[i], nvml.SUCCESS
		},
		ErrorStringFunc: func(r nvml.Return) string { return fmt.Sprintf("NVML error %d", int(r)) },
		ShutdownFunc:    func() nvml.Return { return nvml.SUCCESS },
	}
}

// busID fills an NVML PciInfo.BusId.
func busIDField(s string) [32]int8 {
	var out [32]int8
	for i := 0; i < len(s) && i < 31; i++ {
		out[i] = int8(s[i])
	}
	return out
}

func TestNVMLMockDGXH100(t *testing.T) {
	switches := []string{"0000:f3:00.0", "0000:f4:00.0", "0000:f5:00.0", "0000:f6:00.0"}
	s := mockServer(gpus.H100_SXM5_80GB, 8, 18, switches)
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

func TestNVMLMockDGXA100(t *testing.T) {
	s := mockServer(gpus.A100_SXM4_40GB, 8, 12, []string{"0000:c0:00.0", "0000:c1:00.0", "0000:c2:00.0", "0000:c3:00.0", "0000:c4:00.0", "0000:c5:00.0"})
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
	s := mockServer(gpus.A100_SXM4_40GB, 8, 12, []string{"0000:c0:00.0"})
	s.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNINITIALIZED }
	if _, err := gpusFromNVML(s); err == nil {
		t.Error("no error when NVML cannot count devices")
	}
	s = mockServer(gpus.A100_SXM4_40GB, 1, 12, []string{"0000:c0:00.0"})
	dev, _ := s.DeviceGetHandleByIndex(0)
	dev.(*mock.Device).GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{}, nvml.SUCCESS }
	// No bus id: a clear error, not a bogus node.
	if _, err := gpusFromNVML(s); err == nil {
		t.Error("no error for an empty bus id")
	}
	s = mockServer(gpus.A100_SXM4_40GB, 0, 0, nil)
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
