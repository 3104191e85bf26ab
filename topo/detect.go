package topo

import (
	"errors"
	"fmt"
	"sort"
	"strconv"

	"github.com/gccl/gccl/internal/errs"
)

// ErrNotSupported is returned by detection on systems gccl cannot inspect
// (anything but Linux). Use GCCL_TOPO_FILE there.
var ErrNotSupported error = errs.New(errs.ErrNotSupported, "topo: topology detection is not supported on this system")

// GPUSource lists the GPUs of this host with their NVLinks. The NVML
// implementation needs cgo and libnvidia-ml at run time.
type GPUSource interface {
	GPUs() ([]GPUDevice, error)
}

// GPUDevice is what detection needs to know about one GPU.
type GPUDevice struct {
	Index   int    // CUDA/NVML device index
	BusID   string // PCI bus id
	SM      int    // compute capability ×10
	NVLinks []NVLinkPeer
}

// NVLinkPeer is one NVLink lane of a GPU (or several to the same peer).
type NVLinkPeer struct {
	BusID string // the remote end: a GPU, an NVSwitch or a CPU
	Class uint32 // PCI class of the remote end: 0x068000 for an NVSwitch
	Count int
}

// Detector inspects this host.
type Detector struct {
	// Root is the filesystem holding sys/ and proc/; "" means "/". Tests
	// point it at a fake tree.
	Root string
	// GPUs lists the GPUs; nil means NVML, which reports "no NVML: ..."
	// where it cannot load (no cgo, no driver) and leaves GPUs out.
	GPUs GPUSource
	// HostHash overrides the host identity written in host_hash; "" means
	// a hash of the host name and boot id.
	HostHash string
}

// hostFacts is what detection gathered, before it becomes a document.
type hostFacts struct {
	arch, vendor  string
	family, model int
	hostHash      string
	numa          []numaFacts
	devices       []deviceFacts
}

type numaFacts struct {
	id    int
	cpus  CPUSet
	memKB uint64
}

// pciFacts is one PCI function as sysfs shows it.
type pciFacts struct {
	busID, class, vendor, device, subVendor, subDevice string
	linkSpeed, linkWidth                               string
}

// deviceFacts is a GPU, NIC or NVSwitch with the PCI functions above it,
// from the root port down to itself.
type deviceFacts struct {
	chain []pciFacts
	numa  int // -1 when the platform does not say
	gpu   *GPUDevice
	nets  []netFacts
}

type netFacts struct {
	name           string
	dev, speedMbps int
	port           int
	guid           string
	maxConn        int
	gdr            bool
}

// document turns gathered facts into an NCCL topology document: one <cpu>
// per NUMA node, each device's PCI chain below the <cpu> of its NUMA node
// (the first one when the platform does not say), <gpu> with its <nvlink>s,
// <nic> with its <net>s.
func (h *hostFacts) document() (*Element, error) {
	if len(h.numa) == 0 {
		return nil, errors.New("topo: detection found no NUMA node")
	}
	sort.Slice(h.numa, func(i, j int) bool { return h.numa[i].id < h.numa[j].id })
	doc := &Element{Name: "system", Attrs: []Attr{{"version", "1"}}}
	cpus := map[int]*Element{}
	width := 0
	for _, n := range h.numa {
		for _, c := range n.cpus.CPUs() {
			width = max(width, c/32+1)
		}
	}
	for _, n := range h.numa {
		e := doc.Add("cpu")
		if h.hostHash != "" {
			e.Set("host_hash", h.hostHash)
		}
		e.Set("numaid", strconv.Itoa(n.id))
		e.Set("affinity", n.cpus.Mask(width))
		e.Set("arch", h.arch)
		e.Set("vendor", h.vendor)
		e.Set("familyid", strconv.Itoa(h.family))
		e.Set("modelid", strconv.Itoa(h.model))
		if n.memKB > 0 {
			e.Set(memoryAttr, strconv.FormatUint(n.memKB, 10))
		}
		cpus[n.id] = e
	}
	devs := append([]deviceFacts(nil), h.devices...)
	for _, d := range devs {
		if len(d.chain) == 0 {
			return nil, errors.New("topo: detected device without a PCI function")
		}
	}
	sort.SliceStable(devs, func(i, j int) bool {
		return devs[i].chain[len(devs[i].chain)-1].busID < devs[j].chain[len(devs[j].chain)-1].busID
	})
	// A PCI tree hangs from one NUMA node, though its functions may
	// disagree (-1 on some): the first known node of any of its functions.
	treeNUMA := map[string]int{}
	for _, d := range devs {
		if _, ok := cpus[d.numa]; ok {
			if _, set := treeNUMA[d.chain[0].busID]; !set {
				treeNUMA[d.chain[0].busID] = d.numa
			}
		}
	}
	for _, d := range devs {
		parent := cpus[h.numa[0].id]
		if n, ok := treeNUMA[d.chain[0].busID]; ok {
			parent = cpus[n]
		}
		for _, f := range d.chain {
			var found *Element
			for _, c := range parent.Children {
				if c.Name == "pci" && c.Attr("busid") == f.busID {
					found = c
					break
				}
			}
			if found == nil {
				found = parent.Add("pci",
					Attr{"busid", f.busID}, Attr{"class", f.class}, Attr{"vendor", f.vendor}, Attr{"device", f.device},
					Attr{"subsystem_vendor", f.subVendor}, Attr{"subsystem_device", f.subDevice},
					Attr{"link_speed", f.linkSpeed}, Attr{"link_width", f.linkWidth})
			}
			parent = found
		}
		if d.gpu != nil {
			ge := parent.Add("gpu", Attr{"dev", strconv.Itoa(d.gpu.Index)}, Attr{"sm", strconv.Itoa(d.gpu.SM)}, Attr{"rank", "-1"}, Attr{"gdr", "1"})
			for _, l := range d.gpu.NVLinks {
				ge.Add("nvlink", Attr{"target", l.BusID}, Attr{"count", strconv.Itoa(l.Count)}, Attr{"tclass", fmt.Sprintf("0x%06x", l.Class)})
			}
		}
		if len(d.nets) > 0 {
			nic := parent.Child("nic")
			if nic == nil {
				nic = parent.Add("nic")
			}
			for _, n := range d.nets {
				gdr := "0"
				if n.gdr {
					gdr = "1"
				}
				nic.Add("net", Attr{"name", n.name}, Attr{"dev", strconv.Itoa(n.dev)}, Attr{"speed", strconv.Itoa(n.speedMbps)},
					Attr{"port", strconv.Itoa(n.port)}, Attr{"latency", "0.000000"}, Attr{"guid", n.guid},
					Attr{"maxconn", strconv.Itoa(n.maxConn)}, Attr{"gdr", gdr})
			}
		}
	}
	return doc, nil
}

// Detect inspects this host and returns its graph. Parts that cannot be
// inspected (no NVML, no RDMA devices) are noted in the graph's Warnings;
// the CPU, PCI and NIC graph is still returned.
func (d Detector) Detect() (*Graph, error) {
	facts, notes, err := d.gather()
	if err != nil {
		return nil, err
	}
	doc, err := facts.document()
	if err != nil {
		return nil, err
	}
	g, err := Build(doc)
	if err != nil {
		return nil, fmt.Errorf("topo: detected topology: %w", err)
	}
	g.Warnings = append(notes, g.Warnings...)
	return g, nil
}
