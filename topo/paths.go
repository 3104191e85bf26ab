package topo

import (
	"fmt"
	"sort"
)

// PathType classifies the path between two devices, from closest to
// farthest, with NCCL's names and meanings.
type PathType int

const (
	PathLOC PathType = iota // the same device
	PathNVL                 // NVLink, directly or through NVSwitches
	PathNVB                 // NVLink through an intermediate GPU
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
// connected through their CPUs; a pair with no route is PathDIS.
func (g *Graph) Path(a, b *Node) Path {
	if p, ok := g.paths[[2]*Node{a, b}]; ok {
		return p
	}
	return Path{Type: PathDIS}
}

// edge is a link of the search graph: NVSwitches merged into one fabric and
// parallel links summed.
type edge struct {
	to   *Node
	typ  LinkType
	bw   float64
	from *Node
}

// searchGraph builds the adjacency the path search walks. NCCL models all
// NVSwitches of a node as one NVS vertex, so a GPU's bandwidth into the fabric
// is the sum over its NVLinks (18 × 20.6 GB/s on an H100), not one switch's
// share.
func (g *Graph) searchGraph() map[*Node][]edge {
	fabric := func(n *Node) *Node {
		if n.Type == NVS && len(g.Nodes[NVS]) > 0 {
			return g.Nodes[NVS][0]
		}
		return n
	}
	type key struct {
		from, to *Node
		typ      LinkType
	}
	adj := map[*Node][]edge{}
	at := map[key]int{} // index of the edge in adj[from]
	for t := range g.Nodes {
		for _, n := range g.Nodes[t] {
			from := fabric(n)
			for _, l := range n.Links {
				to := fabric(l.To)
				if to == from {
					continue
				}
				k := key{from, to, l.Type}
				if i, ok := at[k]; ok {
					adj[from][i].bw += l.BW
					continue
				}
				at[k] = len(adj[from])
				adj[from] = append(adj[from], edge{to: to, typ: l.Type, bw: l.BW, from: from})
			}
		}
	}
	return adj
}

// hopType is the class a single link gives to a path: the rules of NCCL's
// paths.cc. A NIC's link to its port counts as local.
func hopType(e edge, src *Node) PathType {
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
// breadth-first search does. A path may pass through a GPU only from NVLink
// to NVLink (NVB), through a NIC only to its own port, and never through a
// network port; an NVSwitch, like a GPU, only from NVLink to NVLink.
func (g *Graph) computePaths() {
	adj := g.searchGraph()
	g.paths = map[[2]*Node]Path{}
	var all []*Node
	for t := range g.Nodes {
		all = append(all, g.Nodes[t]...)
	}
	for _, src := range all {
		if src.Type == NVS && src != g.Nodes[NVS][0] {
			continue // reached through the fabric's representative
		}
		labels := map[*Node]label{src: {bw: BWLocal, typ: PathLOC}}
		frontier := []*Node{src}
		for len(frontier) > 0 {
			var next []*Node
			for _, u := range frontier {
				lu := labels[u]
				if u != src && !canPassThrough(u, lu) {
					continue
				}
				for _, e := range adj[u] {
					if u != src && (u.Type == GPU || u.Type == NVS) && e.typ != LinkNVL {
						continue
					}
					if u != src && u.Type == NIC && e.to.Type != NET {
						continue
					}
					cand := label{hops: lu.hops + 1, bw: min(lu.bw, e.bw), typ: max(lu.typ, hopType(e, src)), prev: u, via: e.typ}
					old, seen := labels[e.to]
					if !seen {
						next = append(next, e.to)
					}
					if !seen || (old.hops == cand.hops && better(cand, old)) {
						labels[e.to] = cand
					}
				}
			}
			frontier = next
		}
		for dst, l := range labels {
			var nodes []*Node
			for n := dst; n != nil; n = labels[n].prev {
				nodes = append(nodes, n)
				if n == src {
					break
				}
			}
			for i, j := 0, len(nodes)-1; i < j; i, j = i+1, j-1 {
				nodes[i], nodes[j] = nodes[j], nodes[i]
			}
			p := Path{Type: l.typ, BW: l.bw, Nodes: nodes}
			g.paths[[2]*Node{src, dst}] = p
		}
	}
	// Every NVSwitch answers for the fabric.
	if len(g.Nodes[NVS]) > 1 {
		rep := g.Nodes[NVS][0]
		for _, n := range g.Nodes[NVS][1:] {
			for _, o := range all {
				if p, ok := g.paths[[2]*Node{rep, o}]; ok {
					g.paths[[2]*Node{n, o}] = p
				}
				if p, ok := g.paths[[2]*Node{o, rep}]; ok {
					g.paths[[2]*Node{o, n}] = p
				}
			}
		}
	}
	g.applyPXN()
}

// canPassThrough says whether a path may continue through node u.
func canPassThrough(u *Node, l label) bool {
	switch u.Type {
	case NET:
		return false
	case GPU, NVS:
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
				if g.Path(peer, nic).Type <= PathPXB {
					relays[nic] = append(relays[nic], peer)
				}
			}
		}
	}
	for _, gpu := range g.Nodes[GPU] {
		for _, t := range []NodeType{NIC, NET} {
			for _, nic := range g.Nodes[t] {
				direct := g.Path(gpu, nic)
				if direct.Type <= PathPXB {
					continue
				}
				best := direct
				for _, peer := range relays[nic] {
					if peer == gpu {
						continue
					}
					toPeer, peerToNIC := g.Path(gpu, peer), g.Path(peer, nic)
					if toPeer.Type != PathNVL || peerToNIC.Type > PathPXB {
						continue
					}
					bw := min(toPeer.BW, peerToNIC.BW)
					if best.Type != PathPXN || bw > best.BW {
						nodes := append(append([]*Node(nil), toPeer.Nodes...), peerToNIC.Nodes[1:]...)
						best = Path{Type: PathPXN, BW: bw, Nodes: nodes, Via: peer}
					}
				}
				g.paths[[2]*Node{gpu, nic}] = best
			}
		}
	}
}

// NICsAt returns the NICs whose path from device n has class t, by bus id.
func (g *Graph) NICsAt(n *Node, t PathType) []*Node {
	var out []*Node
	for _, nic := range g.sortedNodes(NIC) {
		if g.Path(n, nic).Type == t {
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
		b, port := g.Path(n, nic).BW, 0.0
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
		a, b := g.Path(n, nics[i]), g.Path(n, nics[j])
		if a.Type != b.Type {
			return a.Type < b.Type
		}
		return bw(nics[i]) > bw(nics[j])
	})
	best, bestBW := g.Path(n, nics[0]), bw(nics[0])
	var out []*Node
	for _, nic := range nics {
		if g.Path(n, nic).Type == best.Type && bw(nic) == bestBW {
			out = append(out, nic)
		}
	}
	return out
}
