package main

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/gccl/gccl/comm"
)

func TestParseArgsDefaults(t *testing.T) {
	c, err := parseArgs([]string{"all_reduce"})
	if err != nil {
		t.Fatal(err)
	}
	// nccl-tests' defaults.
	if c.test.name != "all_reduce" || c.ranks != 1 || c.minBytes != 32<<20 || c.maxBytes != 32<<20 ||
		c.stepBytes != 1<<20 || c.stepFactor != 0 || c.iters != 20 || c.warmup != 5 || c.aggIters != 1 ||
		c.check != 1 || c.blocking || c.average != averageMean || c.jsonPath != "" {
		t.Errorf("defaults: %+v", c)
	}
	if len(c.dataTypes) != 1 || c.dataTypes[0].dt != comm.Float32 || c.dataTypes[0].name != "float" {
		t.Errorf("default datatype %v", c.dataTypes)
	}
	if len(c.ops) != 1 || c.ops[0].kind != comm.OpSum {
		t.Errorf("default op %v", c.ops)
	}
	if !reflect.DeepEqual(c.roots, []int{-1}) {
		t.Errorf("all_reduce roots %v, want [-1]", c.roots)
	}
}

func TestParseArgsForms(t *testing.T) {
	for _, args := range [][]string{
		{"all_gather", "-g", "3", "-b", "8", "-e", "64K", "-f", "4", "-n", "7", "-w", "2", "-m", "3", "-c", "0", "-z", "1", "-a", "3", "-J", "out.json"},
		{"-g3", "-b8", "-e64K", "-f4", "-n7", "-w2", "-m3", "-c0", "-z1", "-a3", "-Jout.json", "all_gather_perf"},
		{"all_gather", "--ngpus", "3", "--minbytes=8", "--maxbytes", "64k", "--stepfactor=4", "--iters", "7",
			"--warmup_iters=2", "--agg_iters", "3", "--check", "0", "--blocking=1", "--average", "3", "--json", "out.json", "-np", "1", "-t", "1"},
	} {
		c, err := parseArgs(args)
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		if c.test.name != "all_gather" || c.ranks != 3 || c.minBytes != 8 || c.maxBytes != 64<<10 || c.stepFactor != 4 ||
			c.iters != 7 || c.warmup != 2 || c.aggIters != 3 || c.check != 0 || !c.blocking ||
			c.average != averageMax || c.jsonPath != "out.json" {
			t.Errorf("%q: %+v", args, c)
		}
	}
}

func TestParseArgsExpandsAll(t *testing.T) {
	c, err := parseArgs(strings.Fields("reduce -g 3 -d all -o all -r all"))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.dataTypes) != len(comm.DataTypes) {
		t.Errorf("-d all gave %d types, want %d", len(c.dataTypes), len(comm.DataTypes))
	}
	var ops []string
	for _, o := range c.ops {
		ops = append(ops, o.name)
	}
	if got := strings.Join(ops, ","); got != "sum,prod,max,min,avg,mulsum" {
		t.Errorf("-o all gave %s", got)
	}
	if !reflect.DeepEqual(c.roots, []int{0, 1, 2}) {
		t.Errorf("-r all gave roots %v", c.roots)
	}
	// nccl-tests spells "all roots" -1 as well.
	if c, err := parseArgs(strings.Fields("broadcast -g 2 -r -1")); err != nil || !reflect.DeepEqual(c.roots, []int{0, 1}) {
		t.Errorf("-r -1: %v, %v", c, err)
	}
	// Tests without an op or a root print none and -1 whatever the flags say.
	c, err = parseArgs(strings.Fields("all_gather -g 2 -o all -r all"))
	if err != nil || len(c.ops) != 1 || c.ops[0].name != "none" || !reflect.DeepEqual(c.roots, []int{-1}) {
		t.Errorf("all_gather with -o all -r all: ops %v roots %v err %v", c.ops, c.roots, err)
	}
}

