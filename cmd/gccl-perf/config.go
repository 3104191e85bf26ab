package main

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/internal/launch"
	"github.com/gccl/gccl/internal/units"
)

// dataType is a -d choice: the name nccl-tests prints in the type column and
// the gccl type it benchmarks.
type dataType struct {
	name string
	dt   comm.DataType
}

// dataTypes is `-d all`, in nccl-tests' order and with its names.
var dataTypes = []dataType{
	{"int8", comm.Int8}, {"uint8", comm.Uint8}, {"int32", comm.Int32}, {"uint32", comm.Uint32},
	{"int64", comm.Int64}, {"uint64", comm.Uint64}, {"half", comm.Float16}, {"float", comm.Float32},
	{"double", comm.Float64}, {"bfloat16", comm.BFloat16}, {"f8e4m3", comm.Float8E4M3}, {"f8e5m2", comm.Float8E5M2},
}

// dataTypeAliases maps every accepted -d spelling (nccl-tests' names, NCCL's
// enum aliases and gccl's own) to the canonical entry.
var dataTypeAliases = map[string]comm.DataType{
	"char": comm.Int8, "int": comm.Int32, "float16": comm.Float16, "float32": comm.Float32,
	"float64": comm.Float64, "float8e4m3": comm.Float8E4M3, "float8e5m2": comm.Float8E5M2,
}

// redOp is a -o choice. kind opNone stands for the tests without a reduction.
type redOp struct {
	name string // the redop column: nccl-tests' name
	kind comm.OpKind
}

// opNone is the redop of tests that do not reduce.
const opNone comm.OpKind = 0

var noOp = redOp{"none", opNone}

// redOps is `-o all`, in nccl-tests' order and with its names; "mulsum" is
// NCCL's PreMulSum (ncclRedOpCreatePreMulSum).
var redOps = []redOp{
	{"sum", comm.OpSum}, {"prod", comm.OpProd}, {"max", comm.OpMax}, {"min", comm.OpMin},
	{"avg", comm.OpAvg}, {"mulsum", comm.OpPreMulSum},
}

// commOp is the gccl op rank passes. PreMulSum's scalar differs between
// ranks, as in nccl-tests, so a rank applying another rank's scalar shows up
// as wrong results.
func (o redOp) commOp(rank int) comm.Op {
	if o.kind == comm.OpPreMulSum {
		return comm.PreMulSum(preMulScalar(rank))
	}
	return comm.Op{Kind: o.kind}
}

// preMulScalar is rank's PreMulSum factor: 1 or 2, exact in every type.
func preMulScalar(rank int) float64 { return float64(1 + rank%2) }

// averageMode is -a: how per-rank times combine into the reported time.
type averageMode int

const (
	averageRank0 averageMode = iota
	averageMean
	averageMin
	averageMax
)

// config is a parsed command line.
type config struct {
	test       *collective
	ranks      int   // -g: in-process ranks (nccl-tests' GPUs per process)
	procs      int   // processes: -np, or the size of the job this process is a rank of
	minBytes   int64 // -b
	maxBytes   int64 // -e
	stepBytes  int64 // -i
	stepFactor int64 // -f; 0 or 1 means sizes grow by stepBytes
	iters      int   // -n
	warmup     int   // -w
	aggIters   int   // -m
	check      int   // -c: check passes per size; 0 disables checking
	blocking   bool  // -z 1
	average    averageMode
	dataTypes  []dataType // -d, with "all" expanded
	ops        []redOp    // -o, with "all" expanded; [noOp] for tests without one
	roots      []int      // -r, with "all" expanded; [-1] for tests without one
	jsonPath   string     // -J
	metrics    string     // --metrics: serve Prometheus metrics at this address during the run
	register   bool       // -R 1 or 2: buffers from comm.Comm.Alloc
	// -R 2 with -M device: the device buffers are windows every rank
	// registered, bound to a stream of each rank (stream-ordered calls).
	deviceWindows bool
	memory        memoryKind // -M: where the send and receive buffers live
	simulate      bool       // --simulate: print the cost model's table instead of running
	topoFile      string     // --topo-file, for --simulate
	nodes         int        // --nodes, for --simulate
	args          []string   // the command line, for the header and the JSON
	// rankArgs is args without -np: the command line of each rank that
	// -np launches.
	rankArgs []string
	help     bool // -h: print usage and do nothing else
}

// worldSize is the number of ranks in the whole run.
func (c *config) worldSize() int { return c.ranks * c.procs }

