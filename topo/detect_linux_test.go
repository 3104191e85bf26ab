//go:build linux

package topo

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// fakeSysfs builds a sysfs tree: two NUMA nodes, a root port with two
// levels of switches holding a GPU and a ConnectX (RDMA device mlx5_0 plus
// its netdev), a virtio NIC on the root complex, and a loopback device.
func fakeSysfs(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	write := func(p, content string) {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(p, target string) {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, full); err != nil {
			t.Fatal(err)
		}
	}
	write("sys/devices/system/node/node0/cpulist", "0-3")
	write("sys/devices/system/node/node0/meminfo", "Node 0 MemTotal:       16384000 kB\nNode 0 MemFree: 1 kB")
	write("sys/devices/system/node/node1/cpulist", "4-7")
	write("sys/devices/system/node/node1/meminfo", "Node 1 MemTotal:       8192000 kB")
	write("sys/devices/system/node/online", "0-1")
	write("proc/cpuinfo", "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n")
	fn := func(dir, class, vendor, speed, width, numa string) {
		write(dir+"/class", class)
		write(dir+"/vendor", vendor)
		write(dir+"/device", "0x1234")
		write(dir+"/subsystem_vendor", vendor)
		write(dir+"/subsystem_device", "0x0001")
		write(dir+"/max_link_speed", speed)
		write(dir+"/max_link_width", width)
		write(dir+"/numa_node", numa)
	}
	// Root port 80:00.0, then a switch (upstream port 80:01.0, downstream
	// port 80:02.0) holding a second switch (upstream 81:00.0, downstream
	// ports 81:01.0 and 81:02.0) with the GPU and the ConnectX. Detection
	// folds downstream ports into their switch, as NCCL does.
	rootPort := "sys/devices/pci0000:80/0000:80:00.0"
	port := rootPort + "/0000:80:01.0"
	dsp := port + "/0000:80:02.0"
	sw := dsp + "/0000:81:00.0"
	gpu := sw + "/0000:81:01.0/0000:82:00.0"
	cx := sw + "/0000:81:02.0/0000:83:00.0"
	virtio := "sys/devices/pci0000:00/0000:00:03.0"
	fn(rootPort, "0x060400", "0x8086", "32.0 GT/s PCIe", "16", "1")
	fn(port, "0x060400", "0x1000", "32.0 GT/s PCIe", "16", "1")
	fn(dsp, "0x060400", "0x1000", "32.0 GT/s PCIe", "16", "1")
	fn(sw, "0x060400", "0x1000", "32.0 GT/s PCIe", "16", "1")
	fn(filepath.Dir(gpu), "0x060400", "0x1000", "32.0 GT/s PCIe", "16", "1")
	fn(filepath.Dir(cx), "0x060400", "0x1000", "32.0 GT/s PCIe", "16", "1")
	fn(gpu, "0x030200", "0x10de", "32.0 GT/s PCIe", "16", "1")
	fn(cx, "0x020000", "0x15b3", "32.0 GT/s PCIe", "16", "1")
	fn(virtio, "0x020000", "0x1af4", "Unknown", "0", "-1")
	for _, d := range []string{rootPort, port, dsp, sw, filepath.Dir(gpu), filepath.Dir(cx), gpu, cx, virtio} {
		link("sys/bus/pci/devices/"+filepath.Base(d), "../../../"+strings.TrimPrefix(d, "sys/"))
	}
	write(cx+"/infiniband/mlx5_0/node_guid", "34f4:e300:03e1:a258")
	write(cx+"/infiniband/mlx5_0/ports/1/rate", "200 Gb/sec (4X HDR)")
	link("sys/class/infiniband/mlx5_0", "../../"+strings.TrimPrefix(cx, "sys/")+"/infiniband/mlx5_0")
	link(cx+"/infiniband/mlx5_0/device", "../../../0000:83:00.0")
	write(cx+"/net/ens1/speed", "200000")
	link("sys/class/net/ens1", "../../"+strings.TrimPrefix(cx, "sys/")+"/net/ens1")
	link(cx+"/net/ens1/device", "../../../0000:83:00.0")
	write(virtio+"/virtio2/net/eth0/speed", "-1")
	link("sys/class/net/eth0", "../../"+strings.TrimPrefix(virtio, "sys/")+"/virtio2/net/eth0")
	link(virtio+"/virtio2/net/eth0/device", "../../../virtio2")
	write("sys/devices/virtual/net/lo/speed", "0")
	link("sys/class/net/lo", "../../devices/virtual/net/lo")
	return root
}

