// Command gccl-perf is gccl's nccl-tests: it measures the latency and
// bandwidth of gccl's collectives and checks their results, with nccl-tests'
// flags, table, bus-bandwidth factors and footer, so that its numbers read
// like (and compare with) NCCL's.
//
//	gccl-perf all_reduce -g 4 -b 8 -e 128M -f 2
//
// runs an all-reduce on 4 in-process ranks for every power of two from 8
// bytes to 128 MiB. `gccl-perf -h` lists the tests and flags.
package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/gccl/gccl/comm"
)

// version is the gccl version the reports name.
const version = "0.1.0-dev"

// transportName is how ranks reach each other: today always within the process.
const transportName = "INPROC"

const usage = `Usage: gccl-perf <test> [flags]

Measures gccl's collectives like nccl-tests measures NCCL's.

Tests: all_reduce, all_gather, reduce_scatter, broadcast, reduce, alltoall,
       gather, scatter, sendrecv (rank r sends to r+1 and receives from r-1).
       nccl-tests binary names (all_reduce_perf, ...) work too.

Flags take a value: -b 8, -b8, --minbytes 8 or --minbytes=8. Sizes accept
K, M and G suffixes (powers of 1024).
  -g, --ngpus <n>            in-process ranks (default 1)
  -b, --minbytes <size>      smallest size (default 32M)
  -e, --maxbytes <size>      largest size (default 32M)
  -i, --stepbytes <size>     increment between sizes (default 1M)
  -f, --stepfactor <n>       multiply sizes by n instead (default: disabled)
  -n, --iters <n>            timed iterations per size (default 20)
  -w, --warmup_iters <n>     untimed iterations at the largest and the
                             smallest size before measuring (default 5)
  -m, --agg_iters <n>        operations per timed iteration (default 1)
  -c, --check <n>            check passes per size; 0: no checking (default 1)
  -d, --datatype <type>      int8, char, uint8, int32, int, uint32, int64,
                             uint64, half, float16, float, float32, double,
                             float64, bfloat16, f8e4m3, f8e5m2 or all
                             (default float)
  -o, --op <op>              sum, prod, min, max, avg, mulsum (premulsum)
                             or all (default sum)
  -r, --root <rank>          root of broadcast, reduce, gather, scatter,
                             or all (default 0)
  -z, --blocking <0|1>       0: issue async requests, then wait for them;
                             1: blocking calls (default 0)
  -a, --average <0|1|2|3>    reported time: rank 0's, the mean, the minimum
                             or the maximum across ranks (default 1)
  -J, --json <file>          also write the results as JSON
  -t, --nthreads <n>         accepted for compatibility; must be 1
  -np <n>                    processes; only 1 until the shared-memory
                             transport comes (use -g for ranks)
  -h, --help                 this text

Exit status: 0 when every check passed, 1 when results were wrong or a
collective failed, 2 for a bad command line.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, hostEnvironment()))
}

// environment is what a run takes from outside its flags: the machine's
// identity for the reports, the clock, and the communicator settings.
// Tests pin all of it.
type environment struct {
	hostname   string
	pid        int
	cpuModel   string
	numCPU     int
	goVersion  string
	now        func() time.Time // the report's date
	timer      timeSource
	commConfig comm.Config
	// afterCheckOp, a test hook, sees (and may corrupt) rank's output of a
	// check pass before it is compared.
	afterCheckOp func(rank int, inPlace bool, out []byte)
}

func hostEnvironment() *environment {
	hostname, err := os.Hostname()
	if err != nil {
		hostname = "unknown"
	}
	return &environment{
		hostname:  hostname,
		pid:       os.Getpid(),
		cpuModel:  cpuModel("/proc/cpuinfo"),
		numCPU:    runtime.NumCPU(),
		goVersion: runtime.Version(),
		now:       time.Now,
		timer:     wallClock,
	}
}

// cpuModel returns the first "model name" of a /proc/cpuinfo-style file,
// or the architecture where there is none.
func cpuModel(path string) string {
	if f, err := os.Open(path); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			key, value, ok := strings.Cut(sc.Text(), ":")
			if ok && strings.TrimSpace(key) == "model name" {
				return strings.TrimSpace(value)
			}
		}
	}
	return runtime.GOARCH
}

// run is the whole program behind main, returning the exit status.
func run(args []string, stdout, stderr io.Writer, env *environment) int {
	cfg, err := parseArgs(args)
	if err != nil {
		fmt.Fprintf(stderr, "gccl-perf: %v\nRun gccl-perf -h for usage.\n", err)
		return 2
	}
	if cfg.help {
		fmt.Fprint(stdout, usage)
		return 0
	}
	commandLine := commandLine(args)
	writeHeader(stdout, headerInfo{commandLine: commandLine, cfg: cfg, hostname: env.hostname, pid: env.pid, transport: transportName})

	commCfg := env.commConfig
	comms, err := comm.InitLocal(cfg.ranks, &commCfg)
	if err != nil {
		fmt.Fprintf(stderr, "gccl-perf: creating %d ranks: %v\n", cfg.ranks, err)
		return 1
	}
	defer func() {
		for _, c := range comms {
			c.Close()
		}
	}()

	writeTableHeader(stdout)
	var rows []row
	rn := &runner{ctx: context.Background(), cfg: cfg, env: env, comms: comms}
	if err := rn.benchmark(func(r *row) {
		writeRow(stdout, r)
		rows = append(rows, *r)
	}); err != nil {
		fmt.Fprintf(stderr, "gccl-perf: %v\n", err)
		return 1
	}
	outOfBounds, avgBusBW := summarize(rows)
	writeFooter(stdout, outOfBounds, avgBusBW)

	if cfg.jsonPath != "" {
		rep := &jsonReport{
			Library: "gccl", Version: version, Test: cfg.test.name, CommandLine: commandLine,
			Ranks: cfg.ranks, Transport: transportName, Hostname: env.hostname,
			CPUModel: env.cpuModel, NumCPU: env.numCPU, GoVersion: env.goVersion,
			GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, Date: env.now().Format(time.RFC3339),
			Settings: jsonConfig{
				MinBytes: cfg.minBytes, MaxBytes: cfg.maxBytes, StepBytes: cfg.stepBytes, StepFactor: cfg.stepFactor,
				Iters: cfg.iters, WarmupIters: cfg.warmup, AggIters: cfg.aggIters, Check: cfg.check,
				Blocking: cfg.blocking, Average: cfg.average.String(),
			},
			Rows: rows, OutOfBounds: outOfBounds, AvgBusBW: avgBusBW, Passed: outOfBounds == 0,
		}
		if err := writeJSONFile(cfg.jsonPath, rep); err != nil {
			fmt.Fprintf(stderr, "gccl-perf: writing %s: %v\n", cfg.jsonPath, err)
			return 1
		}
	}
	if outOfBounds > 0 {
		return 1
	}
	return 0
}

// commandLine renders the invocation for the header, quoting arguments
// that a shell would split.
func commandLine(args []string) string {
	parts := []string{"gccl-perf"}
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n\"'\\$*?") {
			a = strconv.Quote(a)
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}
