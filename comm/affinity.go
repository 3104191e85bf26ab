package comm

import (
	"fmt"

	"github.com/gccl/gccl/topo"
)

// Progress-thread placement. A communicator's async operations run on its
// progress goroutine; for multi-process communicators that goroutine is
// locked to an OS thread pinned to the CPUs of the NUMA node its rank maps
// to, as NCCL pins its proxy threads near their devices: the memory it moves
// is then local. Ranks without a device of their own are spread over the
// host's NUMA nodes in blocks of consecutive local ranks, as launchers bind
// them. The inherited CPU mask (taskset, cgroups, the launcher's binding)
// always wins: the pinning only narrows it.

// progressCPUs returns the CPUs for local rank localRank of localSize on a
// host with graph g, within inherited, and a warning when the result
// crowds the thread: a single CPU, which the rank's own thread shares.
func progressCPUs(g *topo.Graph, localRank, localSize int, inherited []int) (cpus []int, warn string) {
	allowed := map[int]bool{}
	for _, c := range inherited {
		allowed[c] = true
	}
	cpus = inherited
	if g != nil && len(g.Nodes[topo.CPU]) > 0 && localSize > 0 {
		numas := g.Nodes[topo.CPU]
		numa := numas[localRank*len(numas)/localSize]
		var near []int
		for _, c := range g.Affinity(numa).CPUs() {
			if allowed[c] {
				near = append(near, c)
			}
		}
		if len(near) > 0 {
			cpus = near
		} else if len(numas) > 1 {
			warn = fmt.Sprintf("the CPUs of %s (%v) are outside the inherited mask; progress thread left on %v", numa.ID, g.Affinity(numa), inherited)
		}
	}
	if len(cpus) == 1 && warn == "" {
		warn = fmt.Sprintf("the CPU mask leaves the progress thread one core (CPU %d), shared with the rank's own thread: async operations will compete with the caller", cpus[0])
	}
	return cpus, warn
}

// emptyTopology stands for a rank that did not describe its host (only the
// lowest rank of each host does).
var emptyTopology = []byte(`<system version="1"></system>`)

// useTopology merges the hosts' topologies from the descriptors into the job
// graph, and places the progress thread from it.
func (c *Comm) useTopology(infos []peerInfo, localRank, localSize int) {
	rts := make([]topo.RankTopology, len(infos))
	for p, info := range infos {
		rts[p] = topo.RankTopology{HostID: info.HostID, XML: info.Topo}
		if len(info.Topo) == 0 {
			rts[p].XML = emptyTopology
		}
	}
	job, err := topo.Merge(rts)
	if err != nil {
		c.log.Warn("cannot merge the hosts' topologies: "+err.Error(), "subsys", "GRAPH")
		return
	}
	c.topo = job
	c.orderRing(job)
	g := job.Hosts[job.RankHost[c.rank]].Graph
	c.log.Info(fmt.Sprintf("topology: %d host(s); this one has %d NUMA node(s), %d GPU(s), %d NIC(s)",
		len(job.Hosts), len(g.Nodes[topo.CPU]), len(g.Nodes[topo.GPU]), len(g.Nodes[topo.NIC])), "subsys", "GRAPH")
	inherited, err := inheritedCPUs()
	if err != nil {
		return
	}
	cpus, warn := progressCPUs(g, localRank, localSize, inherited)
	if len(cpus) < len(inherited) {
		c.progressCPUs = cpus
		c.log.Info(fmt.Sprintf("progress thread on CPUs %v (pinned)", cpus), "subsys", "INIT")
	} else {
		// Nothing to narrow (one NUMA node, or a launcher that bound the
		// rank already): a locked thread would only cost two thread
		// switches per hand-off between the caller and the progress
		// goroutine.
		c.log.Info(fmt.Sprintf("progress thread on CPUs %v (all it inherited: not pinned)", cpus), "subsys", "INIT")
	}
	if warn != "" {
		c.log.Warn("progress thread: "+warn, "subsys", "INIT")
	}
}

// ringDevices returns each rank's device in its host's graph: for ranks on
// host memory, the NUMA node its local rank maps to (as for its progress
// thread). It returns nil when a host's graph has no NUMA node.
func ringDevices(job *topo.Job) []*topo.Node {
	dev := make([]*topo.Node, len(job.RankHost))
	for _, h := range job.Hosts {
		numas := h.Graph.Nodes[topo.CPU]
		if len(numas) == 0 {
			return nil
		}
		for i, r := range h.Ranks {
			dev[r] = numas[i*len(numas)/len(h.Ranks)]
		}
	}
	return dev
}

// orderRing lays the rings along the topology: each host's ranks together
// (the ring crosses the network once per host) and, inside a host, fast
// links adjacent and few NUMA crossings.
func (c *Comm) orderRing(job *topo.Job) {
	dev := ringDevices(job)
	if dev == nil {
		return
	}
	order, err := job.RingOrder(dev)
	if err == nil {
		err = c.setRingOrder(order)
	}
	if err != nil {
		c.log.Warn("rings keep rank order: "+err.Error(), "subsys", "GRAPH")
		return
	}
	if c.ringOrder != nil {
		c.log.Info(fmt.Sprintf("ring order from the topology: %v", order), "subsys", "GRAPH")
	}
}
