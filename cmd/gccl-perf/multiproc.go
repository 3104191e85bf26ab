package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/gccl/gccl/bootstrap"
	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/internal/launch"
)

// launchedAsVar carries the command line of gccl-perf -np to the ranks it
// starts, whose own arguments lack -np, so that the header and the JSON
// show the command that reproduces the run.
const launchedAsVar = "GCCL_PERF_COMMAND_LINE"

// jobInfo is what the environment says about the multi-process job this
// process is a rank of.
type jobInfo struct {
	found     bool // a job of more than one process
	rank      int
	size      int
	localRank int   // the rank's index on its host: the device column
	err       error // a job is named, but its description is unusable
}

// detectJob reads the job from the environment exactly as comm.Init will:
// gccl-run's, torchrun's, Open MPI's, PMI's or Slurm's variables.
func detectJob() jobInfo {
	cfg, found, err := bootstrap.FromEnv()
	if err != nil {
		return jobInfo{err: err}
	}
	return jobInfo{found: found, rank: cfg.Rank, size: cfg.Size, localRank: cfg.LocalRank}
}

// launchRanks is -np N: it starts N processes of this very program with the
// same flags minus -np, each one rank of a job on this host, and waits for
// them. Rank 0 prints the results; the exit status is the first failing
// rank's.
func launchRanks(cfg *config, stdout, stderr io.Writer) int {
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "gccl-perf: finding this program to start its ranks: %v\n", err)
		return 1
	}
	// Ctrl-C stops the ranks too, through the launcher.
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(signals)
	job := &launch.Job{
		NProcs: cfg.procs,
		Argv:   append([]string{exe}, cfg.rankArgs...),
		Env:    append(os.Environ(), launchedAsVar+"="+commandLine(cfg.args)),
		// Untagged, so that rank 0's table reads exactly like nccl-tests';
		// ranks print nothing else on stdout, and their errors name them.
		TagOutput: false,
		Stdout:    stdout,
		Stderr:    stderr,
		Signals:   signals,
	}
	code, err := job.Run(context.Background())
	if err != nil {
		fmt.Fprintf(stderr, "gccl-perf: %v\n", err)
	}
	return code
}

// runAsRank is gccl-perf as one rank of a multi-process job: it joins the
// job, runs the benchmark with the other ranks, and, at rank 0, prints the
// results and writes the JSON. Every rank exits 1 when any rank found wrong
// values.
func runAsRank(cfg *config, env *environment, stdout, stderr io.Writer) int {
	ctx := context.Background()
	fail := func(format string, args ...any) int {
		fmt.Fprintf(stderr, "gccl-perf: rank %d: %s\n", env.job.rank, fmt.Sprintf(format, args...))
		return 1
	}
	// The device first, as in one process: without a usable one every
	// rank fails at once, before joining the job. Closed after the Comm.
	gpus, err := openGPUs(cfg, env.job.localRank, 1)
	if err != nil {
		return fail("%v", err)
	}
	defer closeGPUs(gpus)
	commCfg := env.commConfig
	c, err := comm.Init(ctx, &commCfg)
	if err != nil {
		return fail("joining the job: %v", err)
	}
	defer c.Close()
	stopMetrics, err := serveMetrics(cfg.metrics, env.job.localRank, []*comm.Comm{c}, stderr)
	if err != nil {
		return fail("%v", err)
	}
	defer stopMetrics()
	mine := describeRank(c, env.pid, env.hostname, env.job.localRank)
	if gpus != nil {
		mine.onGPU(gpus[0])
	}
	devices, err := exchangeRankInfo(ctx, c, mine)
	if err != nil {
		return fail("exchanging rank descriptions: %v", err)
	}
	cmdLine := commandLine(cfg.args)
	if env.launchedAs != "" {
		cmdLine = env.launchedAs
	}
	reporting := c.Rank() == 0
	out := io.Discard
	if reporting {
		out = stdout
	}
	res, err := runBenchmark(ctx, cfg, env, []*comm.Comm{c}, gpus, cmdLine, devices, out)
	if err != nil {
		return fail("%v", err)
	}
	status := exitStatus(res)
	if reporting && cfg.jsonPath != "" {
		if err := writeJSONFile(cfg.jsonPath, newJSONReport(cfg, env, cmdLine, devices, res)); err != nil {
			fmt.Fprintf(stderr, "gccl-perf: writing %s: %v\n", cfg.jsonPath, err)
			status = 1
		}
	}
	// No rank exits before rank 0 has reported: a rank exiting non-zero
	// makes the launcher stop the others, rank 0 included.
	if err := c.Barrier(ctx); err != nil {
		return fail("waiting for the other ranks to finish: %v", err)
	}
	return status
}
