package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/gccl/gccl/algo/tree"
	"github.com/gccl/gccl/topo"
)

// report writes every section for g.
func report(w io.Writer, source string, g *topo.Graph, l *layout) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Topology of %s\n", source)
	for _, note := range g.Warnings {
		fmt.Fprintf(&b, "  note: %s\n", note)
	}
	b.WriteString("\n")
	writeMatrix(&b, g)
	b.WriteString("\n")
	writeNUMA(&b, g)
	b.WriteString("\n")
	writeNICs(&b, g)
	if l != nil {
		b.WriteString("\n")
		l.write(&b, g)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// device is a row (and column) of the matrix.
type device struct {
	label string
	node  *topo.Node
}

func matrixDevices(g *topo.Graph) (gpus, nics []device) {
	for i, n := range g.Nodes[topo.GPU] {
		gpus = append(gpus, device{"GPU" + strconv.Itoa(i), n})
	}
	for i, n := range g.Nodes[topo.NIC] {
		nics = append(nics, device{"NIC" + strconv.Itoa(i), n})
	}
	return gpus, nics
}

// cell is what the matrix shows for a pair: X for the device itself, NV<n>
// for NVLink (n lanes: the fewer of the two ends' into the fabric, or the
// direct link's), else the path class.
func cell(g *topo.Graph, a, b *topo.Node) string {
	if a == b {
		return "X"
	}
	p := g.Path(a, b)
	if p.Type == topo.PathNVL && a.Type == topo.GPU && b.Type == topo.GPU {
		lanes := 0
		direct := false
		for _, l := range a.Links {
			if l.To == b && l.Type == topo.LinkNVL {
				lanes, direct = l.Count, true
			}
		}
		if !direct {
			lanes = min(g.NVLinks(a), g.NVLinks(b))
		}
		return "NV" + strconv.Itoa(lanes)
	}
	return p.Type.String()
}

func writeMatrix(b *strings.Builder, g *topo.Graph) {
	gpus, nics := matrixDevices(g)
	all := append(append([]device(nil), gpus...), nics...)
	if len(all) == 0 {
		b.WriteString("No GPU or NIC found.\n")
		return
	}
	width := 5
	for _, d := range all {
		width = max(width, len(d.label)+1)
	}
	fmt.Fprintf(b, "%-*s", width, "")
	for _, d := range all {
		fmt.Fprintf(b, "%-*s", width, d.label)
	}
	fmt.Fprintf(b, "%-16s %s\n", "CPU Affinity", "NUMA Affinity")
	for _, r := range all {
		fmt.Fprintf(b, "%-*s", width, r.label)
		for _, c := range all {
			fmt.Fprintf(b, "%-*s", width, cell(g, r.node, c.node))
		}
		numa := "N/A"
		if cpu := g.LocalCPU(r.node); cpu != nil {
			numa = strconv.Itoa(cpu.CPU.NUMA)
		}
		aff := g.Affinity(r.node).String()
		if aff == "" {
			aff = "N/A"
		}
		fmt.Fprintf(b, "%-16s %s\n", aff, numa)
	}
	b.WriteString(`
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the link between NUMA nodes (e.g., QPI/UPI)
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXN  = Connection to a NIC through an NVLink peer GPU under the NIC's PCIe switch
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  C2C  = Connection over a chip-to-chip link to the CPU
  NVB  = Connection over NVLink through an intermediate GPU
  NV#  = Connection traversing a bonded set of # NVLinks
`)
	if len(gpus) > 0 {
		b.WriteString("\nGPU Legend:\n\n")
		for _, d := range gpus {
			info := ""
			if d.node.GPU.SM > 0 {
				info = fmt.Sprintf(" sm_%d", d.node.GPU.SM)
			}
			if d.node.GPU.Dev >= 0 {
				info += fmt.Sprintf(" cuda %d", d.node.GPU.Dev)
			}
			nvl := g.NVLinks(d.node)
			if nvl > 0 {
				info += fmt.Sprintf(", %d NVLinks", nvl)
			}
			near := g.NearestNICs(d.node)
			if len(near) > 0 {
				var names []string
				for _, n := range near {
					names = append(names, nicLabel(g, n))
				}
				info += fmt.Sprintf(", nearest NIC %s (%s)", strings.Join(names, " "), g.Path(d.node, near[0]).Type)
			}
			fmt.Fprintf(b, "  %s: %s%s\n", d.label, d.node.ID, info)
		}
	}
	if len(nics) > 0 {
		b.WriteString("\nNIC Legend:\n\n")
		for _, d := range nics {
			fmt.Fprintf(b, "  %s: %s\n", d.label, nicName(g, d.node))
		}
	}
}

// nicName is the NIC's port names, or its bus id when the file lists none.
func nicName(g *topo.Graph, nic *topo.Node) string {
	var names []string
	for _, l := range nic.Links {
		if l.Type == topo.LinkNET {
			names = append(names, l.To.ID)
		}
	}
	if len(names) == 0 {
		return nic.ID
	}
	return strings.Join(names, ",")
}

func nicLabel(g *topo.Graph, nic *topo.Node) string {
	return "NIC" + strconv.Itoa(nic.Index)
}

func writeNUMA(b *strings.Builder, g *topo.Graph) {
	b.WriteString("NUMA nodes:\n\n")
	fmt.Fprintf(b, "  %-5s %-24s %-12s %-6s %-6s %s\n", "node", "CPUs", "memory", "GPUs", "NICs", "CPU")
	for _, cpu := range g.Nodes[topo.CPU] {
		var gpus, nics int
		for _, n := range g.Nodes[topo.GPU] {
			if g.LocalCPU(n) == cpu {
				gpus++
			}
		}
		for _, n := range g.Nodes[topo.NIC] {
			if g.LocalCPU(n) == cpu {
				nics++
			}
		}
		mem := "N/A"
		if cpu.CPU.MemoryKB > 0 {
			mem = fmt.Sprintf("%.1f GiB", float64(cpu.CPU.MemoryKB)/(1<<20))
		}
		kind := strings.TrimSpace(cpu.CPU.Vendor + " " + cpu.CPU.Arch)
		if cpu.CPU.Vendor != "" {
			kind += fmt.Sprintf(" family %d model %d", cpu.CPU.Family, cpu.CPU.Model)
		}
		fmt.Fprintf(b, "  %-5d %-24s %-12s %-6d %-6d %s\n", cpu.CPU.NUMA, cpu.CPU.Affinity.String(), mem, gpus, nics, kind)
	}
	cpus := g.Nodes[topo.CPU]
	if len(cpus) > 1 {
		p := g.Path(cpus[0], cpus[1])
		fmt.Fprintf(b, "\n  between sockets: %s, %.1f GB/s\n", p.Type, p.BW)
	}
}

func writeNICs(b *strings.Builder, g *topo.Graph) {
	b.WriteString("NICs:\n\n")
	if len(g.Nodes[topo.NIC]) == 0 {
		b.WriteString("  none\n")
		return
	}
	fmt.Fprintf(b, "  %-6s %-14s %-16s %-12s %-5s %s\n", "", "bus id", "port", "speed", "NUMA", "PCI")
	for _, nic := range g.Nodes[topo.NIC] {
		numa := "N/A"
		if cpu := g.LocalCPU(nic); cpu != nil {
			numa = strconv.Itoa(cpu.CPU.NUMA)
		}
		pci := "N/A"
		if nic.Dev.LinkSpeed != "" || nic.Dev.Width > 0 {
			w := "x?"
			if nic.Dev.Width > 0 {
				w = "x" + strconv.Itoa(nic.Dev.Width)
			}
			pci = fmt.Sprintf("%s %s", strings.TrimSuffix(nic.Dev.LinkSpeed, " PCIe"), w)
		}
		ports := 0
		for _, l := range nic.Links {
			if l.Type != topo.LinkNET {
				continue
			}
			ports++
			speed := "unknown"
			if l.To.Net.SpeedMbps > 0 {
				speed = fmt.Sprintf("%g Gb/s", float64(l.To.Net.SpeedMbps)/1000)
			}
			fmt.Fprintf(b, "  %-6s %-14s %-16s %-12s %-5s %s\n", nicLabel(g, nic), nic.ID, l.To.ID, speed, numa, pci)
		}
		if ports == 0 {
			fmt.Fprintf(b, "  %-6s %-14s %-16s %-12s %-5s %s\n", nicLabel(g, nic), nic.ID, "-", "unknown", numa, pci)
		}
	}
}

// layout places ranks on devices: nodes identical hosts of perNode ranks,
// rank r on host r / perNode. Local ranks take the GPUs in order, or on a
// host without GPUs the NUMA nodes in blocks.
type layout struct {
	nodes, perNode int
	devs           []*topo.Node // per local rank
	order          []int        // the intra-node ring, local ranks
	ring           []int        // the job's ring, ranks
}

func newLayout(g *topo.Graph, ranks, nodes int) (*layout, error) {
	if nodes < 1 {
		return nil, fmt.Errorf("--nodes %d: need at least 1", nodes)
	}
	if ranks < 0 {
		return nil, fmt.Errorf("--ranks %d: need at least 1", ranks)
	}
	if ranks == 0 {
		return nil, fmt.Errorf("--nodes needs --ranks")
	}
	if ranks%nodes != 0 {
		return nil, fmt.Errorf("--ranks %d does not split evenly over %d nodes", ranks, nodes)
	}
	l := &layout{nodes: nodes, perNode: ranks / nodes}
	if gpus := g.Nodes[topo.GPU]; len(gpus) > 0 {
		if l.perNode > len(gpus) {
			return nil, fmt.Errorf("%d ranks per node, but the node has %d GPUs", l.perNode, len(gpus))
		}
		l.devs = gpus[:l.perNode]
	} else {
		cpus := g.Nodes[topo.CPU]
		if len(cpus) == 0 {
			return nil, fmt.Errorf("the topology has no CPU")
		}
		for i := 0; i < l.perNode; i++ {
			l.devs = append(l.devs, cpus[i*len(cpus)/l.perNode])
		}
	}
	l.order = g.RingOrder(l.devs)
	// The job: nodes copies of this host, rank r on node r / perNode.
	doc := topo.MarshalXML(g.Doc)
	var ranksTopo []topo.RankTopology
	for r := 0; r < ranks; r++ {
		ranksTopo = append(ranksTopo, topo.RankTopology{HostID: "node" + strconv.Itoa(r/l.perNode), XML: doc})
	}
	job, err := topo.Merge(ranksTopo)
	if err != nil {
		return nil, err
	}
	dev := make([]*topo.Node, ranks)
	for _, h := range job.Hosts {
		for i, r := range h.Ranks {
			local := h.Graph.Nodes[l.devs[i].Type]
			dev[r] = local[l.devs[i].Index]
		}
	}
	if l.ring, err = job.RingOrder(dev); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *layout) write(b *strings.Builder, g *topo.Graph) {
	fmt.Fprintf(b, "Layout: %d node(s) x %d rank(s)\n\n", l.nodes, l.perNode)
	for i, d := range l.devs {
		kind := d.Type.String() + " " + d.ID
		if d.Type == topo.CPU {
			kind = fmt.Sprintf("NUMA %d (CPUs %s)", d.CPU.NUMA, d.CPU.Affinity)
		}
		fmt.Fprintf(b, "  local rank %d: %s\n", i, kind)
	}
	if l.perNode > 1 {
		st := g.RingStats(l.devs, l.order)
		var hops []string
		for i, r := range l.order {
			hops = append(hops, fmt.Sprintf("%d -%s-> ", r, st.Types[i]))
		}
		fmt.Fprintf(b, "\n  intra-node ring: %s%d\n", strings.Join(hops, ""), l.order[0])
		fmt.Fprintf(b, "  bottleneck %.1f GB/s, %d NUMA crossing(s)\n", st.MinBW, st.NUMACrossings)
	} else {
		// A lone rank has no hop inside its node (RingStats gives no
		// classes): its ring neighbours are on other nodes.
		b.WriteString("\n  intra-node ring: 0 (one rank per node, no intra-node hop)\n")
	}
	// The job's ring visits each node's ranks in that order, opened at the
	// slowest hop, node after node; the hop between nodes is the network.
	var ring []string
	for _, r := range l.ring {
		ring = append(ring, strconv.Itoa(r))
	}
	fmt.Fprintf(b, "  ring (ranks): %s -> %s\n", strings.Join(ring, " "), ring[0])
	// Trees: NCCL's double binary tree across nodes, a chain in ring order
	// inside each node hanging from its first rank.
	var chain []string
	for _, r := range l.order {
		chain = append(chain, strconv.Itoa(r))
	}
	fmt.Fprintf(b, "  intra-node chain (local ranks): %s\n", strings.Join(chain, " -> "))
	if l.nodes == 1 {
		b.WriteString("  trees: one node, both trees are the chain\n")
		return
	}
	trees := tree.Trees(l.nodes, 0)
	for t, nodes := range trees {
		fmt.Fprintf(b, "  tree %d across nodes (node: parent <- children; its head rank):\n", t)
		for n, nd := range nodes {
			parent := "-"
			if nd.Parent >= 0 {
				parent = strconv.Itoa(nd.Parent)
			}
			var kids []string
			for _, c := range nd.Children {
				kids = append(kids, strconv.Itoa(c))
			}
			fmt.Fprintf(b, "    node %d: %s <- [%s]; rank %d\n", n, parent, strings.Join(kids, " "), n*l.perNode+l.order[0])
		}
	}
}
