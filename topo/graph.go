// Package topo describes the hardware a job runs on: a graph of CPUs (one
// node per NUMA node), PCI switches and bridges, GPUs, NVSwitches, NICs and
// network ports, with the bandwidth of every link. It reads and writes NCCL's
// topology XML (NCCL_TOPO_FILE / NCCL_TOPO_DUMP_FILE), detects the local host
// from sysfs, RDMA devices and NVML, finds the path between any two devices
// and classifies it as NCCL does (LOC, NVL, NVB, C2C, PIX, PXB, PXN, PHB, SYS,
// NET), merges the per-host graphs of a job, and orders rings so that
// neighbours share fast links.
//
// Everything except detection is pure: it works on documents and graphs in
// memory, so it is tested against real published topology files.
package topo

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// NodeType is the kind of a graph node, in NCCL's order.
type NodeType int

const (
	GPU NodeType = iota // a GPU (its PCI function)
	PCI                 // a PCI switch or bridge
	NVS                 // an NVSwitch
	CPU                 // a CPU socket / NUMA node, root of a PCI tree
	NIC                 // a network adapter (its PCI function)
	NET                 // a network port of a NIC
	numNodeTypes
)

var nodeTypeNames = [...]string{"GPU", "PCI", "NVS", "CPU", "NIC", "NET"}

func (t NodeType) String() string {
	if t >= 0 && int(t) < len(nodeTypeNames) {
		return nodeTypeNames[t]
	}
	return fmt.Sprintf("NodeType(%d)", int(t))
}

// LinkType is the physical kind of a link.
type LinkType int

const (
	LinkLOC LinkType = iota // inside one device
	LinkNVL                 // NVLink
	LinkC2C                 // chip-to-chip (Grace Hopper)
	LinkPCI                 // PCI Express
	LinkSYS                 // between CPU sockets (QPI/UPI, Infinity Fabric, ...)
	LinkNET                 // a NIC to its network port
)

var linkTypeNames = [...]string{"LOC", "NVL", "C2C", "PCI", "SYS", "NET"}

func (t LinkType) String() string {
	if t >= 0 && int(t) < len(linkTypeNames) {
		return linkTypeNames[t]
	}
	return fmt.Sprintf("LinkType(%d)", int(t))
}

// Node is one device of the graph.
type Node struct {
	Type NodeType
	// ID is the PCI bus id ("0000:a4:00.0") of GPU, PCI, NVS and NIC nodes,
	// "numa<N>" for CPUs and the port's name ("mlx5_0") for NET nodes.
	ID    string
	Index int // position in Graph.Nodes[Type]
	Links []*Link
	// Parent is the next node towards the CPU in the PCI tree (nil for CPUs,
	// NET ports and NVSwitches known only as NVLink targets).
	Parent *Node

	CPU CPUInfo // CPU nodes
	Dev PCIInfo // GPU, PCI, NIC and NVS nodes with a <pci> element
	GPU GPUInfo // GPU nodes
	Net NetInfo // NET nodes
}

// CPUInfo describes a CPU node (one NUMA node).
type CPUInfo struct {
	NUMA     int
	Affinity CPUSet
	Arch     string // "x86_64", "arm64", "ppc64"
	Vendor   string // "GenuineIntel", "AuthenticAMD", ...
	Family   int
	Model    int
	MemoryKB uint64 // 0 when unknown (NCCL's files do not carry it)
	HostHash string
}

// PCIInfo describes a PCI function.
type PCIInfo struct {
	Class     uint32  // 0x030200 for a 3D controller, ...
	Vendor    uint32  // 0 when unknown
	Device    uint32  // 0 when unknown
	SpeedGTs  float64 // link speed per lane, GT/s; 0 when unknown
	Width     int     // lanes; 0 when unknown (virtual machines often say 0)
	LinkSpeed string  // as written in the file or sysfs
}

// GPUInfo describes a GPU.
type GPUInfo struct {
	Dev  int // CUDA device index; -1 when the file only lists the PCI function
	SM   int // compute capability ×10 (90 for H100); 0 when unknown
	Rank int // the rank that owns it in this file; -1 when unknown
	GDR  bool
}

// NetInfo describes a network port.
type NetInfo struct {
	Name      string
	Dev       int
	SpeedMbps int
	Port      int
	GUID      string
	MaxConn   int
	GDR       bool
	Latency   float64
}

