//go:build linux && cgo

package topo

import (
	"errors"
	"fmt"
	"os"

	"github.com/gccl/gccl/internal/errs"
	"github.com/gccl/gccl/internal/nvml"
)

// nvmlAPI is the part of NVML that detection calls: internal/nvml's
// Library, or a fake server in tests.
type nvmlAPI interface {
	Shutdown() nvml.Return
	ErrorString(nvml.Return) string
	DeviceGetCount() (int, nvml.Return)
	DeviceGetHandleByIndex(int) (nvml.Device, nvml.Return)
	DeviceGetPCIBusID(nvml.Device) (string, nvml.Return)
	DeviceGetCudaComputeCapability(nvml.Device) (int, int, nvml.Return)
	DeviceGetNvLinkState(nvml.Device, int) (bool, nvml.Return)
	DeviceGetNvLinkRemotePCIBusID(nvml.Device, int) (string, nvml.Return)
	DeviceGetNvLinkRemoteDeviceType(nvml.Device, int) (nvml.NVLinkDeviceType, nvml.Return)
}

// nvmlSource lists GPUs through NVML, loaded at run time (dlopen of
// libnvidia-ml.so.1): building needs cgo, running needs the driver only
// when this is called.
type nvmlSource struct {
	lib nvmlAPI
}

// NewNVMLSource loads NVML: libnvidia-ml.so.1, or the library that
// GCCL_NVML_LIBRARY names. Where NVML cannot be used (no library, no
// driver, no GPU) its error is an ErrNotSupported saying why.
func NewNVMLSource() (GPUSource, error) {
	path := os.Getenv("GCCL_NVML_LIBRARY")
	lib, err := nvml.Open(path)
	if err != nil {
		if path == "" {
			return nil, errs.Errorf(errs.ErrNotSupported, "%s not found (no NVIDIA driver)", nvml.DefaultLibrary)
		}
		return nil, errs.Errorf(errs.ErrNotSupported, "%s not found or not loadable: %v", path, err)
	}
	if ret := lib.Init(); ret != nvml.Success {
		msg := lib.ErrorString(ret)
		lib.Close()
		return nil, errs.Errorf(errs.ErrNotSupported, "%s", msg)
	}
	return nvmlSource{lib: lib}, nil
}

func (s nvmlSource) GPUs() ([]GPUDevice, error) {
	defer s.lib.Shutdown()
	return gpusFromNVML(s.lib)
}

// gpusFromNVML reads every GPU's bus id, compute capability and NVLinks
// through lib, which tests replace with a fake server.
func gpusFromNVML(lib nvmlAPI) ([]GPUDevice, error) {
	count, ret := lib.DeviceGetCount()
	if ret != nvml.Success {
		return nil, fmt.Errorf("NVML device count: %s", lib.ErrorString(ret))
	}
	var out []GPUDevice
	for i := 0; i < count; i++ {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.Success {
			return nil, fmt.Errorf("NVML device %d: %s", i, lib.ErrorString(ret))
		}
		bus, ret := lib.DeviceGetPCIBusID(dev)
		if ret != nvml.Success {
			return nil, fmt.Errorf("NVML device %d PCI info: %s", i, lib.ErrorString(ret))
		}
		busID, err := NormalizeBusID(bus)
		if err != nil {
			return nil, fmt.Errorf("NVML device %d: %w", i, err)
		}
		g := GPUDevice{Index: i, BusID: busID}
		if major, minor, ret := lib.DeviceGetCudaComputeCapability(dev); ret == nvml.Success {
			g.SM = major*10 + minor
		}
		peers := map[string]int{}
		for link := 0; link < nvml.MaxLinks; link++ {
			up, ret := lib.DeviceGetNvLinkState(dev, link)
			if ret == nvml.ErrorNotSupported || ret == nvml.ErrorInvalidArgument || ret == nvml.ErrorFunctionNotFound {
				break // no NVLink, or no more links on this GPU
			}
			if ret != nvml.Success || !up {
				continue
			}
			rbus, ret := lib.DeviceGetNvLinkRemotePCIBusID(dev, link)
			if ret != nvml.Success {
				continue
			}
			remote, err := NormalizeBusID(rbus)
			if err != nil {
				continue
			}
			class := uint32(0x068000) // NVSwitch, unless NVML says otherwise
			if t, ret := lib.DeviceGetNvLinkRemoteDeviceType(dev, link); ret == nvml.Success {
				switch t {
				case nvml.NVLinkGPU:
					class = 0x030200
				case nvml.NVLinkIBMNPU:
					class = 0x060400
				}
			}
			key := remote + "/" + fmt.Sprint(class)
			if _, ok := peers[key]; !ok {
				g.NVLinks = append(g.NVLinks, NVLinkPeer{BusID: remote, Class: class})
			}
			peers[key]++
		}
		for j := range g.NVLinks {
			g.NVLinks[j].Count = peers[g.NVLinks[j].BusID+"/"+fmt.Sprint(g.NVLinks[j].Class)]
		}
		out = append(out, g)
	}
	if len(out) == 0 {
		return nil, errors.New("NVML reports no GPU")
	}
	return out, nil
}
