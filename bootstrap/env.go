package bootstrap

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gccl/gccl/internal/hostlist"
	"github.com/gccl/gccl/internal/tlsx"
	"github.com/gccl/gccl/internal/units"
)

// FromEnv finds the job this process belongs to from the environment and
// reports whether it found a multi-process job; without one it returns a
// single-rank Config and false.
//
// Rank, size and local placement come from the first launcher found, in this
// order:
//
//	GCCL_RANK, GCCL_SIZE (or GCCL_WORLD_SIZE)       explicit, e.g. set by gccl-run
//	RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE  torchrun
//	OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE   Open MPI
//	PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS    PMI (MPICH Hydra, Intel MPI)
//	SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE
//	    (or SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE at SLURM_NODEID)   srun
//
// The rendezvous address is GCCL_BOOTSTRAP_ADDR (host:port) if set, else the
// launcher's: MASTER_ADDR and MASTER_PORT (torchrun: MASTER_PORT+1 when its
// agent's store holds MASTER_PORT); for Slurm the first host of the step's
// node list and MASTER_PORT or 20000 + SLURM_JOB_ID%10000; for a single-host
// MPI or PMI job 127.0.0.1:DefaultPort.
//
// GCCL_LOCAL_RANK and GCCL_LOCAL_SIZE override the launcher's placement.
// GCCL_SECRET (32 hex characters) is required for any multi-process job: the
// rendezvous admits only holders of the secret, and a secret derived from
// the environment (job ID, host names) could be derived by anyone, so none
// is. GCCL_JOB_ID overrides the job ID derived from the secret.
// GCCL_BOOTSTRAP_SERVE=0 stops rank 0 from serving the rendezvous (an
// external gccl-bootstrap serves it); GCCL_BOOTSTRAP_TIMEOUT and
// GCCL_HEARTBEAT_TIMEOUT (Go durations such as 90s, or seconds) set
// Config.Timeout and Config.HeartbeatTimeout.
func FromEnv() (Config, bool, error) { return fromEnv(os.LookupEnv) }

// launch is what a launcher's variables say about this process.
type launch struct {
	source               string // for messages: "GCCL_RANK", "torchrun", ...
	rank, size           int
	localRank, localSize int    // localSize 0: unknown
	addr                 string // "" if the launcher names no rendezvous
}

// env reads variables through a lookup function, so tests need not touch the
// process environment.
type env func(string) (string, bool)

func (e env) str(name string) (string, bool) {
	v, ok := e(name)
	v = strings.TrimSpace(v)
	return v, ok && v != ""
}

// int reads an integer variable; ok is false when it is unset.
// jobAndTLS sets cfg's JobID (GCCL_JOB_ID, else derived from its secret)
// and its TLS settings (GCCL_TLS and the key files), for ranks and
// newcomers alike.
func (e env) jobAndTLS(cfg *Config) error {
	cfg.JobID = DeriveJobID(cfg.Secret)
	if v, ok := e.str("GCCL_JOB_ID"); ok {
		cfg.JobID = v
	}
	useTLS, err := tlsx.Enabled(func(k string) string { v, _ := e.str(k); return v })
	if err != nil {
		return err
	}
	cfg.TLS = useTLS
	cfg.TLSFiles.Cert, _ = e.str(tlsx.EnvCert)
	cfg.TLSFiles.Key, _ = e.str(tlsx.EnvKey)
	cfg.TLSFiles.CA, _ = e.str(tlsx.EnvCA)
	return nil
}

// timeouts sets cfg's Timeout and HeartbeatTimeout from
// GCCL_BOOTSTRAP_TIMEOUT and GCCL_HEARTBEAT_TIMEOUT where they are set.
func (e env) timeouts(cfg *Config) error {
	for _, d := range []struct {
		name string
		to   *time.Duration
	}{{"GCCL_BOOTSTRAP_TIMEOUT", &cfg.Timeout}, {"GCCL_HEARTBEAT_TIMEOUT", &cfg.HeartbeatTimeout}} {
		if v, ok := e.str(d.name); ok {
			var err error
			if *d.to, err = parseDuration(v); err != nil {
				return fmt.Errorf("%s=%q: %v", d.name, v, err)
			}
		}
	}
	return nil
}

