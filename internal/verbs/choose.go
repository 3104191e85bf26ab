package verbs

import (
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"

	"github.com/gccl/gccl/internal/logx"
	"github.com/gccl/gccl/topo"
)

// Near says what a rank's HCA should be close to: its GPU, or else its
// NUMA node, in the host's topology.
type Near struct {
	// Graph is the host's topology; nil when unknown (then only the NUMA
	// nodes of the devices' PCI functions count).
	Graph *topo.Graph
	GPU   string // the PCI bus id of the rank's GPU; "" for none
	NUMA  int    // the rank's NUMA node; -1 when unknown
	// LocalRank spreads the ranks of one host over equally near ports.
	LocalRank int
}

// what names the device ports are measured from, for the log.
func (n Near) what() string {
	switch {
	case n.GPU != "":
		return "GPU " + n.GPU
	case n.NUMA >= 0:
		return "NUMA node " + strconv.Itoa(n.NUMA)
	}
	return "this process"
}

// Candidate is a device port a rank may use, with the GID it would use and
// its distance from what Near names.
type Candidate struct {
	Device string
	BusID  string
	Port   PortInfo
	GID    GIDEntry
	// Path is the class of the path from the rank's GPU or NUMA node to
	// the device (PIX, PXB, PHB, SYS, ...): topo's, or PHB/SYS from the
	// NUMA nodes. Known is false when neither could say (a software device,
	// or no topology); Path is then SYS.
	Path  topo.PathType
	Known bool
}

// Name is "device:port".
func (c Candidate) Name() string { return c.Port.Name(c.Device) }

func (c Candidate) String() string {
	kind := "IB"
	if c.Port.LinkLayer == LinkEthernet {
		kind = "RoCE"
	}
	dist := c.Path.String()
	if !c.Known {
		dist = "distance unknown"
	}
	return fmt.Sprintf("%s/%s %v, %s", c.Name(), kind, c.GID, dist)
}

// Candidates lists the device ports that cfg allows and that can carry RC
// traffic (active, with a GID to use), nearest first: by path class (PIX
// before PXB before PHB before SYS), known distances before unknown ones,
// then by name. skipped says why the other ports were left out.
func Candidates(devs []Device, cfg Config, near Near) (cands []Candidate, skipped []string, err error) {
	if cfg.Disable {
		return nil, nil, fmt.Errorf("%w: RDMA is disabled (GCCL_IB_DISABLE=1)", ErrNotSupported)
	}
	for _, d := range devs {
		for _, p := range d.Ports {
			name := p.Name(d.Name)
			switch {
			case !cfg.HCA.Match(d.Name, p.Num):
				skipped = append(skipped, name+": not selected by GCCL_IB_HCA="+cfg.HCA.String())
				continue
			case p.State != PortActive:
				skipped = append(skipped, fmt.Sprintf("%s: port %v", name, p.State))
				continue
			case p.LinkLayer != LinkInfiniBand && p.LinkLayer != LinkEthernet:
				skipped = append(skipped, fmt.Sprintf("%s: link layer %v", name, p.LinkLayer))
				continue
			}
			gid, err := ChooseGID(p.GIDs, p.LinkLayer, cfg.GIDIndex)
			if err != nil {
				skipped = append(skipped, name+": "+strings.TrimPrefix(err.Error(), "verbs: "))
				continue
			}
			c := Candidate{Device: d.Name, BusID: d.BusID, Port: p, GID: gid, Path: topo.PathSYS}
			c.Path, c.Known = distance(d, p, near)
			cands = append(cands, c)
		}
	}
	sort.SliceStable(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		if a.Path != b.Path {
			return a.Path < b.Path
		}
		if a.Known != b.Known {
			return a.Known
		}
		if a.Device != b.Device {
			return a.Device < b.Device
		}
		return a.Port.Num < b.Port.Num
	})
	if len(cands) == 0 {
		why := "no RDMA devices"
		if len(skipped) > 0 {
			why = strings.Join(skipped, "; ")
		}
		return nil, skipped, fmt.Errorf("%w: no usable RDMA port (%s)", ErrNotSupported, why)
	}
	return cands, skipped, nil
}

// distance classifies the path from what near names to device d's port p.
func distance(d Device, p PortInfo, near Near) (topo.PathType, bool) {
	if g := near.Graph; g != nil {
		var from *topo.Node
		if near.GPU != "" {
			from = g.FindBusID(near.GPU)
		} else if near.NUMA >= 0 {
			from = g.Find(topo.CPU, "numa"+strconv.Itoa(near.NUMA))
		}
		// The NIC: the parent of its port's NET node (named as topo names
		// ports: "mlx5_0", "mlx5_0:2"), or its PCI function.
		var nic *topo.Node
		netName := d.Name
		if p.Num > 1 {
			netName = p.Name(d.Name)
		}
		if n := g.Find(topo.NET, netName); n != nil && n.Parent != nil {
			nic = n.Parent
		} else if d.BusID != "" {
			nic = g.FindBusID(d.BusID)
		}
		if from != nil && nic != nil {
			switch t := g.Path(from, nic).Type; t {
			case topo.PathDIS:
			case topo.PathPXN:
				// topo routes through an NVLink peer GPU when the direct
				// path crosses the CPU; the rank uses the HCA itself, so
				// the direct path's class counts: PHB under the same CPU,
				// SYS across sockets.
				if g.LocalCPU(from) == g.LocalCPU(nic) {
					return topo.PathPHB, true
				}
				return topo.PathSYS, true
			default:
				return t, true
			}
		}
	}
	if near.NUMA >= 0 && d.NUMA >= 0 {
		if near.NUMA == d.NUMA {
			return topo.PathPHB, true
		}
		return topo.PathSYS, true
	}
	return topo.PathSYS, false
}

// Choose picks the port for a rank: the nearest of Candidates, spread over
// the equally near ones by near.LocalRank.
func Choose(devs []Device, cfg Config, near Near) (Candidate, error) {
	c, _, err := choose(devs, cfg, near)
	return c, err
}

func choose(devs []Device, cfg Config, near Near) (Candidate, []Candidate, error) {
	cands, _, err := Candidates(devs, cfg, near)
	if err != nil {
		return Candidate{}, nil, err
	}
	tier := 1
	for tier < len(cands) && cands[tier].Path == cands[0].Path && cands[tier].Known == cands[0].Known {
		tier++
	}
	return cands[max(near.LocalRank, 0)%tier], cands, nil
}

// Select finds the host's devices, picks the rank's port with Choose and
// logs the choice at INFO (subsystem NET) on log, or on gccl's logger when
// log is nil.
func Select(cfg Config, near Near, log *slog.Logger) (Candidate, error) {
	if cfg.Disable {
		return Candidate{}, fmt.Errorf("%w: RDMA is disabled (GCCL_IB_DISABLE=1)", ErrNotSupported)
	}
	devs, err := Devices()
	if err != nil {
		return Candidate{}, err
	}
	c, all, err := choose(devs, cfg, near)
	if err != nil {
		return Candidate{}, err
	}
	if log == nil {
		log = logx.Default()
	}
	others := make([]string, 0, len(all))
	for _, o := range all {
		if o.Name() != c.Name() {
			others = append(others, o.Name()+" "+o.Path.String())
		}
	}
	log.Info(fmt.Sprintf("NET/IB : Using %s for %s", c, near.what()), "subsys", "NET",
		"local_rank", near.LocalRank, "others", strings.Join(others, ","))
	return c, nil
}
