package topo

import (
	"fmt"
	"slices"
	"sort"
)

// PathType classifies the path between two devices, from closest to
// farthest, with NCCL's names and meanings.
type PathType int

const (
	PathLOC PathType = iota // the same device
	PathNVL                 // NVLink, directly or through NVSwitches
	PathNVB                 // NVLink through one intermediate GPU, between two GPUs
	PathC2C                 // chip-to-chip link to the CPU (Grace Hopper)
	PathPIX                 // at most one PCI bridge
	PathPXB                 // several PCI bridges, without the CPU's host bridge
	PathPXN                 // to a NIC through a peer GPU reached by NVLink (rail-optimised)
	PathPHB                 // through a CPU's PCI host bridge
	PathSYS                 // across CPU sockets
	PathNET                 // across the network (another host)
	PathDIS                 // disconnected
)

var pathTypeNames = [...]string{"LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "PXN", "PHB", "SYS", "NET", "DIS"}

func (t PathType) String() string {
	if t >= 0 && int(t) < len(pathTypeNames) {
		return pathTypeNames[t]
	}
	return fmt.Sprintf("PathType(%d)", int(t))
}

// ParsePathType reads a path type name ("PIX").
func ParsePathType(s string) (PathType, error) {
	for i, n := range pathTypeNames {
		if n == s {
			return PathType(i), nil
		}
	}
	return PathDIS, fmt.Errorf("topo: unknown path type %q", truncate(s))
}

// Path is the route between two devices of one host.
type Path struct {
	Type PathType
	BW   float64 // GB/s: the narrowest link on the way
	// Nodes lists the devices on the way, both ends included. All NVSwitches
	// of a host act as one fabric; a path through it names the first.
	Nodes []*Node
	// Via is the peer GPU of a PXN path, else nil.
	Via *Node
}

// Hops returns the number of links on the path.
func (p Path) Hops() int { return max(len(p.Nodes)-1, 0) }

// Path returns the path from a to b. Devices of one host are always
// connected through their CPUs; a pair with no route is PathDIS. Nodes is
// built afresh on each call from the stored summaries: the caller owns it.
func (g *Graph) Path(a, b *Node) Path {
	s := g.summary(a, b)
	if s.typ == PathDIS {
		return Path{Type: PathDIS}
	}
	return Path{Type: s.typ, BW: s.bw, Nodes: g.appendPathNodes(nil, g.fabric(a), g.fabric(b)), Via: s.via}
}

// pathSummary is what computePaths keeps of the path between two nodes.
// Keeping every path's node list instead cost O(n² × depth) memory: 33 KB
// of XML nesting PCI bridges 60 deep made Build allocate 453 MiB.
type pathSummary struct {
	typ PathType
	bw  float64
	// prev is the node before dst on the path the search found from src
	// (nil when dst is src), so a source's summaries form its search tree.
	// A PXN path keeps the direct path's prev: other paths from src (to the
	// NIC's ports) walk through it.
	prev *Node
	via  *Node // the peer GPU of a PXN path, else nil
}

// fabric returns the node that stands for n in the path search: NCCL models
// all NVSwitches of a host as one vertex, here the first.
func (g *Graph) fabric(n *Node) *Node {
	if n.Type == NVS && len(g.Nodes[NVS]) > 0 {
		return g.Nodes[NVS][0]
	}
	return n
}

// ordinal returns n's position among all nodes of g, by type and then index:
// its row and column in g.paths.
func (g *Graph) ordinal(n *Node) int { return g.firstOrdinal[n.Type] + n.Index }

// pathRow returns the summaries of the paths from src.
func (g *Graph) pathRow(src *Node) []pathSummary {
	i := g.ordinal(src) * g.count
	return g.paths[i : i+g.count]
}

// summary returns the summary of the path from a to b; PathDIS when either
// is not a node of g. Callers that need only the class and bandwidth use it:
// Path also builds the node list.
func (g *Graph) summary(a, b *Node) pathSummary {
	if g.paths == nil || g.nodeIndex(a) < 0 || g.nodeIndex(b) < 0 {
		return pathSummary{typ: PathDIS}
	}
	return g.pathRow(g.fabric(a))[g.ordinal(g.fabric(b))]
}

// appendPathNodes appends the nodes of the path from src to dst, src first,
// by walking the predecessors back from dst. src and dst are fabric
// representatives, and dst is reachable from src.
func (g *Graph) appendPathNodes(nodes []*Node, src, dst *Node) []*Node {
	row := g.pathRow(src)
	if via := row[g.ordinal(dst)].via; via != nil {
		// PXN: over NVLink to the peer GPU, then the peer's own path to the
		// NIC, which starts at the peer again.
		nodes = g.appendPathNodes(nodes, src, via)
		return g.appendPathNodes(nodes[:len(nodes)-1], via, dst)
	}
	start := len(nodes)
	for n := dst; n != nil; n = row[g.ordinal(n)].prev {
		nodes = append(nodes, n)
		if n == src {
			break
		}
	}
	slices.Reverse(nodes[start:])
	return nodes
}

// edge is a link of the search graph: NVSwitches merged into one fabric and
// parallel links summed.
type edge struct {
	to    *Node
	toOrd int // ordinal of to: where the search keeps its label
	typ   LinkType
	bw    float64
	from  *Node
}

// searchGraph builds the adjacency the path search walks. NCCL models all
// NVSwitches of a node as one NVS vertex, so a GPU's bandwidth into the fabric
// is the sum over its NVLinks (18 × 20.6 GB/s on an H100), not one switch's
// share. The edges from a node are at its ordinal.
func (g *Graph) searchGraph() [][]edge {
	type key struct {
		from, to *Node
		typ      LinkType
	}
	adj := make([][]edge, g.count)
	at := map[key]int{} // index of the edge in adj[ordinal(from)]
	for t := range g.Nodes {
		for _, n := range g.Nodes[t] {
			from := g.fabric(n)
			out := &adj[g.ordinal(from)]
			for _, l := range n.Links {
				to := g.fabric(l.To)
				if to == from {
					continue
				}
				k := key{from, to, l.Type}
				if i, ok := at[k]; ok {
					(*out)[i].bw += l.BW
					continue
				}
				at[k] = len(*out)
				*out = append(*out, edge{to: to, toOrd: g.ordinal(to), typ: l.Type, bw: l.BW, from: from})
			}
		}
	}
	return adj
}

// hopType is the class a single link gives to a path: the rules of NCCL's
// paths.cc. A NIC's link to its port counts as local.
func hopType(e *edge, src *Node) PathType {
	switch e.typ {
	case LinkLOC, LinkNET:
		return PathLOC
	case LinkNVL:
		if e.from.Type == GPU && e.from != src {
			return PathNVB
		}
		return PathNVL
	case LinkC2C:
		return PathC2C
	case LinkSYS:
		return PathSYS
	case LinkPCI:
		if e.from.Type == CPU || e.to.Type == CPU {
			return PathPHB
		}
		if e.from.Type == PCI && e.to.Type == PCI {
			return PathPXB
		}
		return PathPIX
	}
	return PathSYS
}

type label struct {
	hops int
	bw   float64
	typ  PathType
	prev *Node
	via  LinkType // type of the link that reached the node
}

// notReached is the hops of a label whose node the search has not reached.
const notReached = -1

func better(a, b label) bool {
	if a.hops != b.hops {
		return a.hops < b.hops
	}
	if a.bw != b.bw {
		return a.bw > b.bw
	}
	return a.typ < b.typ
}

// computePaths finds, from every node, the path to every other node: fewest
// hops first, then the widest bottleneck, then the closest class, as NCCL's
// breadth-first search does. A path may pass through a GPU only as NCCL's
// NVB, GPU -NVLink-> GPU -NVLink-> GPU with that one GPU in between, through
// a NIC only to its own port, and never through a network port; an NVSwitch
// only from NVLink to NVLink.
func (g *Graph) computePaths() {
	var all []*Node
	for t := range g.Nodes {
		g.firstOrdinal[t] = len(all)
		all = append(all, g.Nodes[t]...)
	}
	adj := g.searchGraph()
	// One summary per pair, rows by source. Every NVSwitch answers for the
	// fabric, so only the representative's row and column are filled; Path
	// maps the others to it.
	g.paths = make([]pathSummary, g.count*g.count)
	for i := range g.paths {
		g.paths[i].typ = PathDIS
	}
	labels := make([]label, len(all)) // by ordinal, reused for every source
	var frontier, next []*Node
	for _, src := range all {
		if g.fabric(src) != src {
			continue // reached through the fabric's representative
		}
		for i := range labels {
			labels[i].hops = notReached
		}
		labels[g.ordinal(src)] = label{bw: BWLocal, typ: PathLOC}
		frontier = append(frontier[:0], src)
		for len(frontier) > 0 {
			next = next[:0]
			for _, u := range frontier {
				lu := labels[g.ordinal(u)]
				if u != src && !canPassThrough(u, lu, src) {
					continue
				}
				// Past the source, a GPU forwards only over NVLink to
				// another GPU, an NVSwitch only over NVLink, a NIC only to
				// its ports.
				gpuOnly := u != src && u.Type == GPU
				nvlOnly := gpuOnly || u != src && u.Type == NVS
				portsOnly := u != src && u.Type == NIC
				edges := adj[g.ordinal(u)]
				for i := range edges {
					e := &edges[i]
					old := &labels[e.toOrd]
					seen := old.hops != notReached
					if seen && old.hops <= lu.hops {
						// Already reached in fewer hops: checked first, as
						// it is most edges between fully meshed sockets.
						continue
					}
					if nvlOnly && e.typ != LinkNVL || gpuOnly && e.to.Type != GPU || portsOnly && e.to.Type != NET {
						continue
					}
					cand := label{hops: lu.hops + 1, bw: min(lu.bw, e.bw), typ: max(lu.typ, hopType(e, src)), prev: u, via: e.typ}
					if !seen {
						next = append(next, e.to)
					}
					if !seen || better(cand, *old) {
						*old = cand
					}
				}
			}
			frontier, next = next, frontier
		}
		row := g.pathRow(src)
		for i, l := range labels {
			if l.hops != notReached {
				row[i] = pathSummary{typ: l.typ, bw: l.bw, prev: l.prev}
			}
		}
	}
	g.applyPXN()
}

// canPassThrough says whether a path from src, reaching node u with label l,
// may continue through u.
func canPassThrough(u *Node, l label, src *Node) bool {
	switch u.Type {
	case NET:
		return false
	case GPU:
		// NCCL's ncclTopoSetPaths routes through a GPU only as one hop
		// between GPUs: the path must have come straight from a GPU over
		// NVLink, so no chain of GPUs and no GPU between a GPU and the
		// NVSwitch fabric.
		return src.Type == GPU && l.hops == 1 && l.via == LinkNVL
	case NVS:
		// An NVSwitch that is also a PCI function (HGX A100) is a PCI
		// endpoint: the fabric is no shortcut between PCI trees.
		return l.via == LinkNVL
	}
	return true
}

// applyPXN reroutes a GPU's path to a NIC through an NVLink peer when its own
// is through the CPU (PHB or worse) and the peer sits under the same PCI
// switch as the NIC (PXB or better): NCCL's PXN, on by default since 2.12.
func (g *Graph) applyPXN() {
	// The GPUs that can relay for each NIC or port (PXB or better), found
	// before any path is rerouted: looping over every GPU for every pair
	// would cost GPUs² × NICs.
	relays := map[*Node][]*Node{}
	for _, t := range []NodeType{NIC, NET} {
		for _, nic := range g.Nodes[t] {
			for _, peer := range g.Nodes[GPU] {
				if g.summary(peer, nic).typ <= PathPXB {
					relays[nic] = append(relays[nic], peer)
				}
			}
		}
	}
	for _, gpu := range g.Nodes[GPU] {
		row := g.pathRow(gpu)
		for _, t := range []NodeType{NIC, NET} {
			for _, nic := range g.Nodes[t] {
				direct := &row[g.ordinal(nic)]
				if direct.typ <= PathPXB {
					continue
				}
				for _, peer := range relays[nic] {
					if peer == gpu {
						continue
					}
					toPeer, peerToNIC := g.summary(gpu, peer), g.summary(peer, nic)
					if toPeer.typ != PathNVL || peerToNIC.typ > PathPXB {
						continue
					}
					bw := min(toPeer.bw, peerToNIC.bw)
					if direct.typ != PathPXN || bw > direct.bw {
						direct.typ, direct.bw, direct.via = PathPXN, bw, peer
					}
				}
			}
		}
	}
}

// NICsAt returns the NICs whose path from device n has class t, by bus id.
func (g *Graph) NICsAt(n *Node, t PathType) []*Node {
	var out []*Node
	for _, nic := range g.sortedNodes(NIC) {
		if g.summary(n, nic).typ == t {
			out = append(out, nic)
		}
	}
	return out
}

// NearestNICs returns the NICs closest to device n: those of the best path
// class, and among them the widest paths to a network port, in bus-id
// order. It is empty when the host has no NIC.
func (g *Graph) NearestNICs(n *Node) []*Node {
	nics := g.sortedNodes(NIC)
	if len(nics) == 0 {
		return nil
	}
	// A path is as wide as the NIC's fastest port allows, as NCCL compares
	// paths to the network ports; a NIC without ports (a PCI-only file) is
	// as wide as its PCI path.
	bw := func(nic *Node) float64 {
		b, port := g.summary(n, nic).bw, 0.0
		for _, l := range nic.Links {
			if l.Type == LinkNET {
				port = max(port, l.BW)
			}
		}
		if port > 0 {
			b = min(b, port)
		}
		return b
	}
	sort.SliceStable(nics, func(i, j int) bool {
		a, b := g.summary(n, nics[i]), g.summary(n, nics[j])
		if a.typ != b.typ {
			return a.typ < b.typ
		}
		return bw(nics[i]) > bw(nics[j])
	})
	best, bestBW := g.summary(n, nics[0]), bw(nics[0])
	var out []*Node
	for _, nic := range nics {
		if g.summary(n, nic).typ == best.typ && bw(nic) == bestBW {
			out = append(out, nic)
		}
	}
	return out
}
