// Package tune is gccl's cost model and tuner: for a system (bandwidth and
// latency inside a node and between nodes, ranks per node, nodes), a
// collective and a message size, it predicts the time of each algorithm
// (algo.Algorithm: ring, double binary tree, one exchange, hierarchical),
// picks the fastest, and sizes the pipeline chunk. The model is NCCL's
// (src/graph/tuning.cc): a base latency per call, a latency per pipeline
// step (intra-node or network, per algorithm), and the bytes each rank
// moves divided by the bus bandwidth the system offers.
//
// It is pure: the System comes from a topology graph (FromGraph: NCCL's
// schedules on GPU systems, for --simulate), from this machine class's
// calibration (ThisMachine, Host: gccl's host schedules, which the
// communicators' run-time choice uses through a Tuner), or from a test.
package tune

import (
	"errors"
	"fmt"
	"math"
	"math/bits"

	"github.com/gccl/gccl/algo"
)

// Link is what one level of the system offers.
type Link struct {
	// BW is the bus bandwidth in GB/s (10^9 bytes/s): inside a node, what a
	// ring over the node's ranks sustains per rank (its narrowest hop, times
	// the parallel rings the links allow); between nodes, the node's total
	// network bandwidth (rings cross nodes on every NIC at once).
	BW float64
	// LatencyUs is the time one pipeline step adds on this level, in µs.
	LatencyUs float64
	// PeerUs (HostSchedules only) is what each peer on this level adds to
	// the direct schedules (one exchange, direct all-gather), in µs: a
	// rank posts its input to every peer at once and then waits for each.
	PeerUs float64
}

// Schedules names whose schedules a system runs, and so what the model
// prices on it.
type Schedules uint8

const (
	// NCCLSchedules are NCCL's, to be set beside published nccl-tests
	// figures (FromGraph): the ring; the tree for all-reduce only, a chain
	// inside each node and a double binary tree across nodes; the
	// hierarchical all-reduce.
	NCCLSchedules Schedules = iota
	// HostSchedules are gccl's (ThisMachine, Host), as comm runs them:
	// the ring (a pipelined chain for broadcast and reduce); the double
	// binary tree over all ranks (all-reduce, broadcast, reduce); the
	// direct schedules (the one-exchange all-reduce, the direct
	// all-gather); the hierarchical all-reduce and all-gather on hosts of
	// equal size.
	HostSchedules
)

// System is the machine a job runs on, as the model sees it.
type System struct {
	Name         string
	Nodes        int
	RanksPerNode int
	Intra        Link // between ranks of one node
	Inter        Link // between nodes; unused with one node
	// BaseLatencyUs is the fixed cost of one collective call (launch,
	// argument checks, the first and last hand-off).
	BaseLatencyUs float64
	// TreeEfficiency is the share of the ring's bandwidth a tree reaches:
	// its ranks send to two children and receive from two, so links are
	// less evenly loaded (NCCL: 0.9).
	TreeEfficiency float64
	// MinChunkBytes and MaxChunkBytes bound the pipeline chunk.
	MinChunkBytes, MaxChunkBytes int64

	// Schedules says what runs on the system (NCCLSchedules by default).
	Schedules Schedules
	// UnevenRanks, when nonzero, is the job's number of ranks on Nodes
	// hosts that hold different numbers of them (RanksPerNode is then the
	// most on one host): the hierarchical schedules do not apply.
	UnevenRanks int
	// HostSchedules only, as NCCL keeps a latency per algorithm and link
	// kind (hwLat in tuning.cc): the latency of one level of the double
	// binary tree, and of one hop of the broadcast and reduce chain, as
	// multiples of a ring all-reduce step on the same link.
	TreeHop, ChainHop float64
	// HostSchedules only: the direct schedules run on at most
	// DirectMaxRanks ranks while each rank sends at most DirectMaxBytes
	// (n-1 copies of its input); zero: never.
	DirectMaxBytes int64
	DirectMaxRanks int
	// HostSchedules only: IntraNet says the ranks of a node talk over a
	// network transport (shared memory off): each message is a system
	// call and a wake-up on each side, which is where recursive doubling
	// (log2 n messages per rank) beats the one exchange (n-1). The
	// doubling runs only there, on one node, while each rank sends at most
	// DirectMaxBytes (log2 n copies of its input).
	IntraNet bool
}

