package tune

import (
	"fmt"
	"math"
	"strings"
	"sync"

	"github.com/gccl/gccl/algo"
)

// Tuner is the model's choice for one job layout, worked out once (as NCCL
// fills its tuning tables when a communicator starts): for each collective
// with a choice, the sizes at which the fastest algorithm changes. Choose
// looks them up; it allocates nothing and takes no lock.
type Tuner struct {
	sys    System
	force  algo.Algorithm
	tables [numTables][]region
}

// region: the algorithm for every size up to and including upTo bytes
// (Choose's units), after the previous region's.
type region struct {
	upTo int64
	alg  algo.Algorithm
}

// The collectives with a choice.
const (
	tabAllReduce       = iota
	tabAllReduceScaled // ops that pre-scale their inputs
	tabAllGather
	tabBroadcast
	tabReduce
	numTables
)

var tableColl = [numTables]algo.Collective{algo.AllReduce, algo.AllReduce, algo.AllGather, algo.Broadcast, algo.Reduce}

// searchMax is the largest size the tables resolve: above it (4 PiB) the
// last algorithm holds.
const searchMax = 1 << 52

var (
	tunersMu sync.Mutex
	tuners   = map[tunerKey]*Tuner{}
)

type tunerKey struct {
	sys   System
	force algo.Algorithm
}

// NewTuner returns the tuner for sys; force (GCCL_ALGO; 0: none) is then
// the algorithm of every collective whose schedule it has, and the ring
// that of the others that have a choice. Tuners are immutable and shared:
// one is made per system.
func NewTuner(sys System, force algo.Algorithm) (*Tuner, error) {
	key := tunerKey{sys, force}
	tunersMu.Lock()
	t := tuners[key]
	tunersMu.Unlock()
	if t != nil {
		return t, nil
	}
	if err := sys.Validate(); err != nil {
		return nil, err
	}
	if force != 0 && force != algo.Ring && force != algo.Tree && force != algo.Hier && force != algo.Doubling {
		return nil, fmt.Errorf("tune: cannot force %v (want ring, tree, hier or doubling)", force)
	}
	t = &Tuner{sys: sys, force: force}
	for i := range t.tables {
		t.tables[i] = t.build(tableColl[i], i == tabAllReduceScaled)
	}
	tunersMu.Lock()
	if len(tuners) >= 256 {
		clear(tuners) // a process that sees many layouts keeps no history
	}
	tuners[key] = t
	tunersMu.Unlock()
	return t, nil
}

// System returns the system the tuner prices.
func (t *Tuner) System() System { return t.sys }

// Choose returns the algorithm for coll on bytes, each rank's input (the
// all-gather's block, not nccl-tests' size); scaled says the op pre-scales
// its inputs. It is PredictWith's choice (Options{Scaled: scaled, Force:
// the tuner's}), looked up.
func (t *Tuner) Choose(coll algo.Collective, bytes int, scaled bool) algo.Algorithm {
	var tab int
	switch coll {
	case algo.AllReduce:
		tab = tabAllReduce
		if scaled {
			tab = tabAllReduceScaled
		}
	case algo.AllGather:
		tab = tabAllGather
	case algo.Broadcast:
		tab = tabBroadcast
	case algo.Reduce:
		tab = tabReduce
	case algo.AllToAll:
		return algo.Pairwise
	case algo.Gather, algo.Scatter:
		return algo.Direct
	default: // reduce-scatter
		return algo.Ring
	}
	rs := t.tables[tab]
	for i := range rs {
		if int64(bytes) <= rs[i].upTo {
			return rs[i].alg
		}
	}
	return rs[len(rs)-1].alg
}

// unit is the model's bytes (nccl-tests' size) per byte of Choose's.
func (t *Tuner) unit(coll algo.Collective) float64 {
	if coll == algo.AllGather {
		return float64(t.sys.Ranks())
	}
	return 1
}

// pick is PredictWith's choice for bytes of Choose's units.
func (t *Tuner) pick(coll algo.Collective, bytes int64, scaled bool) algo.Algorithm {
	opt := Options{Scaled: scaled, Force: t.force}
	b := float64(bytes) * t.unit(coll)
	best, bestT := algo.Algorithm(0), 0.0
	for _, a := range pricingOrder {
		if tm, ok := t.sys.price(a, coll, b, opt); ok && (best == 0 || tm < bestT) {
			best, bestT = a, tm
		}
	}
	if best == 0 {
		return algo.Ring // unreachable: the ring applies to every collective with a table
	}
	return best
}

// build returns the regions of PredictWith's choice for coll.
func (t *Tuner) build(coll algo.Collective, scaled bool) []region {
	return walk(func(bytes int64) algo.Algorithm { return t.pick(coll, bytes, scaled) })
}

// walk returns the regions of choice over the sizes from 0: each runs
// while the choice stays, found by doubling and then bisecting. It relies
// on each algorithm's sizes forming one interval, as they do in the model,
// whose times are linear in the size within each schedule's bounds.
func walk(choice func(bytes int64) algo.Algorithm) []region {
	var rs []region
	for lo := int64(0); ; {
		a := choice(lo)
		// a holds at last; step up until it does not (or searchMax).
		last, step := lo, int64(1)
		for last+step <= searchMax && choice(last+step) == a {
			last += step
			step *= 2
		}
		hi := last + step
		if hi > searchMax {
			if choice(searchMax) == a {
				return append(rs, region{upTo: math.MaxInt64, alg: a})
			}
			hi = searchMax
		}
		// a at last, not at hi: bisect.
		for hi-last > 1 {
			mid := last + (hi-last)/2
			if choice(mid) == a {
				last = mid
			} else {
				hi = mid
			}
		}
		rs = append(rs, region{upTo: last, alg: a})
		lo = last + 1
	}
}

var tableNames = [numTables]string{"AllReduce", "AllReduce (pre-scaled op)", "AllGather (per-rank block)", "Broadcast", "Reduce"}

// String prints the tables: each algorithm with the largest size it runs
// at, in Choose's units ("AllReduce: Direct <= 21845 B, Ring; ...").
func (t *Tuner) String() string {
	var b strings.Builder
	for i, rs := range t.tables {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(tableNames[i] + ": " + formatRegions(rs))
	}
	return b.String()
}

func formatRegions(rs []region) string {
	var b strings.Builder
	for j, r := range rs {
		if j > 0 {
			b.WriteString(", ")
		}
		b.WriteString(r.alg.String())
		if r.upTo != math.MaxInt64 {
			fmt.Fprintf(&b, " <= %d B", r.upTo)
		}
	}
	return b.String()
}
