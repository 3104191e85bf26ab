package main

import (
	"fmt"
	"io"

	"github.com/gccl/gccl/algo/tune"
)

// runSimulate prints the table the cost model (algo/tune) predicts for the
// system of an NCCL topology file, in nccl-tests' format, so the model can
// be set beside published nccl-tests results; nothing is run.
func runSimulate(cfg *config, stdout, stderr io.Writer) int {
	if cfg.topoFile == "" {
		fmt.Fprintf(stderr, "gccl-perf: --simulate needs --topo-file <NCCL topology XML>\nRun gccl-perf -h for usage.\n")
		return 2
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
				}
				if op.kind == opNone {
					spec.RedOp = "none"
				}
				if err := tune.Simulate(stdout, tune.SimOptions{TopoFile: cfg.topoFile, Nodes: max(cfg.nodes, 1), TableSpec: spec}); err != nil {
					fmt.Fprintf(stderr, "gccl-perf: --simulate: %v\n", err)
					status = 1
				}
			}
		}
	}
	return status
}
