package main

import (
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/gccl/gccl/algo/tune"
	"github.com/gccl/gccl/comm"
)

// runSimulate prints the table the cost model (algo/tune) predicts, in
// nccl-tests' format; nothing is run. With --topo-file, for the GPU system
// of an NCCL topology file under NCCL's schedules, to be set beside
// published nccl-tests results; without, for -g/-np ranks on each of
// --nodes hosts of this machine class under gccl's host schedules: the
// algorithm column is then what the communicators' tuner runs.
func runSimulate(cfg *config, stdout, stderr io.Writer) int {
	var sys tune.System
	if cfg.topoFile == "" {
		if cfg.worldSize() < 2 {
			fmt.Fprintf(stderr, "gccl-perf: --simulate needs --topo-file <NCCL topology XML>, or -g/-np <ranks per host> for this machine class's host transports\nRun gccl-perf -h for usage.\n")
			return 2
		}
		var err error
		// As Init prices it: a host's ranks over TCP when shared memory is off.
		intra := "shm"
		if os.Getenv("GCCL_SHM_DISABLE") == "1" {
			intra = "tcp"
		}
		if sys, err = tune.HostOver(intra, slices.Repeat([]int{cfg.worldSize()}, max(cfg.nodes, 1))...); err != nil {
			fmt.Fprintf(stderr, "gccl-perf: --simulate: %v\n", err)
			return 2
		}
	}
	coll, ok := tune.CollectiveByName(cfg.test.name)
	if !ok {
		fmt.Fprintf(stderr, "gccl-perf: --simulate: the cost model does not cover %s\n", cfg.test.name)
		return 2
	}
	status := 0
	for _, dt := range cfg.dataTypes {
		for _, op := range cfg.ops {
			for _, root := range cfg.roots {
				spec := tune.TableSpec{
					Collective: coll, MinBytes: cfg.minBytes, MaxBytes: cfg.maxBytes,
					StepFactor: cfg.stepFactor, StepBytes: cfg.stepBytes,
					Type: dt.name, TypeSize: dt.dt.Size(), RedOp: op.name, Root: root,
					// As comm decides: these ops pre-scale their inputs.
					Scaled: op.kind == comm.OpPreMulSum || op.kind == comm.OpAvg && dt.dt.IsFloat(),
				}
				if op.kind == opNone {
					spec.RedOp = "none"
				}
				var err error
				if cfg.topoFile == "" {
					err = tune.SimulateSystem(stdout, sys, spec)
				} else {
					err = tune.Simulate(stdout, tune.SimOptions{TopoFile: cfg.topoFile, Nodes: max(cfg.nodes, 1), TableSpec: spec})
				}
				if err != nil {
					fmt.Fprintf(stderr, "gccl-perf: --simulate: %v\n", err)
					status = 1
				}
			}
		}
	}
	return status
}
