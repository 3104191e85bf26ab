// Command gccl-run launches a gccl job the way torchrun does: it starts N
// ranks of a program on this node, gives each one torchrun's and gccl's
// environment variables, tags their output with the rank, stops the whole
// job when one rank fails, and exits with that rank's status.
//
//	gccl-run -np 4 ./trainer --epochs 3
//
// runs 4 ranks on this machine. On several nodes, start one gccl-run per
// node, by hand (--nnodes, --node-rank, --master-addr), under Slurm
// (srun --ntasks-per-node=1 gccl-run -np 4 prog) or under MPI
// (mpirun -npernode 1 gccl-run -np 4 prog). `gccl-run -h` explains the
// flags and the environment.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/gccl/gccl/internal/launch"
)

const usage = `Usage: gccl-run -np N [flags] prog [args...]

Starts N ranks of prog on this node and waits for them. Each rank gets
torchrun's variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK) and gccl's (GCCL_RANK,
GCCL_SIZE, GCCL_LOCAL_RANK, GCCL_LOCAL_SIZE, GCCL_BOOTSTRAP_ADDR,
GCCL_SECRET, GCCL_JOB_ID). Rank r of node i is global rank i*N + r.

Flags (flags end at the program's name; "--" ends them too):
  -np, --nproc-per-node N  ranks on this node (required)
  --nnodes K               nodes in the job (default 1, or from Slurm/MPI)
  --node-rank I            this node's index, 0..K-1 (or from Slurm/MPI)
  --master-addr A          host of global rank 0, which serves the
                           rendezvous (default 127.0.0.1 on one node)
  --master-port P          its port (default: a free port on one node;
                           otherwise 20000 + SLURM_JOB_ID % 10000 under
                           Slurm, else 29500)
  --secret-file F          read the job secret from F instead of GCCL_SECRET
  --tag-output=BOOL        prefix every output line with "[rank R] "
                           (default true)
  --timeout D              stop the job after D (90s, 1h, or seconds) and
                           exit 124
  --kill-grace D           time between SIGTERM and SIGKILL when stopping
                           ranks (default 3s; 0: SIGKILL at once)
  --keep-going             a failed rank does not stop the others, for
                           programs that go on without it (Comm.Shrink)
  --join H:P               start N newcomers to the running job whose
                           rendezvous is at H:P instead of a job (see
                           Growing)
  -v, --verbose            report what gccl-run does on stderr
  -h, --help               this text

Several nodes. Start one gccl-run per node, each with the same -np:
  by hand:  gccl-run -np 4 --nnodes 2 --node-rank I --master-addr node0 prog
  Slurm:    srun -N2 --ntasks-per-node=1 gccl-run -np 4 prog
            (nodes, node rank and master come from SLURM_NNODES, SLURM_NODEID
            and the first host of the node list)
  Open MPI: mpirun -npernode 1 -x GCCL_SECRET -x MASTER_ADDR gccl-run -np 4 prog
            (nodes and node rank come from OMPI_COMM_WORLD_SIZE and _RANK; the
            master address from --master-addr or MASTER_ADDR)
Flags given on the command line win over what gccl-run detects. MASTER_ADDR
and MASTER_PORT in the environment are used on several nodes only.

Secret. Ranks prove to the rendezvous that they belong to the job with a
128-bit secret. On one node gccl-run generates it (or uses GCCL_SECRET).
Several nodes must share it, so a multi-node job needs GCCL_SECRET set to
the same 32 hex characters on every node, or --secret-file:
  export GCCL_SECRET=$(openssl rand -hex 16)

Failures. When a rank exits non-zero or dies from a signal, gccl-run stops
the others (SIGTERM to each rank's process group, SIGKILL after the grace
period) and exits with that rank's status, or 128+signal. With --keep-going
the others run on, and gccl-run exits with the first failure's status once
every rank has ended: a lost rank is never hidden. SIGINT, SIGTERM
and SIGHUP are forwarded to the ranks; a second one kills them. When
gccl-run's own output is closed (gccl-run ... | head), it stops the ranks
the same way and exits 141, as SIGPIPE would. Ranks read stdin from
/dev/null.

Growing. A job whose ranks call Comm.Shrink and Comm.Grow after a loss
(run it with --keep-going) takes newcomers: processes started later with
  gccl-run --join H:P -np N prog [args...]
on any host, with the job's secret (GCCL_SECRET or --secret-file), where
H:P is the job's rendezvous (its ranks' GCCL_BOOTSTRAP_ADDR; give the job
--master-port to know it in advance). They get GCCL_JOIN=1, which makes
comm.Init join the survivors' Grow, and no rank: the rendezvous gives them
the ranks after the survivors'. Their output is tagged "[join I] ", and
the job's shared memory is left to the job.

Job end. When every rank has exited, whatever they left running in their
process groups (a helper started with "cmd &") is stopped too (SIGTERM,
then SIGKILL after the grace period), as Slurm does at the end of a step.
Output of such helpers is passed on until the job ends. Then the job's
leftover shared-memory segments (/dev/shm/gccl-<GCCL_JOB_ID>-*) are removed.

Output. Lines up to 1 MiB are written whole, so ranks never mix mid-line;
longer lines are written in 1 MiB pieces, which may interleave with other
ranks' lines. With --tag-output=false a rank's output passes through byte
for byte; with tagging, a last line without a newline gets one.

Exit status: 0 when every rank exited 0; the first failing rank's status;
124 on --timeout; 126 or 127 when prog cannot be run; 141 when gccl-run's
output was closed; 2 for a bad command line or job setup.
`