type fakeGPUs struct {
	gpus []GPUDevice
	err  error
}

func (f fakeGPUs) GPUs() ([]GPUDevice, error) { return f.gpus, f.err }

func TestDetectFakeSysfs(t *testing.T) {
	root := fakeSysfs(t)
	d := Detector{Root: root, HostHash: "0x1", GPUs: fakeGPUs{gpus: []GPUDevice{{Index: 0, BusID: "0000:82:00.0", SM: 90,
		NVLinks: []NVLinkPeer{{BusID: "0000:c0:00.0", Class: 0x068000, Count: 18}}}}}}
	g, err := d.Detect()
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Nodes[CPU]) != 2 {
		t.Fatalf("%d NUMA nodes, want 2", len(g.Nodes[CPU]))
	}
	n1 := g.Find(CPU, "numa1")
	if n1.CPU.Affinity.String() != "4-7" || n1.CPU.MemoryKB != 8192000 || n1.CPU.Vendor != "GenuineIntel" || n1.CPU.Model != 143 {
		t.Errorf("numa1: %+v", n1.CPU)
	}
	gpu := g.Find(GPU, "0000:82:00.0")
	if gpu == nil || gpu.GPU.SM != 90 || g.NVLinks(gpu) != 18 || g.LocalCPU(gpu) != n1 {
		t.Fatalf("GPU: %+v", gpu)
	}
	if gpu.Parent.ID != "0000:81:00.0" || gpu.Parent.Parent.ID != "0000:80:01.0" {
		t.Errorf("GPU's PCI chain: %s <- %s", gpu.Parent.ID, gpu.Parent.Parent.ID)
	}
	// The ConnectX is used through mlx5_0 (its netdev is not listed twice).
	cx := g.Find(NIC, "0000:83:00.0")
	if cx == nil {
		t.Fatal("ConnectX not detected")
	}
	net := g.Find(NET, "mlx5_0")
	if net == nil || net.Parent != cx || net.Net.SpeedMbps != 200000 || net.Net.GUID != "0x34f4e30003e1a258" {
		t.Errorf("mlx5_0: %+v", net)
	}
	if g.Find(NET, "ens1") != nil {
		t.Error("ens1 listed beside its RDMA device")
	}
	if p := g.Path(gpu, cx); p.Type != PathPIX {
		t.Errorf("GPU -> ConnectX: %s, want PIX", p.Type)
	}
	// virtio: numa_node -1 puts it on the first node; speed -1 is unknown.
	eth := g.Find(NET, "eth0")
	if eth == nil || eth.Parent.ID != "0000:00:03.0" || g.LocalCPU(eth) != g.Find(CPU, "numa0") || eth.Net.SpeedMbps != 0 {
		t.Errorf("eth0: %+v", eth)
	}
	if g.Find(NET, "lo") != nil {
		t.Error("loopback listed as a NIC")
	}
	if len(g.Warnings) != 1 || !strings.Contains(g.Warnings[0], "Unknown") {
		t.Errorf("warnings %q, want one about the virtio link speed", g.Warnings)
	}
	// The dump reads back to the same graph.
	back, err := ParseXML(strings.NewReader(string(MarshalXML(g.Doc))))
	if err != nil {
		t.Fatal(err)
	}
	g2, err := Build(back)
	if err != nil {
		t.Fatal(err)
	}
	if summarize(g) != summarize(g2) {
		t.Error("detected graph changes through its dump")
	}
}

