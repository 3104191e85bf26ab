//go:build linux && cgo

package topo

import (
	"errors"
	"fmt"
	"os"

	"github.com/gccl/gccl/internal/errs"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvmlSource lists GPUs through NVML, which go-nvml loads at run time
// (dlopen of libnvidia-ml.so.1): building needs cgo, running needs the
// driver only when this is called.
type nvmlSource struct {
	lib nvml.Interface
}

// NewNVMLSource loads NVML: libnvidia-ml.so.1, or the library that
// GCCL_NVML_LIBRARY names. Where NVML cannot be used (no library, no
// driver, no GPU) its error is an ErrNotSupported saying why.
func NewNVMLSource() (GPUSource, error) {
	path := os.Getenv("GCCL_NVML_LIBRARY")
	var opts []nvml.LibraryOption
	if path != "" {
		opts = append(opts, nvml.WithLibraryPath(path))
	}
	lib := nvml.New(opts...)
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, errs.Errorf(errs.ErrNotSupported, "%s", nvmlError(lib, ret, path))
	}
	return nvmlSource{lib: lib}, nil
}

func (s nvmlSource) GPUs() ([]GPUDevice, error) {
	defer s.lib.Shutdown()
	return gpusFromNVML(s.lib)
}

func nvmlError(lib nvml.Interface, ret nvml.Return, path string) string {
	if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
		if path != "" {
			return path + " not found"
		}
		return "libnvidia-ml.so.1 not found (no NVIDIA driver)"
	}
	return lib.ErrorString(ret)
}

// gpusFromNVML reads every GPU's bus id, compute capability and NVLinks
// through lib, which tests replace with go-nvml's mock servers.
func gpusFromNVML(lib nvml.Interface) ([]GPUDevice, error) {
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML device count: %s", lib.ErrorString(ret))
	}
	var out []GPUDevice
	for i := 0; i < count; i++ {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("NVML device %d: %s", i, lib.ErrorString(ret))
		}
		pci, ret := dev.GetPciInfo()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("NVML device %d PCI info: %s", i, lib.ErrorString(ret))
		}
		busID, err := NormalizeBusID(cString(pci.BusId[:]))
		if err != nil {
			return nil, fmt.Errorf("NVML device %d: %w", i, err)
		}
		g := GPUDevice{Index: i, BusID: busID}
		if major, minor, ret := dev.GetCudaComputeCapability(); ret == nvml.SUCCESS {
			g.SM = major*10 + minor
		}
		peers := map[string]int{}
		for link := 0; link < nvml.NVLINK_MAX_LINKS; link++ {
			state, ret := dev.GetNvLinkState(link)
			if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
				break // no NVLink, or no more links on this GPU
			}
			if ret != nvml.SUCCESS || state != nvml.FEATURE_ENABLED {
				continue
			}
			rpci, ret := dev.GetNvLinkRemotePciInfo(link)
			if ret != nvml.SUCCESS {
				continue
			}
			remote, err := NormalizeBusID(cString(rpci.BusId[:]))
			if err != nil {
				continue
			}
			class := uint32(0x068000) // NVSwitch, unless NVML says otherwise
			if t, ret := dev.GetNvLinkRemoteDeviceType(link); ret == nvml.SUCCESS {
				switch t {
				case nvml.NVLINK_DEVICE_TYPE_GPU:
					class = 0x030200
				case nvml.NVLINK_DEVICE_TYPE_IBMNPU:
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

func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}