// memoryKind is a -M choice: the memory the benchmarked buffers are in.
type memoryKind int

const (
	memoryHost   memoryKind = iota // the Go heap (or comm.Comm.Alloc under -R)
	memoryDevice                   // GPU memory from package gpu
)

// memoryNames are -M's values, indexed by memoryKind; the JSON report
// records them too.
var memoryNames = [...]string{memoryHost: "host", memoryDevice: "device"}

func (m memoryKind) String() string { return memoryNames[m] }

func parseMemory(s string, dst *memoryKind) error {
	for kind, name := range memoryNames {
		if s == name {
			*dst = memoryKind(kind)
			return nil
		}
	}
	return fmt.Errorf("want %s or %s", memoryHost, memoryDevice)
}

// usageError is a command-line mistake: gccl-perf prints it with a usage
// hint and exits with status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// flagDef is one option; every option but -h takes a value, as in nccl-tests.
type flagDef struct {
	short, long string
	set         func(c *config, raw *rawChoices, v string) error
}

// rawChoices holds the flags that can only be resolved once every flag,
// -g included, has been read.
type rawChoices struct {
	datatype, op, root string
	procs, threads     int
	register           int // -R
}

var flagDefs = []flagDef{
	{"g", "ngpus", func(c *config, _ *rawChoices, v string) error { return parseInt(v, 1, &c.ranks) }},
	{"t", "nthreads", func(_ *config, r *rawChoices, v string) error { return parseInt(v, 1, &r.threads) }},
	{"np", "np", func(_ *config, r *rawChoices, v string) error { return parseInt(v, 1, &r.procs) }},
	{"b", "minbytes", func(c *config, _ *rawChoices, v string) error { return parseSizeInto(v, &c.minBytes) }},
	{"e", "maxbytes", func(c *config, _ *rawChoices, v string) error { return parseSizeInto(v, &c.maxBytes) }},
	{"i", "stepbytes", func(c *config, _ *rawChoices, v string) error { return parseSizeInto(v, &c.stepBytes) }},
	{"f", "stepfactor", func(c *config, _ *rawChoices, v string) error { return parseInt64(v, 0, &c.stepFactor) }},
	{"n", "iters", func(c *config, _ *rawChoices, v string) error { return parseInt(v, 1, &c.iters) }},
	{"w", "warmup_iters", func(c *config, _ *rawChoices, v string) error { return parseInt(v, 0, &c.warmup) }},
	{"m", "agg_iters", func(c *config, _ *rawChoices, v string) error { return parseInt(v, 1, &c.aggIters) }},
	{"c", "check", func(c *config, _ *rawChoices, v string) error { return parseInt(v, 0, &c.check) }},
	{"d", "datatype", func(_ *config, r *rawChoices, v string) error { r.datatype = v; return nil }},
	{"o", "op", func(_ *config, r *rawChoices, v string) error { r.op = v; return nil }},
	{"r", "root", func(_ *config, r *rawChoices, v string) error { r.root = v; return nil }},
	{"z", "blocking", func(c *config, _ *rawChoices, v string) error {
		var z int
		if err := parseChoice(v, 1, &z); err != nil {
			return err
		}
		c.blocking = z == 1
		return nil
	}},
	{"a", "average", func(c *config, _ *rawChoices, v string) error {
		var a int
		if err := parseChoice(v, 3, &a); err != nil {
			return err
		}
		c.average = averageMode(a)
		return nil
	}},
	{"J", "json", func(c *config, _ *rawChoices, v string) error { c.jsonPath = v; return nil }},
	{"R", "local_register", func(_ *config, r *rawChoices, v string) error { return parseChoice(v, 2, &r.register) }},
	{"M", "memory", func(c *config, _ *rawChoices, v string) error { return parseMemory(v, &c.memory) }},
	{"", "topo-file", func(c *config, _ *rawChoices, v string) error { c.topoFile = v; return nil }},
	{"", "nodes", func(c *config, _ *rawChoices, v string) error { return parseInt(v, 1, &c.nodes) }},
	{"", "metrics", func(c *config, _ *rawChoices, v string) error { c.metrics = v; return nil }},
}

func findFlag(name string, long bool) *flagDef {
	for i := range flagDefs {
		f := &flagDefs[i]
		if (long && f.long == name) || (!long && f.short == name) {
			return f
		}
	}
	return nil
}

// parseArgs parses the command line of a process that is not a rank of a
// multi-process job.
func parseArgs(args []string) (*config, error) { return parseArgsInJob(args, 1) }

