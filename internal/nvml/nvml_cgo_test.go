//go:build linux && cgo

package nvml

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstalledLibrary loads a real NVML, GCCL_TEST_NVML_LIBRARY (CI
// fetches Debian's libnvidia-ml1 with .ci/nvidia-tools.sh), so that the
// symbol names and return codes here are checked against NVIDIA's.
func TestInstalledLibrary(t *testing.T) {
	path := os.Getenv("GCCL_TEST_NVML_LIBRARY")
	if path == "" {
		t.Skip("GCCL_TEST_NVML_LIBRARY names no NVML library (.ci/nvidia-tools.sh fetches one)")
	}
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, p := range []struct {
		name string
		sym  bool
	}{
		{"nvmlDeviceGetCudaComputeCapability", l.computeCapability != nil},
		{"nvmlDeviceGetNvLinkState", l.linkState != nil},
		{"nvmlDeviceGetNvLinkRemotePciInfo_v2", l.linkRemotePCI != nil},
		{"nvmlDeviceGetNvLinkRemoteDeviceType", l.linkRemoteType != nil},
	} {
		if !p.sym {
			t.Errorf("%s has no %s", path, p.name)
		}
	}
	for r, want := range map[Return]string{
		Success:              "Success",
		ErrorUninitialized:   "Uninitialized",
		ErrorInvalidArgument: "Invalid Argument",
		ErrorNotSupported:    "Not Supported",
		ErrorLibraryNotFound: "NVML Shared Library Not Found",
	} {
		if got := l.ErrorString(r); got != want {
			t.Errorf("ErrorString(%d) = %q, want %q", r, got, want)
		}
	}
	if r := l.Init(); r == Success {
		defer l.Shutdown()
		n, r := l.DeviceGetCount()
		if r != Success {
			t.Fatalf("device count: %s", l.ErrorString(r))
		}
		for i := 0; i < n; i++ {
			d, r := l.DeviceGetHandleByIndex(i)
			if r != Success {
				t.Fatalf("device %d: %s", i, l.ErrorString(r))
			}
			bus, r := l.DeviceGetPCIBusID(d)
			if r != Success || !strings.Contains(bus, ":") {
				t.Errorf("device %d: bus id %q, %s", i, bus, l.ErrorString(r))
			}
		}
		t.Logf("%d GPUs", n)
	} else {
		// No GPU here: NVML's own reason (the driver is not loaded), not a
		// failure of the binding.
		t.Logf("Init: %s", l.ErrorString(r))
	}
}

func TestOpenRefusesOtherLibraries(t *testing.T) {
	if _, err := Open(filepath.Join(t.TempDir(), "libnvidia-ml.so.1")); err == nil {
		t.Error("a missing file opened")
	}
	// libc loads but is not NVML.
	_, err := Open("libc.so.6")
	if err == nil || !strings.Contains(err.Error(), "has no nvmlInit_v2") {
		t.Errorf("libc.so.6: %v, want a missing NVML entry point", err)
	}
}
