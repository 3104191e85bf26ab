package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/gccl/gccl/internal/launch"
	"github.com/gccl/gccl/internal/units"
)

// options is a parsed command line.
type options struct {
	flags      launch.Flags // -np and the job shape; nil/"" where not given
	secretFile string
	tagOutput  bool
	timeout    time.Duration
	killGrace  time.Duration // 0: SIGKILL at once
	keepGoing  bool
	join       string // host:port of a running job's rendezvous: start newcomers
	verbose    bool
	help       bool
	argv       []string // the program and its arguments
}

// parseArgs parses gccl-run's flags, which end at the first argument that
// is not a flag (or at "--"): the rest is the program and its arguments,
// passed through untouched.
func parseArgs(args []string) (*options, error) {
	o := &options{tagOutput: true, killGrace: launch.DefaultKillGrace}
	fs := flag.NewFlagSet("gccl-run", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned; usage is ours
	var nnodes, nodeRank, masterPort int
	// torchrun's spellings are accepted too, so its command lines carry over.
	for _, name := range []string{"np", "nproc-per-node", "nproc_per_node"} {
		fs.IntVar(&o.flags.NProcs, name, 0, "")
	}
	fs.IntVar(&nnodes, "nnodes", 0, "")
	for _, name := range []string{"node-rank", "node_rank"} {
		fs.IntVar(&nodeRank, name, 0, "")
	}
	for _, name := range []string{"master-addr", "master_addr"} {
		fs.StringVar(&o.flags.MasterAddr, name, "", "")
	}
	for _, name := range []string{"master-port", "master_port"} {
		fs.IntVar(&masterPort, name, 0, "")
	}
	fs.StringVar(&o.secretFile, "secret-file", "", "")
	fs.Var((*valueBool)(&o.tagOutput), "tag-output", "")
	fs.Var((*seconds)(&o.timeout), "timeout", "")
	fs.Var((*seconds)(&o.killGrace), "kill-grace", "")
	fs.BoolVar(&o.keepGoing, "keep-going", false, "")
	fs.StringVar(&o.join, "join", "", "")
	fs.BoolVar(&o.verbose, "v", false, "")
	fs.BoolVar(&o.verbose, "verbose", false, "")
	fs.BoolVar(&o.help, "h", false, "")
	fs.BoolVar(&o.help, "help", false, "")

	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.help {
		return o, nil
	}
	// Only flags the user gave may override what DetectJob finds.
	var shapeFlag string
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "nnodes", "node-rank", "node_rank", "master-addr", "master_addr", "master-port", "master_port":
			shapeFlag = f.Name
		}
		switch f.Name {
		case "nnodes":
			o.flags.NNodes = &nnodes
		case "node-rank", "node_rank":
			o.flags.NodeRank = &nodeRank
		case "master-port", "master_port":
			o.flags.MasterPort = &masterPort
		}
	})
	o.argv = fs.Args()
	switch {
	case o.flags.NProcs == 0:
		return nil, errors.New("-np (ranks per node) is required")
	case o.flags.NProcs < 0:
		return nil, fmt.Errorf("-np must be at least 1, got %d", o.flags.NProcs)
	case o.flags.NProcs > launch.MaxProcsPerNode:
		return nil, fmt.Errorf("-np %d is more than the %d ranks per node gccl-run supports", o.flags.NProcs, launch.MaxProcsPerNode)
	case len(o.argv) == 0:
		return nil, errors.New("no program to run: gccl-run -np N prog [args...]")
	case o.join != "" && shapeFlag != "":
		return nil, fmt.Errorf("--join names the running job's rendezvous; --%s does not apply to newcomers", shapeFlag)
	}
	return o, nil
}

// valueBool is a boolean flag that takes its value as a separate argument
// too (--tag-output false). A plain bool flag would read that as
// "--tag-output, then run the program false".
type valueBool bool

func (b *valueBool) String() string { return strconv.FormatBool(bool(*b)) }

func (b *valueBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("want true or false, got %q", s)
	}
	*b = valueBool(v)
	return nil
}

// seconds is a duration flag: a Go duration ("90s", "1h30m") or a plain
// number of seconds ("90"), as timeout(1) users expect.
type seconds time.Duration

func (d *seconds) String() string { return time.Duration(*d).String() }

func (d *seconds) Set(s string) error {
	v, err := units.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%v, got %q", err, s)
	}
	*d = seconds(v)
	return nil
}
