package tune

import (
	"fmt"
	"math/bits"
	"slices"

	"github.com/gccl/gccl/algo"
)

// This machine class's calibration: gccl's host schedules on a 2-vCPU KVM
// guest (docs/PERFORMANCE.md, "Calibrating the tuner", has the figures,
// their commands and the crossovers the model reproduces). Ranks on one
// host talk over shared memory, hosts over TCP.
//
// With a core per rank (at most CalibrationCores ranks on a host) the
// figures are two ranks' (2026-11-21, blocking calls): the bandwidths are
// the 256 MiB all-reduce bus bandwidths; base and step latency split the
// 8-byte ring all-reduce (ring forced) as base + 2 steps; a direct peer is
// the 8-byte one-exchange all-reduce less the base.
const (
	ShmBusBW  = 2.88 // GB/s: 256 MiB all-reduce, shm
	ShmBaseUs = 0.5
	ShmStepUs = 0.5  // 8 B ring all-reduce 1.50 µs = 0.5 + 2 × 0.5
	ShmPeerUs = 0.2  // CrowdedShmPeerUs's share of a step (0.4); not measured
	TCPBusBW  = 1.66 // GB/s: 256 MiB all-reduce, TCP over loopback
	TCPBaseUs = 4.0
	TCPStepUs = 12.5 // 8 B ring all-reduce 29 µs = 4 + 2 × 12.5
	TCPPeerUs = 7.5  // CrowdedTCPPeerUs's share of a step (0.6); not measured
)

// With more ranks on a host than it has cores, every dependent hop may
// wait for a context switch. These figures come from 3 to 8 ranks on the
// 2 vCPUs, fitted to the crossovers measured there: the one exchange
// against the tree at 3, 4 and 8 ranks (2026-11-22; TCP over loopback at
// 4), the ring against the tree and the chain against the tree at 3, 4, 6
// and 8 (2026-11-27). "Small" is the median over 8 B to 2 KiB.
const (
	// CalibrationCores is the cores of the machine the figures come from:
	// a host with more ranks than this is crowded.
	CalibrationCores = 2

	CrowdedShmBusBW = 1.85 // GB/s: 4 ranks, 16 MiB all-reduce
	// CrowdedShmStepUs puts a step at 12 KB of ring traffic (× 1.85 GB/s):
	// the ring/tree crossovers of 16-32 KiB on 6 ranks and 32-64 KiB on 8
	// allow 10.6-15.6 KB.
	CrowdedShmStepUs = 6.5
	// CrowdedShmPeerUs is 0.4 steps: on 8 ranks the exchange took 47 µs at
	// 8 B against the tree's 103, 1 + 6 × 0.4 steps against 7.5.
	CrowdedShmPeerUs = 2.6
	CrowdedTCPBusBW  = 1.07 // GB/s: TCP's 1.66 scaled as shm's (1.85/2.88); not measured
	CrowdedTCPStepUs = 90   // 4 ranks: tree all-reduce 8 B 517 µs = 4 + 5 steps, ring all-gather 32 B 260 µs = 4 + 3
	CrowdedTCPPeerUs = 55   // 4 ranks: exchange 8 B 204 µs = 4 + 90 + 2 × 55

	// HostTreeHop is a tree level's latency in ring steps: small tree /
	// ring time ratios times the ring's steps over the tree's (3, 4, 6, 8
	// ranks: 1.14, 1.51, 0.98, 1.38; the median).
	HostTreeHop = 1.25
	// HostChainHop is a broadcast or reduce chain hop's latency in ring
	// steps: a chain of blocking calls overlaps from one call to the next,
	// so it costs far less than its n-1 hops (small chain / tree time
	// ratios times the tree's steps over the chain's hops: broadcast 3, 4,
	// 8 ranks 0.40, 0.19, 0.17, reduce 3, 4 ranks 0.35, 0.30; the median).
	HostChainHop = 0.3
	// HostTreeEfficiency is the tree's share of the ring's bandwidth: its
	// time per byte against the ring's, up to 2 MiB (256 KiB on 6 ranks; 3,
	// 4, 6, 8 ranks: 1.23, 0.70, 0.44, 0.55; the median).
	HostTreeEfficiency = 0.6

	DirectMaxBytes = 64 << 10
	// DirectMaxRanks bounds the ranks of the direct schedules: each rank
	// receives (and reduces) every other rank's input in turn; measured to
	// 8 ranks.
	DirectMaxRanks = 8

	hostMinChunk    = 4 << 10
	hostMaxChunk    = 1 << 20
	hostDefaultName = "this machine"
)

// shmLink and tcpLink are the calibrated links for a host with ranks ranks.
func shmLink(ranks int) (Link, float64) {
	if ranks > CalibrationCores {
		return Link{BW: CrowdedShmBusBW, LatencyUs: CrowdedShmStepUs, PeerUs: CrowdedShmPeerUs}, ShmBaseUs
	}
	return Link{BW: ShmBusBW, LatencyUs: ShmStepUs, PeerUs: ShmPeerUs}, ShmBaseUs
}