// parseArgsInJob parses `<test> [flags]` (flags may also come before the
// test) for a process that is one of jobProcs ranks started by a launcher
// (1: no launcher). Options take a value as the next argument or attached:
// -b 8, -b8, --minbytes 8, --minbytes=8; -np takes its value the mpirun
// way, -np 2.
func parseArgsInJob(args []string, jobProcs int) (*config, error) {
	c := &config{
		ranks: 1, minBytes: 32 << 20, maxBytes: 32 << 20, stepBytes: 1 << 20,
		iters: 20, warmup: 5, aggIters: 1, check: 1, average: averageMean,
		args: args,
	}
	raw := &rawChoices{datatype: "float", op: "sum", root: "0", procs: 1, threads: 1}
	for i := 0; i < len(args); i++ {
		arg, first := args[i], i
		if arg == "-h" || arg == "--help" {
			c.help = true
			return c, nil
		}
		if arg == "--simulate" {
			c.simulate = true
			continue
		}
		if !strings.HasPrefix(arg, "-") || arg == "-" {
			if c.test != nil {
				return nil, usagef("unexpected argument %q: the test is already %s", arg, c.test.name)
			}
			t, err := lookupTest(arg)
			if err != nil {
				return nil, err
			}
			c.test = t
			c.rankArgs = append(c.rankArgs, arg)
			continue
		}
		var f *flagDef
		var value string
		hasValue := false
		switch {
		case strings.HasPrefix(arg, "--"):
			name, v, ok := strings.Cut(arg[2:], "=")
			f, value, hasValue = findFlag(name, true), v, ok
		case arg == "-np" || strings.HasPrefix(arg, "-np="):
			f = findFlag("np", false)
			value, hasValue = strings.CutPrefix(arg, "-np=")
		default:
			f = findFlag(arg[1:2], false)
			value, hasValue = arg[2:], len(arg) > 2
		}
		if f == nil {
			return nil, usagef("unknown flag %s", arg)
		}
		if !hasValue {
			if i+1 == len(args) {
				return nil, usagef("flag %s needs a value", flagName(f))
			}
			i++
			value = args[i]
		}
		if err := f.set(c, raw, value); err != nil {
			return nil, usagef("invalid value %q for %s: %v", value, flagName(f), err)
		}
		if f.short != "np" {
			c.rankArgs = append(c.rankArgs, args[first:i+1]...)
		}
	}
	if c.test == nil {
		return nil, usagef("missing test: one of %s", strings.Join(testNames(), ", "))
	}
	if err := c.resolve(raw, jobProcs); err != nil {
		return nil, err
	}
	return c, nil
}

func flagName(f *flagDef) string {
	if f.short == f.long {
		return "-" + f.short
	}
	return "-" + f.short + "/--" + f.long
}

// resolve checks the flags against each other and against the job this
// process belongs to (jobProcs processes; 1: none), and expands "all".
func (c *config) resolve(raw *rawChoices, jobProcs int) error {
	c.procs = raw.procs
	if jobProcs > 1 {
		if raw.procs > 1 {
			return usagef("-np %d inside a job of %d processes: the launcher has started the ranks already; drop -np", raw.procs, jobProcs)
		}
		c.procs = jobProcs
	}
	// Beyond these a typo would exhaust memory before anything could fail
	// cleanly.
	if raw.procs > launch.MaxProcsPerNode {
		return usagef("-np %d: at most %d processes per host", raw.procs, launch.MaxProcsPerNode)
	}
	if c.ranks > launch.MaxProcsPerNode {
		return usagef("-g %d: at most %d in-process ranks", c.ranks, launch.MaxProcsPerNode)
	}
	if c.procs > 1 && c.ranks > 1 {
		// nccl-tests' -g is GPUs per process; several in-process ranks per
		// process would need a second level of rank numbering.
		return usagef("-g %d with %d processes: several in-process ranks per process are not supported yet; use -g 1 with processes or -g N alone", c.ranks, c.procs)
	}
	c.register = raw.register > 0
	if c.register && c.memory == memoryDevice {
		if raw.register != 2 {
			// comm.Comm.Alloc's symmetric memory is host memory; device
			// buffers register only symmetrically (-R 2), as windows.
			return usagef("-R %d with -M device: device buffers register as symmetric windows (comm.Comm.RegisterDevice): use -R 2, or -R 0", raw.register)
		}
		c.register, c.deviceWindows = false, true
	}
	if raw.threads > 1 {
		return usagef("-t %d: only one thread drives the ranks; use -g N for N in-process ranks", raw.threads)
	}
	if c.minBytes > c.maxBytes {
		return usagef("invalid sizes: minbytes %d > maxbytes %d", c.minBytes, c.maxBytes)
	}
	if c.stepFactor > 1 && c.minBytes == 0 && c.maxBytes > 0 {
		return usagef("minbytes 0 never grows with a step factor: use -b 1 or more")
	}
	if c.stepFactor <= 1 && c.stepBytes <= 0 && c.minBytes < c.maxBytes {
		return usagef("stepbytes must be positive when minbytes < maxbytes")
	}
	var err error
	if c.dataTypes, err = parseDataTypes(raw.datatype); err != nil {
		return err
	}
	c.ops = []redOp{noOp}
	if c.test.reducing {
		if c.ops, err = parseOps(raw.op); err != nil {
			return err
		}
	}
	c.roots = []int{-1}
	if c.test.rooted {
		if c.roots, err = parseRoots(raw.root, c.worldSize()); err != nil {
			return err
		}
	}
	return nil
}