// Link is a directed edge. Every physical link appears once in each direction.
type Link struct {
	Type   LinkType
	From   *Node
	To     *Node
	BW     float64 // GB/s in this direction
	Count  int     // NVLink lanes for NVL links, else 1
	Remote string  // NVLink target bus id as written in the file
}

// Graph is the topology of one host.
type Graph struct {
	Nodes [numNodeTypes][]*Node
	// Doc is the NCCL XML document the graph was built from; Dump writes it.
	Doc *Element
	// Warnings lists what the document said that gccl could not use (an
	// NVLink to an unknown device, ...). They are not errors: NCCL skips the
	// same things.
	Warnings []string

	// paths summarises the path between every pair of nodes, by ordinal:
	// paths[ordinal(a)*count+ordinal(b)]. Path rebuilds the node lists.
	paths        []pathSummary
	firstOrdinal [numNodeTypes]int // ordinal of the first node of each type
	count        int               // nodes added
	overflow     bool              // more than maxNodes
}

// Bandwidths per link, GB/s, as NCCL models them (src/graph/topo.h): what a
// kernel achieves per NVLink lane, per inter-socket link, per 100 Gb/s of
// network, not the signalling rate.
const (
	BWLocal       = 5000.0 // inside a device
	BWNVLinkSM60  = 18.0
	BWNVLinkSM70  = 20.0
	BWNVLinkSM80  = 20.0
	BWNVLinkSM86  = 12.0 // consumer Ampere / Ada bridges
	BWNVLinkSM90  = 20.6
	BWNVLinkSM100 = 40.0
	BWPCIGen3x16  = 12.0
	BWQPI         = 6.0  // Intel before Skylake
	BWSkylakeUPI  = 10.0 // Skylake / Cascade Lake
	BWSapphireUPI = 22.0
	BWEmeraldUPI  = 40.0
	BWAMD         = 16.0 // AMD Infinity Fabric between sockets
	BWPower9      = 32.0
	BWArm         = 6.0
	BWZhaoxin     = 6.0
)

// NVLinkBW returns the bandwidth of one NVLink lane for a GPU of compute
// capability sm (×10).
func NVLinkBW(sm int) float64 {
	switch {
	case sm >= 100:
		return BWNVLinkSM100
	case sm >= 90:
		return BWNVLinkSM90
	case sm == 86 || sm == 87 || sm == 89:
		return BWNVLinkSM86
	case sm >= 80:
		return BWNVLinkSM80
	case sm >= 70:
		return BWNVLinkSM70
	case sm > 0:
		return BWNVLinkSM60
	}
	// Unknown generation: assume the most common data-centre one.
	return BWNVLinkSM80
}

// PCIBW returns the bandwidth of a PCI link: NCCL's per-lane figures (12 GB/s
// for Gen3 x16, scaling with the transfer rate) times the width. A width of 0
// means the platform did not say (virtual machines); NCCL assumes x16.
func PCIBW(speedGTs float64, width int) float64 {
	if width <= 0 {
		width = 16
	}
	if speedGTs <= 0 {
		speedGTs = 8 // NCCL's fallback: Gen3
	}
	// 8 GT/s per lane moves 0.75 GB/s in NCCL's model (12 GB/s at x16).
	bw := float64(width) * speedGTs * 0.75 / 8
	if speedGTs < 8 {
		// Gen1 and Gen2 use 8b/10b encoding: NCCL gives them 1.5 and 3
		// Gb/s per lane, not 1.875 and 3.75.
		bw *= 0.8
	}
	return bw
}

// SMPBW returns the bandwidth between two CPU sockets of this kind.
func SMPBW(c CPUInfo) float64 {
	switch {
	case c.Arch == "ppc64":
		return BWPower9
	case c.Arch == "arm64" || c.Arch == "aarch64":
		return BWArm
	case c.Vendor == "AuthenticAMD" || c.Vendor == "HygonGenuine":
		return BWAMD
	case c.Vendor == "CentaurHauls" || c.Vendor == "  Shanghai  ":
		return BWZhaoxin
	case c.Vendor == "GenuineIntel":
		switch {
		case c.Model >= 0xcf:
			return BWEmeraldUPI
		case c.Model >= 0x8f:
			return BWSapphireUPI
		case c.Model >= 0x55:
			return BWSkylakeUPI
		}
		return BWQPI
	}
	return BWQPI
}

