// Command gccl-topo reports the topology gccl sees: a `nvidia-smi topo -m`
// style matrix of the GPUs and NICs with the path class between each pair
// and each device's CPU and NUMA affinity, the NUMA nodes with their CPUs
// and memory, the NICs with speed and NUMA node, and with --ranks the ring
// and trees gccl would build for that layout.
//
//	gccl-topo                          # this machine (sysfs, RDMA devices, NVML)
//	gccl-topo --topo-file sys.xml      # an NCCL topology file instead
//	gccl-topo --ranks 16 --nodes 2     # plus rings and trees for 2 nodes x 8 ranks
//	gccl-topo --dump out.xml           # also write the graph as NCCL XML
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/gccl/gccl/topo"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

func run(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs := flag.NewFlagSet("gccl-topo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	topoFile := fs.String("topo-file", "", "read this NCCL topology XML instead of inspecting this machine (default $"+topo.EnvTopoFile+")")
	dump := fs.String("dump", "", "write the topology as NCCL XML to this file")
	ranks := fs.Int("ranks", 0, "show the ring and trees for this many ranks in all")
	nodes := fs.Int("nodes", 1, "spread --ranks over this many identical nodes")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: gccl-topo [--topo-file F] [--dump F] [--ranks N [--nodes K]]\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gccl-topo: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	env := func(k string) string {
		switch k {
		case topo.EnvTopoFile:
			if *topoFile != "" {
				return *topoFile
			}
		case topo.EnvTopoDumpFile:
			if *dump != "" {
				return *dump
			}
		}
		return getenv(k)
	}
	g, err := topo.Load(env, topo.Detector{})
	if err != nil {
		fmt.Fprintf(stderr, "gccl-topo: %v\n", err)
		return 1
	}
	source := "this machine"
	if f := env(topo.EnvTopoFile); f != "" {
		source = f
	}
	var layout *layout
	if *ranks != 0 || *nodes != 1 {
		l, err := newLayout(g, *ranks, *nodes)
		if err != nil {
			fmt.Fprintf(stderr, "gccl-topo: %v\n", err)
			return 2
		}
		layout = l
	}
	if err := report(stdout, source, g, layout); err != nil {
		fmt.Fprintf(stderr, "gccl-topo: %v\n", err)
		return 1
	}
	return 0
}