func TestDetectWithoutNVML(t *testing.T) {
	root := fakeSysfs(t)
	g, err := Detector{Root: root, GPUs: fakeGPUs{err: errorString("libnvidia-ml.so.1 not found")}}.Detect()
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Warnings) == 0 || g.Warnings[0] != "no NVML: libnvidia-ml.so.1 not found" {
		t.Errorf("warnings %q, want no NVML first", g.Warnings)
	}
	// The NVIDIA function is still a GPU node, from its class code.
	gpu := g.Find(GPU, "0000:82:00.0")
	if gpu == nil || gpu.GPU.Dev != -1 || g.NVLinks(gpu) != 0 {
		t.Errorf("GPU from PCI only: %+v", gpu)
	}
}

type errorString string

func (e errorString) Error() string { return string(e) }

// TestDetectThisMachine runs detection on the real /sys and checks the NUMA
// layout against the kernel's own files.
func TestDetectThisMachine(t *testing.T) {
	if _, err := os.Stat("/sys/devices/system/cpu/online"); err != nil {
		t.Skip("no sysfs here")
	}
	g, err := Detector{}.Detect()
	if err != nil {
		t.Fatal(err)
	}
	nodes, _ := filepath.Glob("/sys/devices/system/node/node[0-9]*")
	if len(nodes) > 0 && len(g.Nodes[CPU]) != len(nodes) {
		t.Errorf("%d NUMA nodes detected, /sys has %d", len(g.Nodes[CPU]), len(nodes))
	}
	var all CPUSet
	for _, c := range g.Nodes[CPU] {
		if len(nodes) > 0 {
			b, err := os.ReadFile(filepath.Join("/sys/devices/system/node", "node"+strconv.Itoa(c.CPU.NUMA), "cpulist"))
			if err != nil {
				t.Fatal(err)
			}
			want, _ := ParseCPUList(string(b))
			if !c.CPU.Affinity.Equal(want) {
				t.Errorf("NUMA %d: CPUs %s, /sys says %s", c.CPU.NUMA, c.CPU.Affinity, want)
			}
		}
		all = all.Union(c.CPU.Affinity)
	}
	b, _ := os.ReadFile("/sys/devices/system/cpu/online")
	online, _ := ParseCPUList(string(b))
	if !all.Equal(online) {
		t.Errorf("detected CPUs %s, online %s", all, online)
	}
	// Every PCI network interface appears as a port.
	ifs, _ := os.ReadDir("/sys/class/net")
	for _, e := range ifs {
		if _, err := os.Stat(filepath.Join("/sys/class/net", e.Name(), "device")); err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join("/sys/class/net", e.Name(), "device", "infiniband")); err == nil {
			continue // used through its RDMA device
		}
		if g.Find(NET, e.Name()) == nil {
			t.Errorf("interface %s not detected", e.Name())
		}
	}
	t.Logf("warnings: %q", g.Warnings)
}

// TestDetectLeaksNoFiles checks that detection closes what it opens.
func TestDetectLeaksNoFiles(t *testing.T) {
	root := fakeSysfs(t)
	count := func() int {
		fds, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skip("no /proc/self/fd")
		}
		return len(fds)
	}
	before := count()
	for i := 0; i < 20; i++ {
		if _, err := (Detector{Root: root, GPUs: fakeGPUs{}}).Detect(); err != nil {
			t.Fatal(err)
		}
	}
	if after := count(); after > before {
		t.Errorf("%d open files before 20 detections, %d after", before, after)
	}
}

// NVML writes bus ids with an 8-digit domain ("00000000:82:00.0", as
// nvidia-smi shows them) while sysfs uses 4 digits. The GPU must still be
// found in sysfs, under its PCI chain and NUMA node, and NVLinks between
// GPUs written that way must resolve.
func TestDetectNVMLEightDigitDomain(t *testing.T) {
	root := fakeSysfs(t)
	d := Detector{Root: root, HostHash: "0x1", GPUs: fakeGPUs{gpus: []GPUDevice{{Index: 0, BusID: "00000000:82:00.0", SM: 90,
		NVLinks: []NVLinkPeer{{BusID: "00000000:C0:00.0", Class: 0x068000, Count: 18}}}}}}
	g, err := d.Detect()
	if err != nil {
		t.Fatal(err)
	}
	gpu := g.Find(GPU, "0000:82:00.0")
	if gpu == nil {
		t.Fatalf("GPU not found as 0000:82:00.0: %v", g.Nodes[GPU])
	}
	if gpu.Parent == nil || gpu.Parent.ID != "0000:81:00.0" || g.LocalCPU(gpu) != g.Find(CPU, "numa1") {
		t.Errorf("GPU detached from its PCI chain: parent %v", gpu.Parent)
	}
	if p := g.Path(gpu, g.Find(NIC, "0000:83:00.0")); p.Type != PathPIX {
		t.Errorf("GPU -> ConnectX: %s, want PIX", p.Type)
	}
}