// ParseLinkSpeed reads a PCI link speed as sysfs and NCCL files write it:
// "16.0 GT/s PCIe", "16 GT/s", "2.5 GT/s PCIe". It returns GT/s per lane.
func ParseLinkSpeed(s string) (float64, error) {
	f := strings.Fields(s)
	if len(f) < 2 || f[1] != "GT/s" {
		return 0, fmt.Errorf("topo: bad PCI link speed %q", truncate(s))
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil || v <= 0 || v > 1024 || math.IsNaN(v) {
		return 0, fmt.Errorf("topo: bad PCI link speed %q", truncate(s))
	}
	return v, nil
}

// NormalizeBusID returns a PCI bus id in sysfs form: lower case with a domain
// ("0000:a4:00.0"). NCCL files sometimes omit the domain.
func NormalizeBusID(s string) (string, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	parts := strings.Split(s, ":")
	if len(parts) == 2 {
		parts = append([]string{"0000"}, parts...)
	}
	if len(parts) != 3 {
		return "", fmt.Errorf("topo: bad PCI bus id %q", truncate(s))
	}
	dev, fn, ok := strings.Cut(parts[2], ".")
	if !ok || !isHex(parts[0], 4, 8) || !isHex(parts[1], 2, 2) || !isHex(dev, 2, 2) || !isHex(fn, 1, 1) {
		return "", fmt.Errorf("topo: bad PCI bus id %q", truncate(s))
	}
	// NVML writes the domain with 8 digits ("00000000:17:00.0"), sysfs with
	// 4 (more only when the domain needs them, as VMD's 10000 does).
	dom := parts[0]
	for len(dom) > 4 && dom[0] == '0' {
		dom = dom[1:]
	}
	return fmt.Sprintf("%s:%s:%s.%s", dom, parts[1], dev, fn), nil
}

func isHex(s string, minLen, maxLen int) bool {
	if len(s) < minLen || len(s) > maxLen {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func parseHex(s string) (uint32, error) {
	s = strings.TrimPrefix(strings.ToLower(strings.TrimSpace(s)), "0x")
	v, err := strconv.ParseUint(s, 16, 32)
	return uint32(v), err
}

// Class codes (PCI base class and subclass, the top 16 bits of the 24).
const (
	classBridge   = 0x0604
	classNVSwitch = 0x0680
	classNetwork  = 0x02
	classDisplay  = 0x03
)

// maxNodes bounds a host's graph. Paths are computed between every pair of
// nodes, so a document naming millions of devices would exhaust memory;
// real hosts have well under a hundred (the AWS p5 file: 81).
const maxNodes = 512

// maxNUMANodes bounds the CPU nodes of a host. Every pair of them is
// linked, so paths over a full mesh of maxNodes sockets would take seconds
// to find; the largest real hosts have a few dozen NUMA nodes.
const maxNUMANodes = 128

// A graph stores a path summary for every pair of its nodes, so its cost
// grows with the square of the devices a document names while the document
// grows linearly: a 9 KB document of 500 network ports under one NIC would
// make Build allocate 8.7 MB. Build refuses a document whose path table
// would cost more than graphCostFloor plus graphCostPerDocByte bytes per
// byte of the document (as Dump would write it). Real hosts stay far below:
// the AWS p5 file (81 devices, 10 KB) needs 210 KB of paths, well within
// the floor alone, which admits any host of up to 181 devices.
const (
	graphCostFloor   = 1 << 20
	pathSummaryBytes = 32 // unsafe.Sizeof(pathSummary{}) on 64-bit hosts (a test checks)
)

// graphCostPerDocByte is a variable only so that the tests of the path
// search at maxNodes can build terse documents of that many devices.
var graphCostPerDocByte uint64 = 64

// checkGraphCost refuses a document whose graph of nodes devices would
// cost more than a small multiple of the document's own size.
func checkGraphCost(doc *Element, nodes int) error {
	cost := uint64(nodes) * uint64(nodes) * pathSummaryBytes
	if cost <= graphCostFloor {
		return nil // no need to measure the document
	}
	size := docBytes(doc)
	if limit := graphCostFloor + graphCostPerDocByte*size; cost > limit {
		return fmt.Errorf("topo: a %d-byte document names %d devices, whose paths would take %d bytes: "+
			"more than %d bytes plus %d per byte of document (%d); real hosts name far fewer devices",
			size, nodes, cost, graphCostFloor, graphCostPerDocByte, limit)
	}
	return nil
}

// docBytes is the size of e written as XML without indentation: its tags,
// attributes and children.
func docBytes(e *Element) uint64 {
	n := uint64(2*len(e.Name) + 5) // <name> and </name>, or <name/>
	for _, a := range e.Attrs {
		n += uint64(len(a.Name) + len(a.Value) + 4) // ` name="value"`
	}
	for _, c := range e.Children {
		n += docBytes(c)
	}
	return n
}

// errTooManyNodes is reported once a document exceeds maxNodes.
var errTooManyNodes = fmt.Errorf("topo: more than %d devices in one host", maxNodes)

func (g *Graph) add(t NodeType, id string) *Node {
	if g.count >= maxNodes {
		g.overflow = true
	}
	g.count++
	n := &Node{Type: t, ID: id, Index: len(g.Nodes[t])}
	n.GPU.Dev, n.GPU.Rank = -1, -1
	g.Nodes[t] = append(g.Nodes[t], n)
	return n
}

// Find returns the node of type t with id, or nil.
func (g *Graph) Find(t NodeType, id string) *Node {
	for _, n := range g.Nodes[t] {
		if n.ID == id {
			return n
		}
	}
	return nil
}

// FindBusID returns the GPU, NIC, PCI or NVS node with PCI bus id id, or nil.
func (g *Graph) FindBusID(id string) *Node {
	if norm, err := NormalizeBusID(id); err == nil {
		id = norm
	}
	for _, t := range []NodeType{GPU, NIC, PCI, NVS} {
		if n := g.Find(t, id); n != nil {
			return n
		}
	}
	return nil
}

// connect adds a link in each direction.
func connect(a, b *Node, t LinkType, bw float64, count int) {
	a.Links = append(a.Links, &Link{Type: t, From: a, To: b, BW: bw, Count: count})
	b.Links = append(b.Links, &Link{Type: t, From: b, To: a, BW: bw, Count: count})
}

// addDirected adds a link from a to b, or widens the one already there
// (several <nvlink> elements may name the same target).
func addDirected(a, b *Node, t LinkType, bw float64, count int, remote string) {
	for _, l := range a.Links {
		if l.To == b && l.Type == t {
			l.BW += bw
			l.Count += count
			return
		}
	}
	a.Links = append(a.Links, &Link{Type: t, From: a, To: b, BW: bw, Count: count, Remote: remote})
}

// Build turns an NCCL topology document into a graph. It checks what it
// interprets (bus ids, class codes, numbers) and reports the first problem as
// an error naming the element; attributes it does not interpret are kept in
// Doc untouched.
func Build(doc *Element) (*Graph, error) {
	if doc == nil || doc.Name != "system" {
		return nil, fmt.Errorf("topo: document root must be <system>")
	}
	g := &Graph{Doc: doc}
	b := builder{g: g, seen: map[string]bool{}}
	for _, c := range doc.Children {
		if c.Name != "cpu" {
			continue // NCCL ignores other top-level elements too
		}
		if err := b.cpu(c); err != nil {
			return nil, err
		}
	}
	if err := b.resolveNVLinks(); err != nil {
		return nil, err
	}
	if g.overflow {
		return nil, errTooManyNodes
	}
	if err := checkGraphCost(doc, g.count); err != nil {
		return nil, err
	}
	// Every pair of sockets talks over the inter-socket fabric.
	cpus := g.Nodes[CPU]
	for i := range cpus {
		for j := i + 1; j < len(cpus); j++ {
			bw := min(SMPBW(cpus[i].CPU), SMPBW(cpus[j].CPU))
			connect(cpus[i], cpus[j], LinkSYS, bw, 1)
		}
	}
	g.computePaths()
	return g, nil
}

type builder struct {
	g       *Graph
	seen    map[string]bool // bus ids and names already used
	nvlinks []pendingNVLink
}

type pendingNVLink struct {
	gpu    *Node
	target string
	tclass uint32
	count  int
}

func (b *builder) cpu(e *Element) error {
	numaStr, ok := e.Get("numaid")
	if !ok {
		return fmt.Errorf("topo: <cpu> without numaid")
	}
	numa, err := strconv.Atoi(numaStr)
	if err != nil || numa < 0 || numa > 1<<16 {
		return fmt.Errorf("topo: <cpu> has bad numaid %q", truncate(numaStr))
	}
	id := "numa" + strconv.Itoa(numa)
	if len(b.g.Nodes[CPU]) >= maxNUMANodes {
		return fmt.Errorf("topo: more than %d <cpu> elements (NUMA nodes) in one host", maxNUMANodes)
	}
	if b.g.Find(CPU, id) != nil {
		return fmt.Errorf("topo: two <cpu> elements with numaid %d", numa)
	}
	n := b.g.add(CPU, id)
	n.CPU.NUMA = numa
	if aff, ok := e.Get("affinity"); ok {
		set, err := ParseCPUMask(aff)
		if err != nil {
			return fmt.Errorf("topo: <cpu numaid=%d>: %w", numa, err)
		}
		n.CPU.Affinity = set
	}
	n.CPU.Arch = e.Attr("arch")
	n.CPU.Vendor = e.Attr("vendor")
	n.CPU.HostHash = e.Attr("host_hash")
	for _, a := range []struct {
		name string
		dst  *int
	}{{"familyid", &n.CPU.Family}, {"modelid", &n.CPU.Model}} {
		if v, ok := e.Get(a.name); ok {
			x, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("topo: <cpu numaid=%d> has bad %s %q", numa, a.name, truncate(v))
			}
			*a.dst = x
		}
	}
	if v, ok := e.Get(memoryAttr); ok {
		kb, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return fmt.Errorf("topo: <cpu numaid=%d> has bad %s %q", numa, memoryAttr, truncate(v))
		}
		n.CPU.MemoryKB = kb
	}
	for _, c := range e.Children {
		switch c.Name {
		case "pci":
			if err := b.pci(c, n); err != nil {
				return err
			}
		case "nic":
			// A NIC with no PCI function of its own (virtual or on-chip).
			if err := b.nic(c, n, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// memoryAttr carries a NUMA node's memory in dumps gccl writes. NCCL keeps
// attributes it does not know, so such a file still loads there.
const memoryAttr = "gccl_memory_kb"

func (b *builder) pci(e *Element, parent *Node) error {
	raw, ok := e.Get("busid")
	if !ok {
		return fmt.Errorf("topo: <pci> without busid under %s", parent.ID)
	}
	busID, err := NormalizeBusID(raw)
	if err != nil {
		return err
	}
	if b.seen[busID] {
		return fmt.Errorf("topo: PCI bus id %s appears twice", busID)
	}
	b.seen[busID] = true
	var info PCIInfo
	if v, ok := e.Get("class"); ok && v != "" {
		if info.Class, err = parseHex(v); err != nil {
			return fmt.Errorf("topo: <pci busid=%s> has bad class %q", busID, truncate(v))
		}
	}
	for _, a := range []struct {
		name string
		dst  *uint32
	}{{"vendor", &info.Vendor}, {"device", &info.Device}} {
		if v, ok := e.Get(a.name); ok && v != "" {
			if *a.dst, err = parseHex(v); err != nil {
				return fmt.Errorf("topo: <pci busid=%s> has bad %s %q", busID, a.name, truncate(v))
			}
		}
	}
	if v, ok := e.Get("link_speed"); ok && v != "" {
		info.LinkSpeed = v
		// An unreadable speed falls back to NCCL's default (Gen3) with a
		// warning, as sysfs sometimes says "Unknown".
		if info.SpeedGTs, err = ParseLinkSpeed(v); err != nil {
			b.g.Warnings = append(b.g.Warnings, fmt.Sprintf("%s: %v; assuming 8 GT/s", busID, err))
		}
	}
	if v, ok := e.Get("link_width"); ok && v != "" {
		w, err := strconv.Atoi(v)
		if err != nil || w < 0 || w > 64 {
			return fmt.Errorf("topo: <pci busid=%s> has bad link_width %q", busID, truncate(v))
		}
		info.Width = w
	}
	bw := PCIBW(info.SpeedGTs, info.Width)

	var node *Node
	gpuEl, nicEl := e.Child("gpu"), e.Child("nic")
	class16 := info.Class >> 8
	switch {
	case gpuEl != nil || (nicEl == nil && info.Class>>16 == classDisplay):
		node = b.g.add(GPU, busID)
		node.Dev = info
		node.Parent = parent // <c2c> links the GPU to its CPU
		if gpuEl != nil {
			if err := b.gpu(gpuEl, node); err != nil {
				return err
			}
		}
	case nicEl != nil || info.Class>>16 == classNetwork:
		node = b.g.add(NIC, busID)
		node.Dev = info
		if nicEl != nil {
			if err := b.nic(nicEl, parent, node); err != nil {
				return err
			}
		}
	case class16 == classNVSwitch:
		node = b.g.add(NVS, busID)
		node.Dev = info
	default:
		// Bridges, switches and anything else that may hold devices below it.
		node = b.g.add(PCI, busID)
		node.Dev = info
	}
	node.Parent = parent
	connect(node, parent, LinkPCI, bw, 1)
	for _, c := range e.Children {
		if c.Name == "pci" {
			if err := b.pci(c, node); err != nil {
				return err
			}
		}
	}
	return nil
}

func (b *builder) gpu(e *Element, n *Node) error {
	for _, a := range []struct {
		name string
		dst  *int
	}{{"dev", &n.GPU.Dev}, {"sm", &n.GPU.SM}, {"rank", &n.GPU.Rank}} {
		if v, ok := e.Get(a.name); ok {
			x, err := strconv.Atoi(v)
			if err != nil || x < -1 || x > 1<<24 {
				return fmt.Errorf("topo: <gpu> of %s has bad %s %q", n.ID, a.name, truncate(v))
			}
			*a.dst = x
		}
	}
	n.GPU.GDR = e.Attr("gdr") == "1"
	for _, c := range e.Children {
		switch c.Name {
		case "nvlink":
			target, err := NormalizeBusID(c.Attr("target"))
			if err != nil {
				return fmt.Errorf("topo: <nvlink> of GPU %s: %w", n.ID, err)
			}
			count := 1
			if v, ok := c.Get("count"); ok {
				if count, err = strconv.Atoi(v); err != nil || count < 0 || count > 1024 {
					return fmt.Errorf("topo: <nvlink> of GPU %s has bad count %q", n.ID, truncate(v))
				}
			}
			var tclass uint32
			if v, ok := c.Get("tclass"); ok {
				if tclass, err = parseHex(v); err != nil {
					return fmt.Errorf("topo: <nvlink> of GPU %s has bad tclass %q", n.ID, truncate(v))
				}
			}
			b.nvlinks = append(b.nvlinks, pendingNVLink{gpu: n, target: target, tclass: tclass, count: count})
		case "c2c":
			bwStr, countStr := c.Attr("bw"), c.Attr("count")
			bw, err1 := strconv.ParseFloat(bwStr, 64)
			count, err2 := strconv.Atoi(countStr)
			if err1 != nil || err2 != nil || bw < 0 || count < 0 || count > 1024 || math.IsInf(bw*float64(count), 0) || math.IsNaN(bw) {
				return fmt.Errorf("topo: <c2c> of GPU %s has bad bw %q or count %q", n.ID, truncate(bwStr), truncate(countStr))
			}
			cpu := localCPU(n)
			if cpu == nil {
				return fmt.Errorf("topo: <c2c> of GPU %s outside any <cpu>", n.ID)
			}
			// bw is per link, in GB/s, as NCCL writes it.
			connect(n, cpu, LinkC2C, bw*float64(count), count)
		}
	}
	return nil
}

func (b *builder) nic(e *Element, cpu *Node, node *Node) error {
	if node == nil {
		// A <nic> straight under <cpu>: give it a node named after its
		// first port.
		name := "nic" + strconv.Itoa(len(b.g.Nodes[NIC]))
		if first := e.Child("net"); first != nil && first.Attr("name") != "" {
			name = first.Attr("name")
		}
		node = b.g.add(NIC, name)
		node.Parent = cpu
		connect(node, cpu, LinkPCI, BWLocal, 1)
	}
	for _, c := range e.Children {
		if c.Name != "net" {
			continue
		}
		name := c.Attr("name")
		if name == "" {
			return fmt.Errorf("topo: <net> without name under NIC %s", node.ID)
		}
		if b.seen["net:"+name] {
			return fmt.Errorf("topo: network port %q appears twice", name)
		}
		b.seen["net:"+name] = true
		net := b.g.add(NET, name)
		net.Parent = node
		net.Net.Name = name
		net.Net.GUID = c.Attr("guid")
		net.Net.GDR = c.Attr("gdr") == "1"
		for _, a := range []struct {
			name string
			dst  *int
		}{{"dev", &net.Net.Dev}, {"speed", &net.Net.SpeedMbps}, {"port", &net.Net.Port}, {"maxconn", &net.Net.MaxConn}} {
			if v, ok := c.Get(a.name); ok {
				x, err := strconv.Atoi(v)
				if err == nil && x == -1 && a.name == "speed" {
					x = 0 // some NICs say -1: unknown, as NCCL reads it
				}
				if err != nil || x < 0 {
					return fmt.Errorf("topo: <net name=%q> has bad %s %q", name, a.name, truncate(v))
				}
				*a.dst = x
			}
		}
		if v, ok := c.Get("latency"); ok {
			lat, err := strconv.ParseFloat(v, 64)
			if err != nil || !(lat >= 0) || math.IsInf(lat, 0) {
				return fmt.Errorf("topo: <net name=%q> has bad latency %q", name, truncate(v))
			}
			net.Net.Latency = lat
		}
		speed := net.Net.SpeedMbps
		if speed == 0 {
			speed = 10000 // NCCL's default when the port does not say
		}
		connect(node, net, LinkNET, float64(speed)/8000, 1)
	}
	return nil
}

// resolveNVLinks resolves <nvlink> targets once every PCI function is known:
// a GPU (direct NVLink) or an NVSwitch (by class code or a known NVS
// function). Other targets (POWER9's NVLink to the CPU) are reported in
// Warnings and left out.
func (b *builder) resolveNVLinks() error {
	g := b.g
	for _, p := range b.nvlinks {
		bw := NVLinkBW(p.gpu.GPU.SM) * float64(p.count)
		target := g.FindBusID(p.target)
		switch {
		case target != nil && target.Type == GPU:
			addDirected(p.gpu, target, LinkNVL, bw, p.count, p.target)
		case target != nil && target.Type == NVS, p.tclass>>8 == classNVSwitch:
			if target == nil {
				target = g.add(NVS, p.target)
			}
			addDirected(p.gpu, target, LinkNVL, bw, p.count, p.target)
			addDirected(target, p.gpu, LinkNVL, bw, p.count, p.gpu.ID)
		default:
			g.Warnings = append(g.Warnings, fmt.Sprintf("GPU %s: NVLink to unknown device %s (class 0x%06x) ignored", p.gpu.ID, p.target, p.tclass))
		}
	}
	return nil
}

// localCPU returns the CPU node at the root of n's PCI tree.
func localCPU(n *Node) *Node {
	for ; n != nil; n = n.Parent {
		if n.Type == CPU {
			return n
		}
	}
	return nil
}

// LocalCPU returns the CPU (NUMA node) that device n hangs from, or nil for
// devices outside the PCI tree (NVSwitches known only as NVLink targets).
func (g *Graph) LocalCPU(n *Node) *Node {
	if n.Type == NET {
		return localCPU(n.Parent)
	}
	return localCPU(n)
}

// Affinity returns the CPUs near device n: those of its NUMA node.
func (g *Graph) Affinity(n *Node) CPUSet {
	if c := g.LocalCPU(n); c != nil {
		return c.CPU.Affinity
	}
	return CPUSet{}
}

// NVLinks returns the number of NVLink lanes of GPU n, over all its links.
func (g *Graph) NVLinks(n *Node) int {
	total := 0
	for _, l := range n.Links {
		if l.Type == LinkNVL {
			total += l.Count
		}
	}
	return total
}

// sortedNodes returns nodes of type t in bus-id/name order.
func (g *Graph) sortedNodes(t NodeType) []*Node {
	out := append([]*Node(nil), g.Nodes[t]...)
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
