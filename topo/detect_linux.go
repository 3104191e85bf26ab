//go:build linux

package topo

import (
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"github.com/Mellanox/rdmamap"
)

var busIDPattern = regexp.MustCompile(`^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$`)

// sysfs reads files below a root, so that tests can use a fake tree.
type sysfs struct{ root string }

func (s sysfs) path(p string) string { return filepath.Join(s.root, p) }

func (s sysfs) read(p string) string {
	b, err := os.ReadFile(s.path(p))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func (d Detector) gather() (*hostFacts, []string, error) {
	root := d.Root
	if root == "" {
		root = "/"
	}
	fs := sysfs{root}
	var notes []string
	h := &hostFacts{arch: archName(runtime.GOARCH)}
	if err := fs.numaNodes(h); err != nil {
		return nil, nil, err
	}
	fs.cpuInfo(h)
	h.hostHash = d.HostHash
	if h.hostHash == "" {
		host, _ := os.Hostname()
		f := fnv.New64a()
		f.Write([]byte(host + "\x00" + fs.read("proc/sys/kernel/random/boot_id")))
		h.hostHash = fmt.Sprintf("0x%x", f.Sum64())
	}

	byFunc := map[string]*deviceFacts{}
	add := func(busID string) (*deviceFacts, error) {
		if d, ok := byFunc[busID]; ok {
			return d, nil
		}
		chain, err := fs.pciChain(busID)
		if err != nil {
			return nil, err
		}
		numa := -1
		if v, err := strconv.Atoi(fs.read("sys/bus/pci/devices/" + busID + "/numa_node")); err == nil {
			numa = v
		}
		df := &deviceFacts{chain: chain, numa: numa}
		byFunc[busID] = df
		return df, nil
	}

	// GPUs: NVML when it loads, otherwise the NVIDIA display functions on
	// the PCI bus, without device numbers or NVLinks.
	src := d.GPUs
	var srcErr error
	if src == nil {
		src, srcErr = NewNVMLSource()
	}
	var gpus []GPUDevice
	if srcErr == nil {
		gpus, srcErr = src.GPUs()
	}
	if srcErr != nil {
		notes = append(notes, fmt.Sprintf("no NVML: %v", srcErr))
		gpus = nil
		for _, bdf := range fs.pciFunctions() {
			class := fs.read("sys/bus/pci/devices/" + bdf + "/class")
			if strings.HasPrefix(class, "0x03") && fs.read("sys/bus/pci/devices/"+bdf+"/vendor") == "0x10de" {
				if _, err := add(bdf); err != nil {
					return nil, nil, err
				}
				notes = append(notes, fmt.Sprintf("GPU %s found on the PCI bus only: no device number, compute capability or NVLinks", bdf))
			}
		}
	}
	for i := range gpus {
		g := gpus[i]
		id, err := NormalizeBusID(g.BusID)
		if err != nil {
			return nil, nil, fmt.Errorf("topo: GPU %d: %w", g.Index, err)
		}
		df, err := add(id)
		if err != nil {
			return nil, nil, err
		}
		df.gpu = &g
	}

	// RDMA devices (InfiniBand, RoCE, EFA) first: a NIC that has one is
	// used through it, and named after it, as NCCL's IB transport does.
	gdr := fs.exists("sys/module/nvidia_peermem") || fs.exists("sys/kernel/mm/memory_peers/nv_mem/version")
	netDev := 0
	rdmaFuncs := map[string]bool{}
	rdmaDevs := fs.rdmaDevices()
	if len(rdmaDevs) == 0 {
		notes = append(notes, "no RDMA devices")
	}
	for _, name := range rdmaDevs {
		bdf := fs.pciFunctionOf("sys/class/infiniband/" + name + "/device")
		if bdf == "" {
			notes = append(notes, fmt.Sprintf("RDMA device %s is not a PCI function; left out", name))
			continue
		}
		df, err := add(bdf)
		if err != nil {
			return nil, nil, err
		}
		rdmaFuncs[bdf] = true
		guid := strings.ReplaceAll(fs.read("sys/class/infiniband/"+name+"/node_guid"), ":", "")
		if guid != "" {
			guid = "0x" + strings.TrimLeft(guid, "0")
		}
		for _, port := range fs.dirNames("sys/class/infiniband/" + name + "/ports") {
			p, err := strconv.Atoi(port)
			if err != nil {
				continue
			}
			netName := name
			if p > 1 {
				netName = name + ":" + port
			}
			df.nets = append(df.nets, netFacts{
				name: netName, dev: netDev, port: p, guid: guid, gdr: gdr, maxConn: 131072,
				speedMbps: parseIBRate(fs.read("sys/class/infiniband/" + name + "/ports/" + port + "/rate")),
			})
			netDev++
		}
	}
	for _, ifname := range fs.dirNames("sys/class/net") {
		bdf := fs.pciFunctionOf("sys/class/net/" + ifname + "/device")
		if bdf == "" || rdmaFuncs[bdf] {
			continue // virtual interfaces, and NICs already used through RDMA
		}
		df, err := add(bdf)
		if err != nil {
			return nil, nil, err
		}
		speed, err := strconv.Atoi(fs.read("sys/class/net/" + ifname + "/speed"))
		if err != nil || speed < 0 {
			speed = 0 // virtio and down links say -1
		}
		df.nets = append(df.nets, netFacts{name: ifname, dev: netDev, port: 1, speedMbps: speed, guid: fmt.Sprintf("0x%x", netDev), maxConn: 65536})
		netDev++
	}
	for _, df := range byFunc {
		h.devices = append(h.devices, *df)
	}
	return h, notes, nil
}

func archName(goarch string) string {
	switch goarch {
	case "amd64":
		return "x86_64"
	case "ppc64le", "ppc64":
		return "ppc64"
	}
	return goarch
}

func (s sysfs) exists(p string) bool {
	_, err := os.Stat(s.path(p))
	return err == nil
}

func (s sysfs) dirNames(p string) []string {
	entries, err := os.ReadDir(s.path(p))
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

// rdmaDevices lists RDMA devices: through rdmamap on the real system, from
// the fake tree in tests (rdmamap reads the fixed path /sys/class/infiniband).
func (s sysfs) rdmaDevices() []string {
	if filepath.Clean(s.root) == "/" {
		devs := rdmamap.GetRdmaDeviceList()
		sort.Strings(devs)
		return devs
	}
	return s.dirNames("sys/class/infiniband")
}

func (s sysfs) numaNodes(h *hostFacts) error {
	for _, name := range s.dirNames("sys/devices/system/node") {
		id, err := strconv.Atoi(strings.TrimPrefix(name, "node"))
		if !strings.HasPrefix(name, "node") || err != nil {
			continue
		}
		cpus, err := ParseCPUList(s.read("sys/devices/system/node/" + name + "/cpulist"))
		if err != nil {
			return fmt.Errorf("topo: NUMA node %d: %w", id, err)
		}
		h.numa = append(h.numa, numaFacts{id: id, cpus: cpus, memKB: parseMemTotal(s.read("sys/devices/system/node/" + name + "/meminfo"))})
	}
	if len(h.numa) > 0 {
		return nil
	}
	// Kernels without NUMA support: one node with every online CPU.
	cpus, err := ParseCPUList(s.read("sys/devices/system/cpu/online"))
	if err != nil {
		return err
	}
	if cpus.Count() == 0 {
		for i := 0; i < runtime.NumCPU(); i++ {
			cpus.Add(i)
		}
	}
	h.numa = []numaFacts{{id: 0, cpus: cpus, memKB: parseMemTotal(s.read("proc/meminfo"))}}
	return nil
}

// parseMemTotal reads "MemTotal: N kB" from a meminfo file (per node:
// "Node 0 MemTotal: N kB").
func parseMemTotal(meminfo string) uint64 {
	for _, line := range strings.Split(meminfo, "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "MemTotal:" {
				v, _ := strconv.ParseUint(f[i+1], 10, 64)
				return v
			}
		}
	}
	return 0
}