func tcpLink(ranks int) (Link, float64) {
	if ranks > CalibrationCores {
		return Link{BW: CrowdedTCPBusBW, LatencyUs: CrowdedTCPStepUs, PeerUs: CrowdedTCPPeerUs}, TCPBaseUs
	}
	return Link{BW: TCPBusBW, LatencyUs: TCPStepUs, PeerUs: TCPPeerUs}, TCPBaseUs
}

// hostSystem is the part of a host system that does not depend on the
// links.
func hostSystem(name string) System {
	return System{Name: name, Schedules: HostSchedules,
		TreeEfficiency: HostTreeEfficiency, TreeHop: HostTreeHop, ChainHop: HostChainHop,
		DirectMaxBytes: DirectMaxBytes, DirectMaxRanks: DirectMaxRanks,
		MinChunkBytes: hostMinChunk, MaxChunkBytes: hostMaxChunk}
}

// ThisMachine returns the calibrated system for ranks processes on this
// host talking over transport ("shm" or "tcp").
func ThisMachine(transport string, ranks int) (System, error) {
	if ranks < 1 {
		return System{}, fmt.Errorf("tune: %d ranks", ranks)
	}
	sys := hostSystem(hostDefaultName + " (" + transport + ")")
	sys.Nodes, sys.RanksPerNode = 1, ranks
	switch transport {
	case "shm":
		sys.Intra, sys.BaseLatencyUs = shmLink(ranks)
	case "tcp":
		sys.Intra, sys.BaseLatencyUs = tcpLink(ranks)
		sys.IntraNet = true
	default:
		return System{}, fmt.Errorf("tune: no calibration for transport %q (want shm or tcp)", transport)
	}
	return sys, nil
}

// Host returns the calibrated system for a job of host-memory ranks on
// this machine class: perHost[i] ranks on host i (in any order), shared
// memory inside a host, TCP across. In-process ranks count as one host.
func Host(perHost ...int) (System, error) { return HostOver("shm", perHost...) }

// HostOver is Host with the ranks of a host talking over intra: "shm", or
// "tcp" where shared memory is off (any network transport: a message costs
// system calls and wake-ups on both sides).
func HostOver(intra string, perHost ...int) (System, error) {
	if intra != "shm" && intra != "tcp" {
		return System{}, fmt.Errorf("tune: no calibration for transport %q inside a host (want shm or tcp)", intra)
	}
	if len(perHost) == 0 || slices.Min(perHost) < 1 {
		return System{}, fmt.Errorf("tune: hosts of %v ranks", perHost)
	}
	most, n := slices.Max(perHost), 0
	for _, r := range perHost {
		n += r
	}
	sys := hostSystem(fmt.Sprintf("%s: %d host(s), %d rank(s)", hostDefaultName, len(perHost), n))
	sys.Nodes, sys.RanksPerNode = len(perHost), most
	if most != slices.Min(perHost) {
		sys.UnevenRanks = n
	}
	sys.Intra, sys.BaseLatencyUs = shmLink(most)
	if intra == "tcp" {
		sys.Intra, sys.BaseLatencyUs = tcpLink(most)
		sys.IntraNet = true
	}
	if len(perHost) > 1 {
		sys.Inter, sys.BaseLatencyUs = tcpLink(most)
	}
	return sys, sys.Validate()
}

// doublingFits says whether the recursive doubling may run coll of bytes
// unforced: on one node whose ranks talk over the network, within
// DirectMaxBytes of traffic per rank (docs/PERFORMANCE.md, "Recursive
// doubling over TCP": measured faster than the exchange and the ring there
// up to 32 KiB on 4 and 8 ranks, even at 64 KiB, slower from 256 KiB; on
// shared memory slower than the exchange at small sizes).
func (s System) doublingFits(coll algo.Collective, bytes float64, scaled bool) bool {
	n := s.Ranks()
	return s.applies(algo.Doubling, coll, scaled) && s.Nodes == 1 && s.IntraNet && n > 1 &&
		float64(bits.Len(uint(n))-1)*bytes <= float64(s.DirectMaxBytes)
}

// directFits says whether coll of bytes (nccl-tests' size) is within the
// direct schedules' bounds.
func (s System) directFits(coll algo.Collective, bytes float64) bool {
	n := s.Ranks()
	in := bytes
	if coll == algo.AllGather {
		in = bytes / float64(n)
	}
	return n <= s.DirectMaxRanks && float64(n-1)*in <= float64(s.DirectMaxBytes)
}

