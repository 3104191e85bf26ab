package topo

import (
	"strings"
	"testing"
)

// On HGX A100 boards the NVSwitches are PCI functions too (class 0x068000,
// under a bridge of some socket), and the GPUs' NVLinks name those
// functions. The NVSwitch fabric must not become a PCI shortcut between
// sockets: a device reaches another socket's devices over PCI only through
// the CPUs (SYS), or through an NVLink peer (PXN).
func TestNVSwitchPCIFunctionIsNoPCIShortcut(t *testing.T) {
	doc, err := ParseXML(strings.NewReader(`<system version="1">
  <cpu numaid="0" affinity="0000000f" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
    <pci busid="0000:10:00.0" class="0x060400" link_speed="16.0 GT/s PCIe" link_width="16">
      <pci busid="0000:11:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
        <gpu dev="0" sm="80"><nvlink target="0000:30:00.0" count="6" tclass="0x068000"/><nvlink target="0000:40:00.0" count="6" tclass="0x068000"/></gpu>
      </pci>
      <pci busid="0000:12:00.0" class="0x020700" link_speed="16.0 GT/s PCIe" link_width="16"><nic><net name="mlx5_0" speed="200000"/></nic></pci>
    </pci>
    <pci busid="0000:2f:00.0" class="0x060400" link_speed="16.0 GT/s PCIe" link_width="16">
      <pci busid="0000:30:00.0" class="0x068000" link_speed="16.0 GT/s PCIe" link_width="16"/>
    </pci>
  </cpu>
  <cpu numaid="1" affinity="000000f0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
    <pci busid="0000:20:00.0" class="0x060400" link_speed="16.0 GT/s PCIe" link_width="16">
      <pci busid="0000:21:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
        <gpu dev="1" sm="80"><nvlink target="0000:30:00.0" count="6" tclass="0x068000"/><nvlink target="0000:40:00.0" count="6" tclass="0x068000"/></gpu>
      </pci>
      <pci busid="0000:22:00.0" class="0x020700" link_speed="16.0 GT/s PCIe" link_width="16"><nic><net name="mlx5_1" speed="200000"/></nic></pci>
    </pci>
    <pci busid="0000:3f:00.0" class="0x060400" link_speed="16.0 GT/s PCIe" link_width="16">
      <pci busid="0000:40:00.0" class="0x068000" link_speed="16.0 GT/s PCIe" link_width="16"/>
    </pci>
  </cpu>
</system>
`))
	if err != nil {
		t.Fatal(err)
	}
	g, err := Build(doc)
	if err != nil {
		t.Fatal(err)
	}
	gpu0, gpu1 := g.Find(GPU, "0000:11:00.0"), g.Find(GPU, "0000:21:00.0")
	nic0, nic1 := g.Find(NIC, "0000:12:00.0"), g.Find(NIC, "0000:22:00.0")
	cpu0, cpu1 := g.Find(CPU, "numa0"), g.Find(CPU, "numa1")
	if p := g.Path(gpu0, gpu1); p.Type != PathNVL || !near(p.BW, 12*20) {
		t.Errorf("GPU0 -> GPU1: %s %.1f GB/s, want NVL 240", p.Type, p.BW)
	}
	if p := g.Path(nic0, nic1); p.Type != PathSYS {
		t.Errorf("NIC0 -> NIC1: %s via %v, want SYS", p.Type, ids(p.Nodes))
	}
	if p := g.Path(cpu0, nic1); p.Type != PathSYS {
		t.Errorf("CPU0 -> NIC1: %s via %v, want SYS", p.Type, ids(p.Nodes))
	}
	if p := g.Path(gpu0, nic1); p.Type != PathPXN || p.Via != gpu1 {
		t.Errorf("GPU0 -> NIC1: %s via %v, want PXN through GPU1", p.Type, ids(p.Nodes))
	}
	if p := g.Path(gpu0, cpu1); p.Type != PathSYS {
		t.Errorf("GPU0 -> CPU1: %s via %v, want SYS", p.Type, ids(p.Nodes))
	}
	if got := g.NearestNICs(gpu0); len(got) != 1 || got[0] != nic0 {
		t.Errorf("GPU0's nearest NICs: %v, want NIC0", ids(got))
	}
}

func ids(ns []*Node) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.ID)
	}
	return out
}

// Two NICs under a GPU's switch, one with a 400 Gb/s port and one with a
// 100 Gb/s port, both on x16 Gen5 links: the nearest is the one that can
// carry more, as NCCL compares the paths to the network ports, and the
// path between hosts goes at the faster NIC's speed.
func TestNearestNICsCountsThePort(t *testing.T) {
	doc := `<system version="1"><cpu numaid="0" affinity="f">
<pci busid="0000:10:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">
  <pci busid="0000:11:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16"><gpu dev="0" sm="90"/></pci>
  <pci busid="0000:12:00.0" class="0x020000" link_speed="32.0 GT/s PCIe" link_width="16"><nic><net name="slow" speed="100000"/></nic></pci>
  <pci busid="0000:13:00.0" class="0x020000" link_speed="32.0 GT/s PCIe" link_width="16"><nic><net name="fast" speed="400000"/></nic></pci>
</pci></cpu></system>`
	job, err := Merge([]RankTopology{{"a", []byte(doc)}, {"b", []byte(doc)}})
	if err != nil {
		t.Fatal(err)
	}
	g := job.Hosts[0].Graph
	gpu := g.Nodes[GPU][0]
	if got := g.NearestNICs(gpu); len(got) != 1 || got[0].ID != "0000:13:00.0" {
		t.Errorf("nearest NICs %v, want the 400 Gb/s one", ids(got))
	}
	if p := job.InterHostPath(0, gpu, 1, job.Hosts[1].Graph.Nodes[GPU][0]); !near(p.BW, 48) {
		t.Errorf("between hosts: %.1f GB/s, want 48 (the 400 Gb/s NIC's Gen5 x16 link)", p.BW)
	}
}
