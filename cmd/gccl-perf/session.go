package main

import (
	"context"
	"fmt"
	"io"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/gpu"
)

// runInProcess runs the benchmark on -g ranks inside this process.
func runInProcess(cfg *config, env *environment, stdout, stderr io.Writer) int {
	// Devices first: without a usable one, -M device fails before any
	// rank exists. Closed last, after the communicators.
	gpus, err := openGPUs(cfg, 0, cfg.ranks)
	if err != nil {
		fmt.Fprintf(stderr, "gccl-perf: %v\n", err)
		return 1
	}
	defer closeGPUs(gpus)
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
	stopMetrics, err := serveMetrics(cfg.metrics, 0, comms, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "gccl-perf: %v\n", err)
		return 1
	}
	defer stopMetrics()
	devices := make([]rankInfo, len(comms))
	for i, c := range comms {
		devices[i] = describeRank(c, env.pid, env.hostname, i)
		if gpus != nil {
			devices[i].onGPU(gpus[i])
		}
	}
	cmdLine := commandLine(cfg.args)
	res, err := runBenchmark(context.Background(), cfg, env, comms, gpus, cmdLine, devices, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "gccl-perf: %v\n", err)
		return 1
	}
	if cfg.jsonPath != "" {
		if err := writeJSONFile(cfg.jsonPath, newJSONReport(cfg, env, cmdLine, devices, res)); err != nil {
			fmt.Fprintf(stderr, "gccl-perf: writing %s: %v\n", cfg.jsonPath, err)
			return 1
		}
	}
	return exitStatus(res)
}

// runBenchmark runs the benchmark on comms, this process's ranks (whose
// devices are gpus under -M device), and prints nccl-tests' header, table
// and footer to out: the reporting process's stdout, io.Discard on the
// other processes of a job.
func runBenchmark(ctx context.Context, cfg *config, env *environment, comms []*comm.Comm, gpus []*gpu.Device,
	cmdLine string, devices []rankInfo, out io.Writer) (*results, error) {
	writeHeader(out, headerInfo{commandLine: cmdLine, cfg: cfg, devices: devices})
	writeTableHeader(out)
	res := &results{}
	rn := newRunner(ctx, cfg, env, comms, gpus)
	if err := rn.benchmark(func(r *row) {
		writeRow(out, r)
		res.rows = append(res.rows, *r)
	}); err != nil {
		return nil, err
	}
	res.outOfBounds, res.avgBusBW = summarize(res.rows)
	writeFooter(out, res.outOfBounds, res.avgBusBW)
	return res, nil
}

// exitStatus is 1 when a check found wrong values, else 0.
func exitStatus(res *results) int {
	if res.outOfBounds > 0 {
		return 1
	}
	return 0
}