func (s sysfs) cpuInfo(h *hostFacts) {
	for _, line := range strings.Split(s.read("proc/cpuinfo"), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "vendor_id":
			if h.vendor == "" {
				h.vendor = v
			}
		case "cpu family":
			if h.family == 0 {
				h.family, _ = strconv.Atoi(v)
			}
		case "model":
			if h.model == 0 {
				h.model, _ = strconv.Atoi(v)
			}
		}
	}
}

func (s sysfs) pciFunctions() []string {
	var out []string
	for _, n := range s.dirNames("sys/bus/pci/devices") {
		if busIDPattern.MatchString(n) {
			out = append(out, n)
		}
	}
	return out
}

// pciFunctionOf returns the PCI function a sysfs device link leads to (the
// last bus id on its resolved path: a virtio or auxiliary device hangs below
// its function), or "".
func (s sysfs) pciFunctionOf(link string) string {
	real, err := filepath.EvalSymlinks(s.path(link))
	if err != nil {
		return ""
	}
	ids := busIDs(real)
	if len(ids) == 0 {
		return ""
	}
	return ids[len(ids)-1]
}

func busIDs(path string) []string {
	var out []string
	for _, c := range strings.Split(filepath.ToSlash(path), "/") {
		if busIDPattern.MatchString(c) {
			out = append(out, c)
		}
	}
	return out
}

