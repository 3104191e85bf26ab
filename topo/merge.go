package topo

import (
	"bytes"
	"errors"
	"fmt"
)

// RankTopology is what one rank publishes at Init: the host it runs on and
// its view of that host as NCCL XML (MarshalXML of its graph's Doc).
type RankTopology struct {
	HostID string
	XML    []byte
}

// Host is one machine of a job.
type Host struct {
	ID    string
	Graph *Graph
	Ranks []int // the job ranks on this host, increasing
}

// Job is the system graph of a whole job: one graph per host (hosts share
// nothing but the network), in order of their lowest rank.
type Job struct {
	Hosts    []*Host
	RankHost []int // rank -> index into Hosts
}

// Merge builds the job graph from every rank's topology, indexed by rank.
// Ranks of one host may each know only part of it (their own GPU and NICs,
// as NCCL's per-rank detection does): their documents are fused element by
// element, keyed by NUMA id, bus id and port name. Two ranks that disagree on
// an attribute both state is an error naming it: their views cannot both be
// true.
func Merge(ranks []RankTopology) (*Job, error) {
	if len(ranks) == 0 {
		return nil, errors.New("topo: merge of zero ranks")
	}
	job := &Job{RankHost: make([]int, len(ranks))}
	docs := map[string]*Element{}
	index := map[string]int{}
	for r, rt := range ranks {
		if rt.HostID == "" {
			return nil, fmt.Errorf("topo: rank %d has no host id", r)
		}
		doc, err := ParseXML(bytes.NewReader(rt.XML))
		if err != nil {
			return nil, fmt.Errorf("topo: rank %d (host %s): %w", r, rt.HostID, err)
		}
		h, ok := index[rt.HostID]
		if !ok {
			h = len(job.Hosts)
			index[rt.HostID] = h
			job.Hosts = append(job.Hosts, &Host{ID: rt.HostID})
			docs[rt.HostID] = doc
		} else if err := fuse(docs[rt.HostID], doc, "system"); err != nil {
			return nil, fmt.Errorf("topo: rank %d (host %s): %w", r, rt.HostID, err)
		}
		job.RankHost[r] = h
		job.Hosts[h].Ranks = append(job.Hosts[h].Ranks, r)
	}
	for _, h := range job.Hosts {
		g, err := Build(docs[h.ID])
		if err != nil {
			return nil, fmt.Errorf("topo: host %s: %w", h.ID, err)
		}
		h.Graph = g
	}
	return job, nil
}

// elementKey identifies an element among its siblings across documents.
func elementKey(e *Element) string {
	switch e.Name {
	case "cpu":
		return "cpu/" + e.Attr("numaid")
	case "pci":
		if id, err := NormalizeBusID(e.Attr("busid")); err == nil {
			return "pci/" + id
		}
		return "pci/" + e.Attr("busid")
	case "net":
		return "net/" + e.Attr("name")
	case "nvlink":
		if id, err := NormalizeBusID(e.Attr("target")); err == nil {
			return "nvlink/" + id
		}
		return "nvlink/" + e.Attr("target")
	}
	// gpu, nic, c2c and anything else: one per parent.
	return e.Name
}

// sameValue says whether two spellings of attribute name mean the same: CPU
// masks of different widths, bus ids with or without their domain.
func sameValue(name, a, b string) bool {
	if a == b {
		return true
	}
	switch name {
	case "affinity":
		x, err1 := ParseCPUMask(a)
		y, err2 := ParseCPUMask(b)
		return err1 == nil && err2 == nil && x.Equal(y)
	case "busid", "target":
		x, err1 := NormalizeBusID(a)
		y, err2 := NormalizeBusID(b)
		return err1 == nil && err2 == nil && x == y
	}
	return false
}