func TestParseArgsDataTypeNames(t *testing.T) {
	for name, want := range map[string]comm.DataType{
		"int8": comm.Int8, "char": comm.Int8, "uint8": comm.Uint8, "int32": comm.Int32, "int": comm.Int32,
		"uint32": comm.Uint32, "int64": comm.Int64, "uint64": comm.Uint64, "half": comm.Float16,
		"float16": comm.Float16, "float": comm.Float32, "float32": comm.Float32, "double": comm.Float64,
		"float64": comm.Float64, "bfloat16": comm.BFloat16, "f8e4m3": comm.Float8E4M3, "f8e5m2": comm.Float8E5M2,
	} {
		c, err := parseArgs([]string{"all_reduce", "-d", name})
		if err != nil {
			t.Errorf("-d %s: %v", name, err)
			continue
		}
		if c.dataTypes[0].dt != want {
			t.Errorf("-d %s gave %v, want %v", name, c.dataTypes[0].dt, want)
		}
	}
	c, err := parseArgs(strings.Fields("all_reduce -o premulsum"))
	if err != nil || c.ops[0].kind != comm.OpPreMulSum || c.ops[0].name != "mulsum" {
		t.Errorf("-o premulsum: %v, %v", c, err)
	}
}

func TestParseArgsErrors(t *testing.T) {
	for _, tc := range []struct {
		args string
		want string // a fragment of the message
	}{
		{"", "missing test"},
		{"-g 2", "missing test"},
		{"all_reduc", `unknown test "all_reduc"`},
		{"all_reduce broadcast", "unexpected argument"},
		{"all_reduce -x 1", "unknown flag -x"},
		{"all_reduce --bogus=1", "unknown flag --bogus"},
		{"all_reduce -b", "flag -b/--minbytes needs a value"},
		{"all_reduce -b 12Q", `invalid value "12Q" for -b/--minbytes`},
		{"all_reduce -b -8", "must not be negative"},
		{"all_reduce -b 1.5", "whole number"},
		{"all_reduce -b 64K -e 8K", "minbytes 65536 > maxbytes 8192"},
		{"all_reduce -b 0 -e 8 -f 2", "never grows"},
		{"all_reduce -b 8 -e 64 -i 0", "stepbytes must be positive"},
		{"all_reduce -n 0", "must be at least 1"},
		{"all_reduce -g 0", "must be at least 1"},
		{"all_reduce -g two", "not an integer"},
		{"all_reduce -z 2", "from 0 to 1"},
		{"all_reduce -a 4", "from 0 to 3"},
		{"all_reduce -d float128", `unknown datatype "float128"`},
		{"all_reduce -o xor", `unknown op "xor"`},
		{"broadcast -g 2 -r 2", `invalid root "2": want a rank in [0,2)`},
		{"broadcast -r x", `invalid root "x"`},
		{"all_reduce -np 4 -g 2", "-g 2 with 4 processes: several in-process ranks per process are not supported yet"},
		{"all_reduce -R 3", "from 0 to 2"},
		{"broadcast -np 2 -r 2", `invalid root "2": want a rank in [0,2)`},
		{"all_reduce -t 2", "only one thread"},
		{"all_reduce -M gpu", `invalid value "gpu" for -M/--memory: want host or device`},
		{"all_reduce -M device -R 1", "-R 1 with -M device: device buffers register as symmetric windows"},
		{"all_reduce --local_register=1 --memory=device", "use -R 2, or -R 0"},
	} {
		_, err := parseArgs(strings.Fields(tc.args))
		var ue *usageError
		if !errors.As(err, &ue) {
			t.Errorf("%q: error %v, want a usage error", tc.args, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %q, want it to say %q", tc.args, err, tc.want)
		}
	}
}

func TestParseArgsMemory(t *testing.T) {
	for args, want := range map[string]memoryKind{
		"all_reduce":                      memoryHost,
		"all_reduce -M host":              memoryHost,
		"all_reduce -M device":            memoryDevice,
		"all_reduce -Mdevice -g 2":        memoryDevice,
		"all_reduce --memory device -R 0": memoryDevice,
		"all_reduce --memory=host -R 1":   memoryHost,
	} {
		c, err := parseArgs(strings.Fields(args))
		if err != nil {
			t.Errorf("%q: %v", args, err)
			continue
		}
		if c.memory != want {
			t.Errorf("%q: memory %v, want %v", args, c.memory, want)
		}
	}
	// -R 2 with -M device: device windows, not comm.Comm.Alloc's memory.
	for args, want := range map[string]bool{
		"all_reduce -M device -R 2":                     true,
		"all_reduce --local_register=2 --memory=device": true,
		"all_reduce -M device":                          false,
		"all_reduce -R 2":                               false,
	} {
		c, err := parseArgs(strings.Fields(args))
		if err != nil {
			t.Errorf("%q: %v", args, err)
			continue
		}
		if c.deviceWindows != want || c.deviceWindows && c.register {
			t.Errorf("%q: device windows %v (register %v), want %v", args, c.deviceWindows, c.register, want)
		}
	}
	// The ranks that -np starts get -M too.
	c, err := parseArgs(strings.Fields("all_reduce -np 2 -M device"))
	if err != nil || strings.Join(c.rankArgs, " ") != "all_reduce -M device" {
		t.Errorf("-np 2 -M device: rank arguments %q, err %v", c.rankArgs, err)
	}
}

func TestParseArgsHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"all_reduce", "--help"}, {"-h", "not-a-test"}} {
		c, err := parseArgs(args)
		if err != nil || !c.help {
			t.Errorf("%q: help %v, err %v", args, c != nil && c.help, err)
		}
	}
}