// Ranks returns the number of ranks of the job.
func (s System) Ranks() int {
	if s.UnevenRanks > 0 {
		return s.UnevenRanks
	}
	return s.Nodes * s.RanksPerNode
}

// Validate reports a system the model cannot price.
func (s System) Validate() error {
	switch {
	case s.Nodes < 1 || s.RanksPerNode < 1:
		return fmt.Errorf("tune: system %q needs at least one node and one rank per node (got %d and %d)", s.Name, s.Nodes, s.RanksPerNode)
	case !(s.Intra.BW > 0) && s.RanksPerNode > 1:
		return fmt.Errorf("tune: system %q has no intra-node bandwidth", s.Name)
	case !(s.Inter.BW > 0) && s.Nodes > 1:
		return fmt.Errorf("tune: system %q has several nodes but no network bandwidth", s.Name)
	case s.Intra.LatencyUs < 0 || s.Inter.LatencyUs < 0 || s.BaseLatencyUs < 0:
		return fmt.Errorf("tune: system %q has a negative latency", s.Name)
	case s.TreeEfficiency < 0 || s.TreeEfficiency > 1:
		return fmt.Errorf("tune: system %q: tree efficiency %g outside [0, 1]", s.Name, s.TreeEfficiency)
	case s.UnevenRanks != 0 && (s.UnevenRanks < s.Nodes || s.UnevenRanks > s.Nodes*s.RanksPerNode):
		return fmt.Errorf("tune: system %q: %d ranks on %d hosts of at most %d", s.Name, s.UnevenRanks, s.Nodes, s.RanksPerNode)
	case s.Schedules == HostSchedules && (!(s.TreeHop >= 0) || !(s.ChainHop >= 0) || s.Intra.PeerUs < 0 || s.Inter.PeerUs < 0 || s.DirectMaxBytes < 0 || s.DirectMaxRanks < 0):
		return fmt.Errorf("tune: system %q has a negative host-schedule figure", s.Name)
	case s.Schedules > HostSchedules:
		return fmt.Errorf("tune: system %q: unknown schedules %d", s.Name, s.Schedules)
	}
	return nil
}

// Estimate is the model's figure for one algorithm.
type Estimate struct {
	Supported bool    // false: the algorithm does not apply (then the rest is zero)
	TimeUs    float64 // predicted time of one call
	AlgBW     float64 // GB/s: bytes / time
	BusBW     float64 // GB/s: AlgBW × the collective's bus factor (nccl-tests' busbw)
}

// Prediction is the model's answer for one collective call.
type Prediction struct {
	Algorithm   algo.Algorithm               // the fastest supported algorithm
	ChunkBytes  int64                        // the pipeline chunk for it
	Estimate                                 // the chosen algorithm's figures
	ByAlgorithm [algo.NumAlgorithms]Estimate // indexed by algorithm; unsupported ones are zero
}

// BusFactor is nccl-tests' factor from algorithm bandwidth to bus
// bandwidth: what each rank's busiest link carries per byte of the
// message, so that busbw compares with link speed at any rank count.
func BusFactor(coll algo.Collective, ranks int) float64 {
	n := float64(ranks)
	if ranks <= 1 {
		return 1
	}
	switch coll {
	case algo.AllReduce:
		return 2 * (n - 1) / n
	case algo.AllGather, algo.ReduceScatter, algo.AllToAll:
		return (n - 1) / n
	}
	return 1
}

// ErrUnsupported says the model has no schedule for a collective.
var ErrUnsupported = errors.New("tune: collective not modelled")

// Options narrow what the model may choose.
type Options struct {
	// Scaled says the op pre-scales its inputs (PreMulSum, float Avg), so
	// schedules that read an input twice (the one-exchange all-reduce) do
	// not apply.
	Scaled bool
	// Force, when set, is the only algorithm priced (GCCL_ALGO), at every
	// size, wherever its schedule exists (the direct schedules' size and
	// rank bounds aside); where it does not, the ring.
	Force algo.Algorithm
}

// Predict prices every algorithm for coll on bytes (nccl-tests' size: the
// all-gather's output, the reduce-scatter's input) and picks the fastest.
func Predict(sys System, coll algo.Collective, bytes int64) (Prediction, error) {
	return PredictWith(sys, coll, bytes, Options{})
}

