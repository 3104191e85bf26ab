package verbs

import (
	"fmt"
	"sort"
	"strings"
)

// GIDType is the kind of a GID table entry, as sysfs names it in
// ports/N/gid_attrs/types/I.
type GIDType uint8

// The GID types.
const (
	GIDUnknown GIDType = iota // no type in sysfs
	GIDIB                     // "IB/RoCE v1": InfiniBand, or RoCE v1 on Ethernet
	GIDRoCEv2                 // "RoCE v2": RoCE over UDP/IP, routable
)

func (t GIDType) String() string {
	switch t {
	case GIDIB:
		return "IB/RoCE v1"
	case GIDRoCEv2:
		return "RoCE v2"
	}
	return "unknown"
}

// parseGIDType reads a gid_attrs/types entry.
func parseGIDType(s string) GIDType {
	switch s = strings.TrimSpace(s); {
	case strings.EqualFold(s, "RoCE v2"):
		return GIDRoCEv2
	case strings.EqualFold(s, "IB/RoCE v1"), strings.EqualFold(s, "RoCE v1"), strings.EqualFold(s, "IB"):
		return GIDIB
	}
	return GIDUnknown
}

// GIDEntry is one populated entry of a port's GID table.
type GIDEntry struct {
	Index int
	GID   GID
	Type  GIDType
	// NetDev is the network interface the entry belongs to (RoCE), from
	// gid_attrs/ndevs; empty on InfiniBand.
	NetDev string
}

func (e GIDEntry) String() string {
	s := fmt.Sprintf("GID %d %s (%s", e.Index, e.GID, e.Type)
	if e.NetDev != "" {
		s += ", " + e.NetDev
	}
	return s + ")"
}

// gidRank orders the entries ChooseGID prefers, lowest first: on Ethernet,
// RoCE v2 with an IPv4-mapped address, then other RoCE v2 that are not
// link-local, then RoCE v2 link-local, then RoCE v1 and entries of unknown
// type. On InfiniBand, the table's order (index 0 is the port GID).
func gidRank(e GIDEntry, ll LinkLayer) int {
	if ll != LinkEthernet {
		return 0
	}
	switch {
	case e.Type == GIDRoCEv2 && e.GID.IPv4Mapped():
		return 0
	case e.Type == GIDRoCEv2 && !e.GID.linkLocal():
		return 1
	case e.Type == GIDRoCEv2:
		return 2
	case e.Type == GIDIB:
		return 3
	}
	return 4
}

// ChooseGID picks the GID a QP on a port with link layer ll uses, from the
// port's populated entries: index force when force >= 0 (GCCL_IB_GID_INDEX),
// else the best by gidRank, then the lowest index.
func ChooseGID(entries []GIDEntry, ll LinkLayer, force int) (GIDEntry, error) {
	if force >= 0 {
		for _, e := range entries {
			if e.Index == force && !e.GID.IsZero() {
				return e, nil
			}
		}
		return GIDEntry{}, fmt.Errorf("verbs: GCCL_IB_GID_INDEX=%d: the port has no GID at that index (it has %s)", force, gidIndexes(entries))
	}
	var best *GIDEntry
	for i := range entries {
		e := &entries[i]
		if e.GID.IsZero() {
			continue
		}
		if best == nil || gidRank(*e, ll) < gidRank(*best, ll) ||
			gidRank(*e, ll) == gidRank(*best, ll) && e.Index < best.Index {
			best = e
		}
	}
	if best == nil {
		return GIDEntry{}, fmt.Errorf("verbs: the port has no GID (on RoCE: its network interface has no IP address, or is down)")
	}
	return *best, nil
}

func gidIndexes(entries []GIDEntry) string {
	var idx []int
	for _, e := range entries {
		if !e.GID.IsZero() {
			idx = append(idx, e.Index)
		}
	}
	if len(idx) == 0 {
		return "none"
	}
	sort.Ints(idx)
	return strings.Trim(fmt.Sprint(idx), "[]")
}