func TestSizes(t *testing.T) {
	for _, tc := range []struct {
		min, max, step, factor int64
		want                   []int64
	}{
		{32 << 20, 32 << 20, 1 << 20, 0, []int64{32 << 20}},
		{8, 64 << 10, 1 << 20, 4, []int64{8, 32, 128, 512, 2048, 8192, 32768}},
		{8, 128, 1 << 20, 2, []int64{8, 16, 32, 64, 128}},
		{1 << 20, 4 << 20, 1 << 20, 0, []int64{1 << 20, 2 << 20, 3 << 20, 4 << 20}},
		{100, 350, 100, 1, []int64{100, 200, 300}}, // a factor of 1 is disabled, as in nccl-tests
		{0, 0, 0, 2, []int64{0}},
		{5, 10, 0, 0, []int64{5}},                    // no growth: stop instead of looping
		{1 << 62, 1<<63 - 1, 0, 4, []int64{1 << 62}}, // overflow: stop
	} {
		if got := sizes(tc.min, tc.max, tc.step, tc.factor); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("sizes(%d, %d, %d, %d) = %v, want %v", tc.min, tc.max, tc.step, tc.factor, got, tc.want)
		}
	}
}

// The ranks that -np starts get the command line without -np, whatever its
// spelling, and everything else unchanged.
func TestParseArgsRankArgs(t *testing.T) {
	for _, args := range []string{
		"all_reduce -np 2 -b 8 -e8K",
		"-np=2 all_reduce -b 8 -e8K",
		"all_reduce -b 8 --np 2 -e8K",
		"all_reduce -b 8 -e8K --np=2",
	} {
		c, err := parseArgs(strings.Fields(args))
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		if got := strings.Join(c.rankArgs, " "); got != "all_reduce -b 8 -e8K" {
			t.Errorf("%q: rank arguments %q", args, got)
		}
		if c.procs != 2 || c.worldSize() != 2 {
			t.Errorf("%q: %d processes, world of %d; want 2 and 2", args, c.procs, c.worldSize())
		}
	}
}

// A rank of a job takes its process count from the job, so that roots
// range over the whole job, and refuses flags that would start ranks again
// or put several ranks in it.
func TestParseArgsInJob(t *testing.T) {
	c, err := parseArgsInJob(strings.Fields("broadcast -r all"), 3)
	if err != nil {
		t.Fatal(err)
	}
	if c.procs != 3 || c.ranks != 1 || !reflect.DeepEqual(c.roots, []int{0, 1, 2}) {
		t.Errorf("in a job of 3: procs %d, ranks %d, roots %v", c.procs, c.ranks, c.roots)
	}
	for _, tc := range []struct{ args, want string }{
		{"all_reduce -np 3", "-np 3 inside a job of 3 processes"},
		{"all_reduce -g 2", "-g 2 with 3 processes"},
		{"reduce -r 3", `invalid root "3": want a rank in [0,3)`},
	} {
		_, err := parseArgsInJob(strings.Fields(tc.args), 3)
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q in a job of 3: error %v, want a usage error saying %q", tc.args, err, tc.want)
		}
	}
}

func TestParseArgsRankLimits(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{"all_reduce -np 65537", "-np 65537: at most 65536 processes per host"},
		{"all_reduce -np 2147483647", "-np 2147483647: at most 65536 processes per host"},
		{"all_reduce -g 65537", "-g 65537: at most 65536 in-process ranks"},
	} {
		_, err := parseArgs(strings.Fields(tc.args))
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want a usage error saying %q", tc.args, err, tc.want)
		}
	}
}
