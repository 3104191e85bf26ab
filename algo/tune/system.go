package tune

import (
	"errors"
	"fmt"

	"github.com/gccl/gccl/topo"
)

// Per-step latencies of NCCL's Simple protocol (src/graph/tuning.cc, ring
// column), in µs: what one more hop of a ring adds on each kind of link, and
// the base cost of a call. gccl models one protocol; NCCL's LL and LL128,
// which cut small-message latency on GPUs, are not modelled.
const (
	NCCLBaseLatencyUs   = 8.4
	NCCLNVLinkLatencyUs = 3.4
	NCCLPCILatencyUs    = 5.7
	NCCLNetLatencyUs    = 14.0
	NCCLTreeEfficiency  = 0.9
)

// FromGraph describes a GPU system for the model: ranksPerNode ranks per
// host (0: one per GPU), each on one GPU of g, on nodes identical hosts.
//
// Intra.BW is the bottleneck of the best ring over those GPUs (topo's ring
// order: for NVSwitch systems every GPU's NVLink lanes together); Inter.BW
// is the network bandwidth of the NICs nearest to those GPUs, each counted
// once at the lower of its port speed and its PCI path (the PCI path alone
// when the file does not list the NIC's ports). Latencies are
// NCCL's for the links the ring uses.
func FromGraph(name string, g *topo.Graph, nodes, ranksPerNode int) (System, error) {
	gpus := g.Nodes[topo.GPU]
	if len(gpus) == 0 {
		return System{}, errors.New("tune: the topology has no GPU; host ranks use ThisMachine")
	}
	if ranksPerNode == 0 {
		ranksPerNode = len(gpus)
	}
	if ranksPerNode < 0 || ranksPerNode > len(gpus) {
		return System{}, fmt.Errorf("tune: %d ranks per node on %d GPUs", ranksPerNode, len(gpus))
	}
	if nodes < 1 {
		return System{}, fmt.Errorf("tune: %d nodes", nodes)
	}
	devs := gpus[:ranksPerNode]
	order := g.RingOrder(devs)
	st := g.RingStats(devs, order)
	sys := System{
		Name: name, Nodes: nodes, RanksPerNode: ranksPerNode,
		BaseLatencyUs: NCCLBaseLatencyUs, TreeEfficiency: NCCLTreeEfficiency,
		MinChunkBytes: 64 << 10, MaxChunkBytes: 4 << 20,
	}
	if ranksPerNode > 1 {
		sys.Intra.BW = st.MinBW
		sys.Intra.LatencyUs = NCCLNVLinkLatencyUs
		for _, t := range st.Types {
			if t > topo.PathNVB {
				sys.Intra.LatencyUs = NCCLPCILatencyUs
			}
		}
	}
	if nodes > 1 {
		seen := map[*topo.Node]bool{}
		for _, gpu := range devs {
			for _, nic := range g.NearestNICs(gpu) {
				if seen[nic] {
					continue
				}
				seen[nic] = true
				port := 0.0
				for _, l := range nic.Links {
					if l.Type == topo.LinkNET {
						port += l.BW
					}
				}
				path := g.Path(gpu, nic).BW
				if port == 0 {
					// A PCI-only skeleton names NICs by class code without
					// their ports: the PCI link is all that is known.
					port = path
				}
				sys.Inter.BW += min(port, path)
			}
		}
		if sys.Inter.BW == 0 {
			return System{}, errors.New("tune: several nodes, but the topology has no NIC near the GPUs")
		}
		sys.Inter.LatencyUs = NCCLNetLatencyUs
	}
	return sys, sys.Validate()
}