// hostTime prices gccl's host schedules (HostSchedules): time's figure.
//
// For n ranks on k hosts of p ranks, with a step latency L and a direct
// peer's P on each link (the network's where the hop crosses hosts):
//
//	ring       all-reduce 2(n-1) steps, 2(k-1) across hosts; all-gather and
//	           reduce-scatter n-1, k-1; bytes × busfactor / ring bandwidth
//	chain      broadcast, reduce: n-1 hops of ChainHop steps (k-1 across);
//	           bytes / ring bandwidth
//	tree       levels D = ceil(log2 n), ceil(log2 k) of them across hosts,
//	           TreeHop steps each; all-reduce twice (up, down), 2 bytes;
//	           broadcast, reduce once, 1 byte; at TreeEfficiency
//	direct     a step for the first peer, P for each further one (seen
//	           from the smallest host); its copies to peers on its host, and
//	           r(n-r) copies over a host's network for its r ranks
//	hier       k rings of p-1 steps inside each host (twice for all-reduce),
//	           and across hosts one swap (k = 2) or a ring; the slower of
//	           the bytes inside and across
//	doubling   all-reduce: log2(n) swaps of a step each (two more hops
//	           where n is not a power of two), ceil(log2 k) of them across
//	           hosts; the whole input per swap at the ring's bandwidth
func (s System) hostTime(a algo.Algorithm, coll algo.Collective, bytes float64) (float64, bool) {
	if !s.applies(a, coll, false) {
		return 0, false
	}
	n, k, p := s.Ranks(), s.Nodes, s.RanksPerNode
	if n == 1 {
		return s.BaseLatencyUs, true // a copy, or nothing in place
	}
	perByte := func(bw float64) float64 { return 1 / (bw * 1e3) } // µs per byte at bw GB/s
	steps := func(all, across int, hop float64) float64 {
		return hop * (float64(all-across)*s.Intra.LatencyUs + float64(across)*s.Inter.LatencyUs)
	}
	ring := perByte(s.ringBW())
	t := s.BaseLatencyUs
	switch a {
	case algo.Ring:
		switch coll {
		case algo.AllReduce:
			t += steps(2*(n-1), 2*(k-1), 1)
		case algo.AllGather, algo.ReduceScatter:
			t += steps(n-1, k-1, 1)
		default: // broadcast, reduce: the chain
			t += steps(n-1, k-1, s.ChainHop)
		}
		return t + bytes*BusFactor(coll, n)*ring, true
	case algo.Tree:
		d := log2Ceil(n)
		level := steps(d, min(d, log2Ceil(k)), s.TreeHop)
		if coll == algo.AllReduce {
			return t + 2*level + 2*bytes*ring/s.TreeEfficiency, true
		}
		return t + level + bytes*ring/s.TreeEfficiency, true
	case algo.Direct:
		in := bytes
		if coll == algo.AllGather {
			in = bytes / float64(n)
		}
		// The rank that waits longest is on the smallest host (about n/k
		// ranks): its first message costs a step (across hosts if any of
		// its peers is off its host), each further one a peer's latency.
		local := n/k - 1
		remote := n - 1 - local
		if remote > 0 {
			t += s.Inter.LatencyUs + float64(local)*s.Intra.PeerUs + float64(remote-1)*s.Inter.PeerUs
		} else {
			t += s.Intra.LatencyUs + float64(local-1)*s.Intra.PeerUs
		}
		// Bytes: its copies to peers on its host, and a host's network
		// carries r(n-r) copies for its r ranks (r about n/k to p).
		t += float64(local) * in * perByte(s.Intra.BW)
		if k > 1 {
			r := float64(min(max(n/2, n/k), p))
			t += r * (float64(n) - r) * in * perByte(s.Inter.BW)
		}
		return t, true
	case algo.Hier:
		// Inside each host, k rings of p-1 steps, one after the other.
		intraSteps, crossSteps := k*(p-1), k-1
		if coll == algo.AllReduce {
			intraSteps, crossSteps = 2*k*(p-1), 2*(k-1)
			if k == 2 {
				crossSteps = 1 // the rail's two ranks swap their halves
			}
		}
		t += float64(intraSteps)*s.Intra.LatencyUs + float64(crossSteps)*s.Inter.LatencyUs
		// Bytes: reduce-scatter and all-gather inside (all-gather only
		// for the all-gather), each rail's share across at the host's
		// network bandwidth split over the p rails. The stages pipeline
		// (chunk c crosses hosts while chunk c+1 is reduced inside), so
		// the slower of the two sets the pace.
		inside, across := float64(p-1)/float64(p), float64(k-1)/float64(k)
		if coll == algo.AllReduce {
			inside, across = 2*inside, 2*across
		}
		return t + max(bytes*inside*perByte(s.Intra.BW), bytes*across*perByte(s.Inter.BW)), true
	case algo.Doubling:
		// log2 of the largest power of two in n swaps, two more hops
		// where n is not one (folding the rest in and handing them the
		// result); the last log2(k) swaps cross hosts. Each swap moves
		// the whole input.
		pow := 1 << (bits.Len(uint(n)) - 1)
		hops := bits.Len(uint(pow)) - 1
		if pow < n {
			hops += 2
		}
		t += steps(hops, min(hops, log2Ceil(k)), 1)
		return t + float64(hops)*bytes*ring, true
	}
	return 0, false
}
