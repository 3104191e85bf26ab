// Command gccl-perf is gccl's nccl-tests: it measures the latency and
// bandwidth of gccl's collectives and checks their results, with nccl-tests'
// flags, table, bus-bandwidth factors and footer, so that its numbers read
// like (and compare with) NCCL's.
//
//	gccl-perf all_reduce -np 2 -b 8 -e 64M -f 4
//
// runs an all-reduce on 2 processes of this host, which talk over shared
// memory, for every power of four from 8 bytes to 64 MiB. -g N runs N ranks
// inside one process instead; under gccl-run, torchrun, mpirun or srun,
// gccl-perf is one rank of the launcher's job. `gccl-perf plot` charts -J
// result files. `gccl-perf -h` lists the tests and flags.
package main

import (
	"bufio"
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

const usage = `Usage: gccl-perf <test> [flags]
       gccl-perf plot <file.json>... [-o chart.svg] [flags]

Measures gccl's collectives like nccl-tests measures NCCL's.

Tests: all_reduce, all_gather, reduce_scatter, broadcast, reduce, alltoall,
       gather, scatter, sendrecv (rank r sends to r+1 and receives from r-1).
       nccl-tests binary names (all_reduce_perf, ...) work too.

Ranks: -g N runs N ranks inside this process. -np N starts N processes of
gccl-perf on this host, one rank each, talking over shared memory (or TCP
with GCCL_SHM_DISABLE=1); rank 0 prints the results. Started by gccl-run,
torchrun, mpirun or srun, gccl-perf is one rank of that job instead (with
-g 1, the default).

Flags take a value: -b 8, -b8, --minbytes 8 or --minbytes=8. Sizes accept
K, M and G suffixes (powers of 1024).
  -g, --ngpus <n>            in-process ranks (default 1, at most 65536)
  -np <n>                    processes to start, one rank each (default 1,
                             at most 65536); -g must then be 1
  -b, --minbytes <size>      smallest size (default 32M)
  -e, --maxbytes <size>      largest size (default 32M); every rank on this
                             host needs twice this in memory, which must fit
                             in the host's RAM
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
  -J, --json <file>          also write the results as JSON (rank 0 writes
                             it, with every rank's transport to each peer)
  -R, --local_register <n>   1 or 2: buffers from comm.Comm.Alloc (symmetric
                             memory that peers on the host map, so large
                             all-reduces read peers' buffers directly);
                             with -M device, 2: the device buffers are
                             windows every rank registered
                             (comm.Comm.RegisterDevice), bound to a stream:
                             calls are queued on it, stream-ordered, and
                             each loop ends with a stream synchronize;
                             0: Go heap (default)
  -M, --memory <kind>        host: buffers in host memory (default);
                             device: in GPU memory (package gpu; needs the
                             CUDA driver; with -R 2 only), each rank's on
                             device (its index among its host's ranks)
                             modulo the number of GPUs
  -t, --nthreads <n>         accepted for compatibility; must be 1
  --metrics <addr>           serve Prometheus metrics (package metrics) at
                             http://<addr>/metrics while the test runs, e.g.
                             :9400; rank r of a multi-process job on a
                             host serves on the port plus its local rank
  --simulate                 print the cost model's predicted table for the
                             system of --topo-file <NCCL topology XML> on
                             --nodes <k> such hosts (default 1); runs nothing
  -h, --help                 this text

gccl-perf plot draws bus bandwidth and time against size from -J files
(one series per file, out-of-place solid, in-place dashed); gccl-perf plot
-h lists its flags.

Exit status: 0 when every check passed, 1 when results were wrong or a
collective or a rank failed, 2 for a bad command line.
`

func main() {
	env, err := hostEnvironment()
	if err != nil {
		fmt.Fprintf(os.Stderr, "gccl-perf: %v\n", err)
		os.Exit(2)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, env))
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
	// job is the multi-process job this process is a rank of, if any.
	job jobInfo
	// launchedAs is the command line of the gccl-perf -np that started this
	// rank, for the header and the JSON; "" when started otherwise.
	launchedAs string
	// physMem is the host's memory in bytes, which the buffers must fit
	// in; 0: unknown, not checked.
	physMem uint64
	// afterCheckOp, a test hook, sees (and may corrupt) rank's output of a
	// check pass before it is compared.
	afterCheckOp func(rank int, inPlace bool, out []byte)
}

func hostEnvironment() (*environment, error) {
	hostname, err := os.Hostname()
	if err != nil {
		hostname = "unknown"
	}
	env := &environment{
		hostname:   hostname,
		pid:        os.Getpid(),
		cpuModel:   cpuModel("/proc/cpuinfo"),
		numCPU:     runtime.NumCPU(),
		goVersion:  runtime.Version(),
		now:        time.Now,
		timer:      wallClock,
		job:        detectJob(),
		launchedAs: os.Getenv(launchedAsVar),
		physMem:    physicalMemory(),
	}
	if spec := os.Getenv(testFaultVar); spec != "" {
		fault, err := parseTestFault(spec)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: %v", testFaultVar, spec, err)
		}
		env.afterCheckOp = fault.hook(os.Stderr)
	}
	return env, nil
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
	if len(args) > 0 && args[0] == "plot" {
		return runPlot(args[1:], stdout, stderr)
	}
	jobProcs := 1
	if env.job.found {
		jobProcs = env.job.size
	}
	cfg, err := parseArgsInJob(args, jobProcs)
	if err != nil {
		fmt.Fprintf(stderr, "gccl-perf: %v\nRun gccl-perf -h for usage.\n", err)
		return 2
	}
	if cfg.help {
		fmt.Fprint(stdout, usage)
		return 0
	}
	if err := checkHostMemory(cfg, env.job.found, env.physMem); err != nil {
		fmt.Fprintf(stderr, "gccl-perf: %v\nRun gccl-perf -h for usage.\n", err)
		return 2
	}
	if env.job.err != nil {
		fmt.Fprintf(stderr, "gccl-perf: the environment names a multi-process job that cannot be joined: %v\n", env.job.err)
		return 1
	}
	switch {
	case cfg.simulate:
		return runSimulate(cfg, stdout, stderr)
	case env.job.found:
		return runAsRank(cfg, env, stdout, stderr)
	case cfg.procs > 1:
		return launchRanks(cfg, stdout, stderr)
	}
	return runInProcess(cfg, env, stdout, stderr)
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