// pciChain returns the PCI functions from the top switch down to busID.
func (s sysfs) pciChain(busID string) ([]pciFacts, error) {
	real, err := filepath.EvalSymlinks(s.path("sys/bus/pci/devices/" + busID))
	if err != nil {
		// Known to NVML but not in this tree (a container without /sys):
		// the device alone, straight under its CPU.
		return []pciFacts{{busID: busID, class: "0x030200"}}, nil
	}
	// As NCCL does, follow every second bus id up from the device: a
	// switch's downstream port is folded into the switch (its upstream
	// port), and the root port into the CPU.
	ids := busIDs(real)
	var kept []int
	for i := len(ids) - 1; i >= 0; i -= 2 {
		kept = append([]int{i}, kept...)
	}
	link := func(id string) (speed, width string) {
		dir := "sys/bus/pci/devices/" + id + "/"
		speed = s.read(dir + "max_link_speed")
		if speed == "" {
			speed = s.read(dir + "current_link_speed")
		}
		width = s.read(dir + "max_link_width")
		if width == "" {
			width = s.read(dir + "current_link_width")
		}
		return speed, width
	}
	var chain []pciFacts
	for _, i := range kept {
		id := ids[i]
		dir := "sys/bus/pci/devices/" + id + "/"
		speed, width := link(id)
		if i > 0 {
			// The link runs at the slower end: the device or the port
			// above it, as NCCL reads max_link_* and ../max_link_*.
			pSpeed, pWidth := link(ids[i-1])
			if ps, err := ParseLinkSpeed(pSpeed); err == nil {
				if ds, err := ParseLinkSpeed(speed); err != nil || ps < ds {
					speed = pSpeed
				}
			}
			if pw, err := strconv.Atoi(pWidth); err == nil && pw > 0 {
				if dw, err := strconv.Atoi(width); err != nil || dw <= 0 || pw < dw {
					width = pWidth
				}
			}
		}
		chain = append(chain, pciFacts{
			busID: id, class: s.read(dir + "class"), vendor: s.read(dir + "vendor"), device: s.read(dir + "device"),
			subVendor: s.read(dir + "subsystem_vendor"), subDevice: s.read(dir + "subsystem_device"),
			linkSpeed: speed, linkWidth: width,
		})
	}
	if len(chain) == 0 {
		return nil, fmt.Errorf("topo: PCI function %s resolves to %s, which names no bus id", busID, real)
	}
	return chain, nil
}

// parseIBRate reads an InfiniBand port rate ("200 Gb/sec (4X HDR)") in Mb/s.
func parseIBRate(rate string) int {
	f := strings.Fields(rate)
	if len(f) < 2 || f[1] != "Gb/sec" {
		return 0
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil || v < 0 || v > 1e6 {
		return 0
	}
	return int(v * 1000)
}