func (e env) int(name string) (n int, ok bool, err error) {
	v, ok := e.str(name)
	if !ok {
		return 0, false, nil
	}
	n, err = strconv.Atoi(v)
	if err != nil {
		return 0, true, fmt.Errorf("gccl bootstrap: %w: %s=%q is not an integer", ErrInvalidArgument, name, v)
	}
	return n, true, nil
}

// ints reads several integer variables, stopping at the first error; missing
// ones read as 0 and are reported in present.
func (e env) ints(names ...string) (values []int, present []bool, err error) {
	values, present = make([]int, len(names)), make([]bool, len(names))
	for i, name := range names {
		if values[i], present[i], err = e.int(name); err != nil {
			return nil, nil, err
		}
	}
	return values, present, nil
}

func fromEnv(lookup func(string) (string, bool)) (Config, bool, error) {
	e := env(lookup)
	l, found, err := detectLaunch(e)
	if err != nil {
		return Config{}, false, err
	}
	if !found {
		return Config{Rank: 0, Size: 1, LocalRank: 0, LocalSize: 1}, false, nil
	}
	bad := func(format string, args ...any) (Config, bool, error) {
		return Config{}, false, fmt.Errorf("gccl bootstrap: %w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
	}
	if l.size < 1 || l.rank < 0 || l.rank >= l.size {
		return bad("%s: rank %d outside a job of %d ranks", l.source, l.rank, l.size)
	}
	if l.size == 1 {
		return Config{Rank: 0, Size: 1, LocalRank: 0, LocalSize: 1}, false, nil
	}
	cfg := Config{Rank: l.rank, Size: l.size, LocalRank: l.localRank, LocalSize: l.localSize, Addr: l.addr,
		Serve: l.rank == 0, ServedByRank0: true}

	// Explicit GCCL_* variables override what the launcher says.
	if v, ok, err := e.int("GCCL_LOCAL_RANK"); err != nil {
		return Config{}, false, err
	} else if ok {
		cfg.LocalRank = v
	}
	if v, ok, err := e.int("GCCL_LOCAL_SIZE"); err != nil {
		return Config{}, false, err
	} else if ok {
		cfg.LocalSize = v
	}
	if cfg.LocalSize < 0 || (cfg.LocalSize > 0 && (cfg.LocalRank < 0 || cfg.LocalRank >= cfg.LocalSize)) {
		return bad("%s: local rank %d outside the %d ranks of this host", l.source, cfg.LocalRank, cfg.LocalSize)
	}
	if v, ok := e.str("GCCL_BOOTSTRAP_ADDR"); ok {
		if _, _, err := net.SplitHostPort(v); err != nil {
			return bad("GCCL_BOOTSTRAP_ADDR=%q is not host:port", v)
		}
		cfg.Addr = v
	}
	if cfg.Addr == "" {
		if cfg.LocalSize != cfg.Size {
			return bad("%s job found (rank %d of %d) but no rendezvous address: set GCCL_BOOTSTRAP_ADDR=host:port (or MASTER_ADDR and MASTER_PORT) to a port on rank 0's host",
				l.source, cfg.Rank, cfg.Size)
		}
		// Every rank is on this host.
		cfg.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(DefaultPort))
	}

	secret, ok := e.str("GCCL_SECRET")
	if !ok {
		return bad("%s job found (rank %d of %d) but GCCL_SECRET is not set: the rendezvous only admits ranks that share the job's secret. Set GCCL_SECRET to the same 32 hex characters on every rank (e.g. export GCCL_SECRET=$(openssl rand -hex 16) before launching); gccl-run sets it for you",
			l.source, cfg.Rank, cfg.Size)
	}
	secret = strings.ToLower(secret)
	if err := checkSecret(secret); err != nil {
		return Config{}, false, fmt.Errorf("gccl bootstrap: GCCL_SECRET: %w", err)
	}
	cfg.Secret = secret
	if err := e.jobAndTLS(&cfg); err != nil {
		return bad("%v", err)
	}
	if v, ok := e.str("GCCL_BOOTSTRAP_SERVE"); ok {
		serve, err := strconv.ParseBool(v)
		if err != nil {
			return bad("GCCL_BOOTSTRAP_SERVE=%q is not 0 or 1", v)
		}
		cfg.Serve = serve && cfg.Rank == 0
		cfg.ServedByRank0 = serve
	}
	if err := e.timeouts(&cfg); err != nil {
		return bad("%v", err)
	}
	return cfg, true, nil
}