// Functions of one PCI tree may disagree on numa_node (-1 on some, the
// node on others: VMs and some firmware do this). Detection must still
// place the tree once, under the node that is known, and not fail on a
// bridge that appears under two NUMA nodes.
func TestDetectMixedNUMANodeInOneTree(t *testing.T) {
	root := fakeSysfs(t)
	cx := filepath.Join(root, "sys/bus/pci/devices/0000:83:00.0/numa_node")
	if err := os.WriteFile(cx, []byte("-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := Detector{Root: root, HostHash: "0x1", GPUs: fakeGPUs{gpus: []GPUDevice{{Index: 0, BusID: "0000:82:00.0", SM: 90}}}}
	g, err := d.Detect()
	if err != nil {
		t.Fatal(err)
	}
	gpu, nic := g.Find(GPU, "0000:82:00.0"), g.Find(NIC, "0000:83:00.0")
	if gpu == nil || nic == nil {
		t.Fatal("GPU or ConnectX missing")
	}
	if n1 := g.Find(CPU, "numa1"); g.LocalCPU(nic) != n1 || g.LocalCPU(gpu) != n1 {
		t.Errorf("ConnectX on %v, GPU on %v; want both on numa1", g.LocalCPU(nic).ID, g.LocalCPU(gpu).ID)
	}
	if p := g.Path(gpu, nic); p.Type != PathPIX {
		t.Errorf("GPU -> ConnectX: %s, want PIX", p.Type)
	}
}

// A function on a device's path whose class or link files cannot be read
// (a bridge of a platform bus, a restricted sysfs) is still a bridge: the
// device is detected below it.
func TestDetectUnreadableClass(t *testing.T) {
	root := fakeSysfs(t)
	sw := filepath.Join(root, "sys/bus/pci/devices/0000:81:00.0")
	for _, f := range []string{"class", "max_link_speed", "max_link_width"} {
		if err := os.Remove(filepath.Join(sw, f)); err != nil {
			t.Fatal(err)
		}
	}
	d := Detector{Root: root, HostHash: "0x1", GPUs: fakeGPUs{gpus: []GPUDevice{{Index: 0, BusID: "0000:82:00.0", SM: 90}}}}
	g, err := d.Detect()
	if err != nil {
		t.Fatal(err)
	}
	gpu := g.Find(GPU, "0000:82:00.0")
	if gpu == nil || gpu.Parent == nil || gpu.Parent.ID != "0000:81:00.0" || gpu.Parent.Type != PCI {
		t.Fatalf("GPU not below the switch: %+v", gpu)
	}
}

// A PCIe switch shows in sysfs as an upstream port with one downstream port
// per device: rootport/usp/dsp1/gpu and rootport/usp/dsp2/nic. NCCL folds
// each downstream port into its switch (it follows every second bus id of
// the path, and a device on a root port hangs from the CPU), so a GPU and a
// NIC under one switch are PIX, as nvidia-smi also says; keeping every port
// made them PXB.
func TestDetectSwitchDownstreamPortsFolded(t *testing.T) {
	root := t.TempDir()
	write := func(p, content string) {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("sys/devices/system/node/node0/cpulist", "0-3")
	rp := "sys/devices/pci0000:00/0000:00:01.0"
	usp := rp + "/0000:01:00.0"
	gpu := usp + "/0000:02:00.0/0000:03:00.0"
	nic := usp + "/0000:02:01.0/0000:04:00.0"
	other := "sys/devices/pci0000:00/0000:00:02.0/0000:05:00.0" // a NIC on a root port
	for d, class := range map[string]string{rp: "0x060400", usp: "0x060400", filepath.Dir(gpu): "0x060400", filepath.Dir(nic): "0x060400",
		gpu: "0x030200", nic: "0x020000", "sys/devices/pci0000:00/0000:00:02.0": "0x060400", other: "0x020000"} {
		write(d+"/class", class)
		write(d+"/max_link_speed", "32.0 GT/s PCIe")
		write(d+"/max_link_width", "16")
		write(d+"/numa_node", "0")
		full := filepath.Join(root, "sys/bus/pci/devices", filepath.Base(d))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(root, d), full); err != nil {
			t.Fatal(err)
		}
	}
	for name, dev := range map[string]string{"ens1": nic, "ens2": other} {
		write(dev+"/net/"+name+"/speed", "100000")
		full := filepath.Join(root, "sys/class/net", name)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(root, dev, "net", name), full); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(root, dev), filepath.Join(root, dev, "net", name, "device")); err != nil {
			t.Fatal(err)
		}
	}
	d := Detector{Root: root, HostHash: "0x1", GPUs: fakeGPUs{gpus: []GPUDevice{{Index: 0, BusID: "0000:03:00.0", SM: 90}}}}
	g, err := d.Detect()
	if err != nil {
		t.Fatal(err)
	}
	gn, nn, on := g.Find(GPU, "0000:03:00.0"), g.Find(NIC, "0000:04:00.0"), g.Find(NIC, "0000:05:00.0")
	if gn == nil || nn == nil || on == nil {
		t.Fatalf("devices missing: GPUs %v NICs %v", ids(g.Nodes[GPU]), ids(g.Nodes[NIC]))
	}
	if p := g.Path(gn, nn); p.Type != PathPIX {
		t.Errorf("GPU -> NIC under one switch: %s via %v, want PIX", p.Type, ids(p.Nodes))
	}
	if gn.Parent.ID != "0000:01:00.0" || gn.Parent.Parent.Type != CPU {
		t.Errorf("GPU's parents: %s, %s; want the switch 0000:01:00.0, then the CPU", gn.Parent.ID, gn.Parent.Parent.ID)
	}
	if on.Parent.Type != CPU {
		t.Errorf("NIC on a root port hangs from %s, want the CPU", on.Parent.ID)
	}
	if p := g.Path(gn, on); p.Type != PathPHB {
		t.Errorf("GPU -> NIC on a root port: %s, want PHB", p.Type)
	}
}