// fuse adds what src knows to dst. Children are matched by key, the k-th
// of a key in src with the k-th in dst, so that fusing a document with
// itself changes nothing.
func fuse(dst, src *Element, where string) error {
	for _, a := range src.Attrs {
		if v, ok := dst.Get(a.Name); !ok {
			dst.Attrs = append(dst.Attrs, a)
		} else if dst.Name == "gpu" && a.Name == "rank" && (v == "-1" || a.Value == "-1") {
			// -1 is unknown (a rank that detected every GPU of the host):
			// the rank that owns the GPU knows better.
			if v == "-1" {
				dst.Set(a.Name, a.Value)
			}
		} else if !sameValue(a.Name, v, a.Value) {
			return fmt.Errorf("topo: ranks disagree on %s %s: %q and %q", where, a.Name, truncate(v), truncate(a.Value))
		}
	}
	byKey := map[string][]*Element{}
	for _, c := range dst.Children {
		k := elementKey(c)
		byKey[k] = append(byKey[k], c)
	}
	seen := map[string]int{}
	for _, c := range src.Children {
		k := elementKey(c)
		i := seen[k]
		seen[k]++
		if i < len(byKey[k]) {
			if err := fuse(byKey[k][i], c, where+"/"+k); err != nil {
				return err
			}
			continue
		}
		cl := c.Clone()
		dst.Children = append(dst.Children, cl)
		byKey[k] = append(byKey[k], cl)
	}
	return nil
}

// InterHostPath returns the path between device a on host ha and device b
// on host hb of a job: PathNET when the hosts differ, through the nearest
// NIC at each end, as fast as the slower end. On one host it is the host's
// own path.
func (j *Job) InterHostPath(ha int, a *Node, hb int, b *Node) Path {
	if ha == hb {
		return j.Hosts[ha].Graph.Path(a, b)
	}
	end := func(h int, n *Node) float64 {
		g := j.Hosts[h].Graph
		nics := g.NearestNICs(n)
		if len(nics) == 0 {
			return 0
		}
		best := 0.0
		toNIC := g.summary(n, nics[0]).bw
		for _, l := range nics[0].Links {
			if l.Type == LinkNET {
				best = max(best, l.BW)
			}
		}
		if best == 0 {
			return 0
		}
		return min(toNIC, best)
	}
	bw := min(end(ha, a), end(hb, b))
	if bw == 0 {
		return Path{Type: PathDIS}
	}
	return Path{Type: PathNET, BW: bw}
}

// RingOrder orders all ranks of the job into one ring: each host's ranks
// consecutively (so the ring crosses the network once per host, the
// fewest possible), in the order Graph.RingOrder gives inside the host
// (widest links, fewest NUMA crossings) opened at its slowest hop
// (preferring a NUMA crossing among equals), hosts in Job order. dev[r] is
// the device of rank r on its host's graph. It returns the ranks in ring
// order.
func (j *Job) RingOrder(dev []*Node) ([]int, error) {
	if len(dev) != len(j.RankHost) {
		return nil, fmt.Errorf("topo: %d devices for %d ranks", len(dev), len(j.RankHost))
	}
	var ring []int
	for h, host := range j.Hosts {
		devs := make([]*Node, len(host.Ranks))
		for i, r := range host.Ranks {
			if dev[r] == nil || host.Graph.nodeIndex(dev[r]) < 0 {
				return nil, fmt.Errorf("topo: rank %d's device is not in host %s's graph", r, j.Hosts[h].ID)
			}
			devs[i] = dev[r]
		}
		order := host.Graph.RingOrder(devs)
		// The host's ring is cut open where the network hop will replace
		// it: at its slowest hop (then farthest class), preferring among
		// equals one that crosses NUMA nodes, so the path left inside the
		// host keeps the fast, local hops. On NVSwitch hosts every hop
		// ties on the first two, and only the crossing tells them apart.
		g, cut := host.Graph, len(order)-1
		crosses := func(i int) bool {
			return g.LocalCPU(devs[order[i]]) != g.LocalCPU(devs[order[(i+1)%len(order)]])
		}
		worse := func(i, j int) bool {
			pi := g.summary(devs[order[i]], devs[order[(i+1)%len(order)]])
			pj := g.summary(devs[order[j]], devs[order[(j+1)%len(order)]])
			if pi.bw != pj.bw {
				return pi.bw < pj.bw
			}
			if pi.typ != pj.typ {
				return pi.typ > pj.typ
			}
			return crosses(i) && !crosses(j)
		}
		for i := range order {
			if worse(i, cut) {
				cut = i
			}
		}
		for k := range order {
			ring = append(ring, host.Ranks[order[(cut+1+k)%len(order)]])
		}
	}
	return ring, nil
}

// nodeIndex returns n's index in g, or -1 when n is nil or belongs to another
// graph.
func (g *Graph) nodeIndex(n *Node) int {
	if n == nil || n.Type < 0 || n.Type >= numNodeTypes || n.Index < 0 || n.Index >= len(g.Nodes[n.Type]) || g.Nodes[n.Type][n.Index] != n {
		return -1
	}
	return n.Index
}
