package tune

import (
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strings"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/internal/units"
	"github.com/gccl/gccl/topo"
)

// Row is one line of a predicted nccl-tests table.
type Row struct {
	Bytes      int64
	Count      int64 // elements
	Type       string
	RedOp      string
	Root       int
	Algorithm  algo.Algorithm
	ChunkBytes int64
	TimeUs     float64
	AlgBW      float64 // GB/s
	BusBW      float64 // GB/s
}

// TableSpec says which sizes to predict, with nccl-tests' meanings: sizes
// from MinBytes to MaxBytes, multiplied by StepFactor (when > 1) or else
// increased by StepBytes.
type TableSpec struct {
	Collective         algo.Collective
	MinBytes, MaxBytes int64
	StepFactor         int64
	StepBytes          int64
	Type               string // nccl-tests' name: "float", "half", "int32", ...
	TypeSize           int
	RedOp              string // "sum", ...; "none" for collectives without one
	Root               int
	// Force prices only this algorithm ("ring", "tree", "hier": see
	// algo.ParseAlgorithm); "" lets
	// the model choose, as the tuner does.
	Force string
	// Scaled says the op pre-scales its inputs (PreMulSum, float Avg),
	// which rules out the schedules that read an input twice.
	Scaled bool
}

// Table predicts every size of spec on sys.
func Table(sys System, spec TableSpec) ([]Row, error) {
	if spec.TypeSize <= 0 {
		return nil, fmt.Errorf("tune: element size %d", spec.TypeSize)
	}
	if spec.MinBytes < 0 || spec.MaxBytes < spec.MinBytes {
		return nil, fmt.Errorf("tune: sizes %d..%d", spec.MinBytes, spec.MaxBytes)
	}
	if spec.StepFactor <= 1 && spec.StepBytes <= 0 {
		return nil, fmt.Errorf("tune: step factor %d and step bytes %d make no progress", spec.StepFactor, spec.StepBytes)
	}
	var forced algo.Algorithm
	if spec.Force != "" {
		var ok bool
		if forced, ok = algo.ParseAlgorithm(spec.Force); !ok {
			return nil, fmt.Errorf("tune: unknown algorithm %q (want ring, tree, hier or doubling)", spec.Force)
		}
	}
	var rows []Row
	for size := spec.MinBytes; size <= spec.MaxBytes; {
		count := size / int64(spec.TypeSize)
		bytes := count * int64(spec.TypeSize)
		p, err := PredictWith(sys, spec.Collective, bytes, Options{Scaled: spec.Scaled})
		if err != nil {
			return nil, err
		}
		alg, est := p.Algorithm, p.Estimate
		if forced != 0 {
			alg, est = forced, p.ByAlgorithm[forced]
			if !est.Supported {
				return nil, fmt.Errorf("tune: %s does not apply to %s on %d node(s) of %d rank(s)", alg, spec.Collective, sys.Nodes, sys.RanksPerNode)
			}
		}
		rows = append(rows, Row{Bytes: bytes, Count: count, Type: spec.Type, RedOp: spec.RedOp, Root: spec.Root,
			Algorithm: alg, ChunkBytes: sys.chunk(alg, bytes), TimeUs: est.TimeUs, AlgBW: est.AlgBW, BusBW: est.BusBW})
		// A step past math.MaxInt64 ends the table: a product that wraps
		// can land on a larger positive size, a wrapped sum on a negative.
		next := size + spec.StepBytes
		if spec.StepFactor > 1 {
			if size > math.MaxInt64/spec.StepFactor {
				break
			}
			next = size * spec.StepFactor
			if size == 0 {
				next = 1
			}
		}
		if next <= size {
			break
		}
		size = next
	}
	return rows, nil
}

// WriteTable prints rows as nccl-tests (and gccl-perf) print results, one
// prediction in both the out-of-place and in-place columns and N/A for the
// error count, after comment lines that say it is a prediction and for
// which system.
func WriteTable(w io.Writer, sys System, rows []Row) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Predicted by gccl's cost model, not measured: %s\n", sys.Name)
	fmt.Fprintf(&b, "#  %d node(s) x %d rank(s); intra %.1f GB/s, %.1f us/step", sys.Nodes, sys.RanksPerNode, sys.Intra.BW, sys.Intra.LatencyUs)
	if sys.Nodes > 1 {
		fmt.Fprintf(&b, "; network %.1f GB/s per node, %.1f us/step", sys.Inter.BW, sys.Inter.LatencyUs)
	}
	fmt.Fprintf(&b, "; base %.1f us\n#\n", sys.BaseLatencyUs)
	header := []string{
		fmt.Sprintf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place", "", "", "", "", ""),
		fmt.Sprintf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s  %5s  %8s",
			"size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong", "algo", "chunk"),
		fmt.Sprintf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s  %5s  %8s",
			"(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", "", "(B)"),
	}
	for _, l := range header {
		b.WriteString(strings.TrimRight(l, " "))
		b.WriteByte('\n')
	}
	var sum float64
	for _, r := range rows {
		half := fmt.Sprintf("  %7s  %6.2f  %6.2f  %5s", units.FormatMicros(r.TimeUs), r.AlgBW, r.BusBW, "N/A")
		fmt.Fprintf(&b, "%12d  %12d  %8s  %6s  %6d%s%s  %5s  %8d\n", r.Bytes, r.Count, r.Type, r.RedOp, r.Root, half, half, r.Algorithm.Name(), r.ChunkBytes)
		sum += r.BusBW
	}
	avg := 0.0
	if len(rows) > 0 {
		avg = sum / float64(len(rows))
	}
	fmt.Fprintf(&b, "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : %.6g\n#\n", avg)
	_, err := io.WriteString(w, b.String())
	return err
}

// SimOptions is `gccl-perf --simulate`: the table for a topology file.
type SimOptions struct {
	TopoFile     string // NCCL topology XML of one host
	Nodes        int    // identical hosts (--nodes); 0 means 1
	RanksPerNode int    // 0: one per GPU
	TableSpec
}

// Simulate reads o.TopoFile, builds the system and writes the predicted
// table to w.
func Simulate(w io.Writer, o SimOptions) error {
	g, err := topo.ReadFile(o.TopoFile)
	if err != nil {
		return err
	}
	nodes := o.Nodes
	if nodes == 0 {
		nodes = 1
	}
	sys, err := FromGraph(filepath.Base(o.TopoFile), g, nodes, o.RanksPerNode)
	if err != nil {
		return err
	}
	return SimulateSystem(w, sys, o.TableSpec)
}

// SimulateSystem writes the predicted table of spec on sys to w: for
// Host's systems, the algorithm column is what the communicators' tuner
// runs.
func SimulateSystem(w io.Writer, sys System, spec TableSpec) error {
	rows, err := Table(sys, spec)
	if err != nil {
		return err
	}
	return WriteTable(w, sys, rows)
}

// CollectiveByName maps an nccl-tests test name ("all_reduce",
// "all_gather", "reduce_scatter", "broadcast", "reduce") to the collective
// the model prices; false for tests it does not model (alltoall, gather,
// scatter, sendrecv).
func CollectiveByName(test string) (algo.Collective, bool) {
	switch test {
	case "all_reduce":
		return algo.AllReduce, true
	case "all_gather":
		return algo.AllGather, true
	case "reduce_scatter":
		return algo.ReduceScatter, true
	case "broadcast":
		return algo.Broadcast, true
	case "reduce":
		return algo.Reduce, true
	}
	return 0, false
}