// parseDuration accepts Go durations ("90s", "2m") and plain seconds ("90"),
// above zero.
func parseDuration(v string) (time.Duration, error) {
	d, err := units.ParseDuration(v)
	if err == nil && d == 0 {
		err = errors.New("must be positive")
	}
	return d, err
}

// detectLaunch returns the first launcher whose variables are set.
func detectLaunch(e env) (launch, bool, error) {
	for _, detect := range []func(env) (launch, bool, error){explicitLaunch, torchrunLaunch, openMPILaunch, pmiLaunch, slurmLaunch} {
		if l, ok, err := detect(e); err != nil || ok {
			return l, ok, err
		}
	}
	return launch{}, false, nil
}

// masterAddr is MASTER_ADDR:MASTER_PORT, or "" when MASTER_ADDR is unset.
// portOffset is added to MASTER_PORT.
func masterAddr(e env, portOffset int) (string, error) {
	host, ok := e.str("MASTER_ADDR")
	if !ok {
		return "", nil
	}
	port, ok, err := e.int("MASTER_PORT")
	if err != nil {
		return "", err
	}
	if !ok {
		port, portOffset = DefaultPort, 0
	}
	return net.JoinHostPort(host, strconv.Itoa(port+portOffset)), nil
}

func explicitLaunch(e env) (launch, bool, error) {
	v, present, err := e.ints("GCCL_RANK", "GCCL_SIZE", "GCCL_WORLD_SIZE")
	if err != nil {
		return launch{}, false, err
	}
	rank, size := v[0], v[1]
	switch {
	case !present[0] && !present[1] && !present[2]:
		return launch{}, false, nil
	case present[1] && present[2] && v[1] != v[2]:
		return launch{}, false, fmt.Errorf("gccl bootstrap: %w: GCCL_SIZE=%d and GCCL_WORLD_SIZE=%d disagree", ErrInvalidArgument, v[1], v[2])
	case !present[1] && present[2]:
		size = v[2]
	}
	if !present[0] || (!present[1] && !present[2]) {
		return launch{}, false, fmt.Errorf("gccl bootstrap: %w: set both GCCL_RANK and GCCL_SIZE (or GCCL_WORLD_SIZE), or neither", ErrInvalidArgument)
	}
	addr, err := masterAddr(e, 0)
	return launch{source: "GCCL_RANK", rank: rank, size: size, addr: addr}, true, err
}