// lookupTest accepts a test name or its nccl-tests binary name.
func lookupTest(name string) (*collective, error) {
	base := strings.TrimSuffix(name, "_perf")
	for _, t := range collectives {
		if t.name == base {
			return t, nil
		}
	}
	return nil, usagef("unknown test %q: want one of %s", name, strings.Join(testNames(), ", "))
}

func testNames() []string {
	names := make([]string, len(collectives))
	for i, t := range collectives {
		names[i] = t.name
	}
	return names
}

func parseDataTypes(s string) ([]dataType, error) {
	if s == "all" {
		return dataTypes, nil
	}
	want, aliased := dataTypeAliases[s]
	for _, d := range dataTypes {
		if d.name == s || (aliased && d.dt == want) {
			return []dataType{d}, nil
		}
	}
	var names []string
	for _, d := range dataTypes {
		names = append(names, d.name)
	}
	return nil, usagef("unknown datatype %q: want one of %s, all (or aliases char, int, float16, float32, float64)", s, strings.Join(names, ", "))
}

func parseOps(s string) ([]redOp, error) {
	if s == "all" {
		return redOps, nil
	}
	if s == "premulsum" {
		s = "mulsum"
	}
	for _, o := range redOps {
		if o.name == s {
			return []redOp{o}, nil
		}
	}
	return nil, usagef("unknown op %q: want one of sum, prod, min, max, avg, mulsum (or premulsum), all", s)
}

// parseRoots accepts a root in [0, n), or "all" (or -1, nccl-tests' spelling
// of it) for every rank in turn.
func parseRoots(s string, n int) ([]int, error) {
	if s == "all" || s == "-1" {
		roots := make([]int, n)
		for r := range roots {
			roots[r] = r
		}
		return roots, nil
	}
	r, err := strconv.Atoi(s)
	if err != nil || r < 0 || r >= n {
		return nil, usagef("invalid root %q: want a rank in [0,%d) or all", s, n)
	}
	return []int{r}, nil
}

func parseSizeInto(s string, dst *int64) error {
	v, err := units.ParseBytes(s, 1<<40)
	if err == nil {
		*dst = v
	}
	return err
}

func parseInt64(s string, min int64, dst *int64) error {
	v, err := strconv.ParseInt(s, 0, 64)
	if err != nil {
		return errors.New("not an integer")
	}
	if v < min {
		return fmt.Errorf("must be at least %d", min)
	}
	*dst = v
	return nil
}

func parseInt(s string, min int, dst *int) error {
	var v int64
	if err := parseInt64(s, int64(min), &v); err != nil {
		return err
	}
	if v > math.MaxInt32 {
		return errors.New("too large")
	}
	*dst = int(v)
	return nil
}

// parseChoice reads an integer in [0, max].
func parseChoice(s string, max int, dst *int) error {
	if err := parseInt(s, 0, dst); err != nil || *dst > max {
		return fmt.Errorf("want an integer from 0 to %d", max)
	}
	return nil
}

// sizes lists the message sizes from min to max inclusive: multiplying by
// factor when it is above 1, else adding step, like nccl-tests' size loop.
// It stops rather than loop forever when a step would not grow the size.
func sizes(min, max, step, factor int64) []int64 {
	var out []int64
	for size := min; size <= max; {
		out = append(out, size)
		next := size + step
		if factor > 1 {
			next = size * factor
		}
		if next <= size || (factor > 1 && next/factor != size) { // no growth, or overflow
			break
		}
		size = next
	}
	return out
}