// exitUsage is the exit status for a bad command line or job setup.
const exitUsage = 2

func main() {
	// Ranks run in process groups of their own, so a terminal's Ctrl-C
	// reaches only gccl-run, which forwards it. Signals that gccl-run was
	// started ignoring (nohup, a shell's background job) stay ignored:
	// Notify would otherwise turn them back on.
	signals := make(chan os.Signal, 4)
	for _, sig := range []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		if !signal.Ignored(sig) {
			signal.Notify(signals, sig)
		}
	}
	// Without this a write to a closed stdout or stderr (gccl-run | head)
	// would kill gccl-run before it stops the ranks and cleans up; with it
	// the write fails with EPIPE, and Run stops the job and returns 141.
	// Notify, unlike Ignore, leaves the ranks SIGPIPE's default action.
	if !signal.Ignored(syscall.SIGPIPE) {
		signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	}
	os.Exit(run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr, signals))
}

// run is the whole program behind main, returning the exit status.
func run(args, environ []string, stdout, stderr io.Writer, signals <-chan os.Signal) int {
	opts, err := parseArgs(args)
	if err != nil {
		fmt.Fprintf(stderr, "gccl-run: %v\nRun gccl-run -h for usage.\n", err)
		return exitUsage
	}
	if opts.help {
		fmt.Fprint(stdout, usage)
		return 0
	}
	// The log and the ranks' stderr lines share one writer; its lock keeps
	// a log record from landing inside a rank's line.
	stderr = &lockedWriter{w: stderr}
	env := launch.EnvMap(environ)
	log := newLogger(stderr, opts.verbose, env["GCCL_DEBUG"])

	if opts.secretFile != "" {
		if opts.flags.Secret, err = launch.ReadSecretFile(opts.secretFile); err != nil {
			fmt.Fprintf(stderr, "gccl-run: %v\n", err)
			return exitUsage
		}
	}
	var job *launch.Job
	if opts.join != "" {
		job, err = newcomerJob(env, opts)
	} else {
		job, err = launch.DetectJob(env, opts.flags)
	}
	if err != nil {
		fmt.Fprintf(stderr, "gccl-run: %v\n", err)
		return exitUsage
	}
	job.Argv = opts.argv
	job.Env = environ
	job.TagOutput = opts.tagOutput
	job.Stdout, job.Stderr = stdout, stderr
	job.Timeout = opts.timeout
	job.KillGrace = opts.killGrace
	job.KeepGoing = opts.keepGoing
	if job.KillGrace == 0 {
		job.KillGrace = launch.NoKillGrace // Job's 0 would mean the default
	}
	job.Signals = signals
	job.Logger = log
	if err := job.Resolve(); err != nil {
		fmt.Fprintf(stderr, "gccl-run: %v\n", message(err))
		return exitUsage
	}
	// Never log the secret itself.
	log.Info("starting job", "program", job.Argv[0], "ranks_per_node", job.NProcs, "nodes", job.NNodes,
		"node_rank", job.NodeRank, "world_size", job.WorldSize(),
		"master", net.JoinHostPort(job.MasterAddr, strconv.Itoa(job.MasterPort)), "job_id", job.JobID, "from", job.Launcher)

	code, err := job.Run(context.Background())
	if errors.Is(err, launch.ErrBrokenPipe) {
		// Quiet, like any program stopped by SIGPIPE in a pipeline.
		log.Debug(message(err))
		return code
	}
	if err != nil {
		msg := message(err)
		if rerr := (*launch.RankError)(nil); errors.As(err, &rerr) && job.NProcs > 1 {
			if job.KeepGoing {
				msg += "; the other ranks went on (--keep-going)"
			} else {
				msg += "; stopped the other ranks"
			}
		}
		fmt.Fprintf(stderr, "gccl-run: %s\n", msg)
	}
	return code
}

// message is an error's text without the package prefix, which means
// nothing to a user of the command.
func message(err error) string {
	return strings.TrimPrefix(err.Error(), "launch: ")
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// newLogger logs what gccl-run does to stderr: warnings always, the job
// summary with GCCL_DEBUG=INFO, everything (down to the number of
// shared-memory segments cleaned up) with -v or GCCL_DEBUG=DEBUG or TRACE.
func newLogger(stderr io.Writer, verbose bool, gcclDebug string) *slog.Logger {
	level := slog.LevelWarn
	switch strings.ToUpper(strings.TrimSpace(gcclDebug)) {
	case "INFO":
		level = slog.LevelInfo
	case "DEBUG", "TRACE":
		level = slog.LevelDebug
	}
	if verbose {
		level = slog.LevelDebug
	}
	h := slog.NewTextHandler(prefixedWriter{stderr}, &slog.HandlerOptions{
		Level: level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{} // the ranks' own logs carry times
			}
			return a
		},
	})
	return slog.New(h)
}

// prefixedWriter starts each log record (one Write per record) with
// "gccl-run: ", telling the launcher's lines from the ranks'.
type prefixedWriter struct{ w io.Writer }

func (p prefixedWriter) Write(b []byte) (int, error) {
	if _, err := p.w.Write(append([]byte("gccl-run: "), b...)); err != nil {
		return 0, err
	}
	return len(b), nil
}