// PredictWith is Predict within opt. It is the tuner's rule: Tuner.Choose
// returns the algorithm it picks.
func PredictWith(sys System, coll algo.Collective, bytes int64, opt Options) (Prediction, error) {
	var p Prediction
	if err := sys.Validate(); err != nil {
		return p, err
	}
	if bytes < 0 {
		return p, fmt.Errorf("tune: negative size %d", bytes)
	}
	switch coll {
	case algo.AllReduce, algo.AllGather, algo.ReduceScatter, algo.Broadcast, algo.Reduce:
	default:
		return p, fmt.Errorf("%w: %s", ErrUnsupported, coll)
	}
	best := -1
	for _, a := range pricingOrder {
		t, ok := sys.price(a, coll, float64(bytes), opt)
		if !ok {
			continue
		}
		e := Estimate{Supported: true, TimeUs: t}
		if t > 0 {
			e.AlgBW = float64(bytes) / t / 1e3 // bytes/µs = MB/s; /1e3 → GB/s
			e.BusBW = e.AlgBW * BusFactor(coll, sys.Ranks())
		}
		p.ByAlgorithm[a] = e
		if best < 0 || t < p.ByAlgorithm[best].TimeUs {
			best = int(a)
		}
	}
	if best < 0 {
		return p, fmt.Errorf("%w: no algorithm for %s on %q within %+v", ErrUnsupported, coll, sys.Name, opt)
	}
	p.Algorithm = algo.Algorithm(best)
	p.Estimate = p.ByAlgorithm[best]
	p.ChunkBytes = sys.chunk(p.Algorithm, bytes)
	return p, nil
}

// pricingOrder is the order algorithms are priced in; on a tie the first
// wins: the one exchange first (on one rank every schedule is a copy, and
// the exchange's plan is it; on two ranks it is the doubling's one swap),
// then the hierarchical schedule (on two hosts its all-gather takes as
// many steps as the ring, and crosses the network less), then the ring
// before the tree, as before, and the doubling last.
var pricingOrder = [...]algo.Algorithm{algo.Direct, algo.Hier, algo.Ring, algo.Tree, algo.Doubling}

// price returns time's figure for a within opt, or false where opt or the
// system's bounds rule it out.
func (s System) price(a algo.Algorithm, coll algo.Collective, bytes float64, opt Options) (float64, bool) {
	if opt.Force != 0 {
		// The forced algorithm where its schedule exists, else the ring.
		use := opt.Force
		if !s.applies(use, coll, opt.Scaled) {
			use = algo.Ring
		}
		if a != use {
			return 0, false
		}
		return s.time(a, coll, bytes)
	}
	if a == algo.Direct && (!s.applies(a, coll, opt.Scaled) || !s.directFits(coll, bytes)) {
		return 0, false
	}
	if a == algo.Doubling && !s.doublingFits(coll, bytes, opt.Scaled) {
		return 0, false
	}
	return s.time(a, coll, bytes)
}

// applies says whether a's schedule exists for coll on this system (scaled:
// for an op that pre-scales its inputs).
func (s System) applies(a algo.Algorithm, coll algo.Collective, scaled bool) bool {
	host := s.Schedules == HostSchedules
	switch a {
	case algo.Ring:
		switch coll {
		case algo.AllReduce, algo.AllGather, algo.ReduceScatter, algo.Broadcast, algo.Reduce:
			return true
		}
	case algo.Tree:
		return s.TreeEfficiency > 0 && (coll == algo.AllReduce || host && (coll == algo.Broadcast || coll == algo.Reduce))
	case algo.Direct:
		return host && (coll == algo.AllReduce && !scaled || coll == algo.AllGather)
	case algo.Hier:
		even := s.Nodes > 1 && s.RanksPerNode > 1 && s.UnevenRanks == 0
		return even && (coll == algo.AllReduce || host && coll == algo.AllGather)
	case algo.Doubling:
		return host && coll == algo.AllReduce && !scaled
	}
	return false
}

// ringBW is the bandwidth a ring over the whole job sustains: the intra-node
// ring, and across nodes also the network.
func (s System) ringBW() float64 {
	bw := math.Inf(1)
	if s.RanksPerNode > 1 {
		bw = s.Intra.BW
	}
	if s.Nodes > 1 {
		bw = min(bw, s.Inter.BW)
	}
	return bw
}