// A link runs at the slower of its two ends: an x16 Gen5 GPU in a slot whose
// port is x8 Gen4 gets x8 Gen4, as NCCL reads max_link_* of the device and
// of its port (../max_link_*).
func TestDetectLinkIsMinOfBothEnds(t *testing.T) {
	root := fakeSysfs(t)
	port := filepath.Join(root, "sys/bus/pci/devices/0000:81:01.0")
	for f, v := range map[string]string{"max_link_width": "8", "max_link_speed": "16.0 GT/s PCIe"} {
		if err := os.WriteFile(filepath.Join(port, f), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d := Detector{Root: root, HostHash: "0x1", GPUs: fakeGPUs{gpus: []GPUDevice{{Index: 0, BusID: "0000:82:00.0", SM: 90}}}}
	g, err := d.Detect()
	if err != nil {
		t.Fatal(err)
	}
	gpu := g.Find(GPU, "0000:82:00.0")
	if gpu.Dev.Width != 8 || gpu.Dev.SpeedGTs != 16 {
		t.Errorf("GPU link x%d at %v GT/s, want x8 at 16", gpu.Dev.Width, gpu.Dev.SpeedGTs)
	}
	if cx := g.Find(NIC, "0000:83:00.0"); cx.Dev.Width != 16 || cx.Dev.SpeedGTs != 32 {
		t.Errorf("ConnectX link x%d at %v GT/s, want x16 at 32", cx.Dev.Width, cx.Dev.SpeedGTs)
	}
}