func torchrunLaunch(e env) (launch, bool, error) {
	v, present, err := e.ints("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
	if err != nil {
		return launch{}, false, err
	}
	// RANK alone is too common a name to mean torchrun.
	if !present[0] || !present[1] {
		return launch{}, false, nil
	}
	// torchrun's agent serves its own TCPStore on MASTER_PORT when it tells
	// the workers to reuse it; the rendezvous then takes the next port.
	offset := 0
	if agent, _ := e.str("TORCHELASTIC_USE_AGENT_STORE"); agent == "True" {
		offset = 1
	}
	addr, err := masterAddr(e, offset)
	return launch{source: "torchrun", rank: v[0], size: v[1], localRank: v[2], localSize: v[3], addr: addr}, true, err
}

func openMPILaunch(e env) (launch, bool, error) {
	v, present, err := e.ints("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
	if err != nil || !present[0] || !present[1] {
		return launch{}, false, err
	}
	addr, err := masterAddr(e, 0)
	return launch{source: "Open MPI", rank: v[0], size: v[1], localRank: v[2], localSize: v[3], addr: addr}, true, err
}

func pmiLaunch(e env) (launch, bool, error) {
	v, present, err := e.ints("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
	if err != nil || !present[0] || !present[1] {
		return launch{}, false, err
	}
	addr, err := masterAddr(e, 0)
	return launch{source: "PMI", rank: v[0], size: v[1], localRank: v[2], localSize: v[3], addr: addr}, true, err
}

func slurmLaunch(e env) (launch, bool, error) {
	v, present, err := e.ints("SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_NODEID")
	if err != nil || !present[0] || (!present[1] && !present[2]) {
		return launch{}, false, err
	}
	l := launch{source: "Slurm", rank: v[0], size: v[1], localRank: v[3], localSize: v[4]}
	if !present[1] {
		l.size = v[2]
	}
	if !present[4] && present[5] {
		// Without --ntasks-per-node, the count is in the compressed
		// per-node list, e.g. "2(x3),1".
		for _, name := range []string{"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"} {
			if spec, ok := e.str(name); ok {
				if l.localSize, err = tasksOnNode(spec, v[5]); err != nil {
					return launch{}, false, fmt.Errorf("gccl bootstrap: %w: %s=%q: %v", ErrInvalidArgument, name, spec, err)
				}
				break
			}
		}
	}

	// MASTER_ADDR, when a job script sets it, names rank 0's host; otherwise
	// rank 0 runs on the first host of the step (block and cyclic
	// distributions start there).
	if l.addr, err = masterAddr(e, 0); err != nil || l.addr != "" {
		return l, true, err
	}
	for _, name := range []string{"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"} {
		list, ok := e.str(name)
		if !ok {
			continue
		}
		host, err := hostlist.First(list)
		if err != nil {
			return launch{}, false, fmt.Errorf("gccl bootstrap: %w: %s: %v", ErrInvalidArgument, name, err)
		}
		port, ok, err := e.int("MASTER_PORT")
		if err != nil {
			return launch{}, false, err
		}
		if !ok {
			port = slurmPort(e)
		}
		l.addr = net.JoinHostPort(host, strconv.Itoa(port))
		break
	}
	return l, true, nil
}

// slurmPort derives the rendezvous port from the job ID, so that jobs sharing
// a node pick different ports without coordination.
func slurmPort(e env) int {
	for _, name := range []string{"SLURM_JOB_ID", "SLURM_JOBID"} {
		if id, ok, err := e.int(name); ok && err == nil && id >= 0 {
			return 20000 + id%10000
		}
	}
	return DefaultPort
}

// tasksOnNode returns the task count of node index node in a Slurm
// compressed list such as "2(x3),1" (nodes 0-2 run 2 tasks, node 3 runs 1).
// It checks the whole list but does not expand the repetitions.
func tasksOnNode(spec string, node int) (int, error) {
	if node < 0 {
		return 0, fmt.Errorf("node index %d", node)
	}
	found, rest := 0, node
	for _, item := range strings.Split(spec, ",") {
		count, reps := item, "1"
		if open := strings.IndexByte(item, '('); open >= 0 {
			if !strings.HasPrefix(item[open:], "(x") || !strings.HasSuffix(item, ")") {
				return 0, fmt.Errorf("malformed item %q", item)
			}
			count, reps = item[:open], item[open+2:len(item)-1]
		}
		n, err := strconv.Atoi(count)
		if err != nil || n < 1 {
			return 0, fmt.Errorf("malformed task count %q", count)
		}
		r, err := strconv.Atoi(reps)
		if err != nil || r < 1 {
			return 0, fmt.Errorf("malformed repetition %q", reps)
		}
		switch {
		case found > 0: // keep checking the rest of the list
		case rest < r:
			found = n
		default:
			rest -= r
		}
	}
	if found == 0 {
		return 0, fmt.Errorf("has no node %d", node)
	}
	return found, nil
}