// time returns the predicted µs of algorithm a, or false when a does not
// apply to coll on this system.
func (s System) time(a algo.Algorithm, coll algo.Collective, bytes float64) (float64, bool) {
	if s.Schedules == HostSchedules {
		return s.hostTime(a, coll, bytes)
	}
	n, k, ppn := s.Ranks(), s.Nodes, s.RanksPerNode
	if n == 1 {
		// One rank copies (or does nothing in place): the call's cost.
		return s.BaseLatencyUs, a == algo.Ring
	}
	perByte := func(bw float64) float64 { return 1 / (bw * 1e3) } // µs per byte at bw GB/s
	switch a {
	case algo.Ring:
		var steps, interSteps int
		switch coll {
		case algo.AllReduce:
			steps, interSteps = 2*(n-1), 2*(k-1)
		case algo.AllGather, algo.ReduceScatter:
			steps, interSteps = n-1, k-1
		default: // broadcast, reduce: a pipelined chain through every rank
			steps, interSteps = n-1, k-1
		}
		lat := s.BaseLatencyUs + float64(steps-interSteps)*s.Intra.LatencyUs + float64(interSteps)*s.Inter.LatencyUs
		return lat + bytes*BusFactor(coll, n)*perByte(s.ringBW()), true
	case algo.Tree:
		// All-reduce only (as in NCCL): reduce up the trees, broadcast down.
		// Inside a node a chain of ppn ranks; across nodes log2(k) levels.
		if coll != algo.AllReduce || s.TreeEfficiency == 0 {
			return 0, false
		}
		lat := s.BaseLatencyUs + 2*(float64(ppn-1)*s.Intra.LatencyUs+float64(log2Ceil(k))*s.Inter.LatencyUs)
		// Every byte goes up and comes down: 2 × bytes over the ring's links
		// at the tree's efficiency.
		return lat + 2*bytes*perByte(s.ringBW()*s.TreeEfficiency), true
	case algo.Hier:
		// Only meaningful with several nodes of several ranks.
		if coll != algo.AllReduce || k < 2 || ppn < 2 {
			return 0, false
		}
		intra := 2*float64(ppn-1)*s.Intra.LatencyUs + 2*bytes*float64(ppn-1)/float64(ppn)*perByte(s.Intra.BW)
		// Each rank all-reduces its 1/ppn share across nodes on its own
		// rail: the node's network bandwidth split over ppn rails.
		share := bytes / float64(ppn)
		inter := 2*float64(k-1)*s.Inter.LatencyUs + share*2*float64(k-1)/float64(k)*perByte(s.Inter.BW/float64(ppn))
		return s.BaseLatencyUs + intra + inter, true
	}
	return 0, false
}

// chunk sizes the pipeline chunk: large enough that moving it takes several
// times the per-step latency (so latency hides behind transfer), a power of
// two within [MinChunkBytes, MaxChunkBytes], and no larger than a rank's
// share of the message.
func (s System) chunk(a algo.Algorithm, bytes int64) int64 {
	lo, hi := s.MinChunkBytes, s.MaxChunkBytes
	if lo <= 0 {
		lo = 4 << 10
	}
	if hi < lo {
		hi = max(lo, 4<<20)
	}
	if s.RanksPerNode <= 1 && s.Nodes <= 1 {
		return lo
	}
	// The links the ring uses set it: the intra-node ones only with several
	// ranks per node (with one, FromGraph leaves Intra zero), the network
	// only with several nodes.
	bw, lat := s.ringBW(), 0.0
	if s.RanksPerNode > 1 {
		lat = s.Intra.LatencyUs
	}
	if s.Nodes > 1 {
		lat = max(lat, s.Inter.LatencyUs)
	}
	const hideFactor = 4 // transfer time per chunk ≥ 4 × step latency
	// Compared as floats: a huge bandwidth would overflow the conversion.
	share := bytes / int64(max(s.Ranks(), 1))
	want := share
	if w := bw * 1e3 * lat * hideFactor; w < float64(share) {
		want = int64(w)
	}
	c := int64(1) << uint(bits.Len64(uint64(max(want-1, 0))))
	return min(max(c, lo), hi)
}

func log2Ceil(n int) int {
	if n <= 1 {
		return 0
	}
	return bits.Len(uint(n - 1))
}
