// Package launch starts the local ranks of a gccl job, the way torchrun or
// mpirun does: N child processes of one program, each with a torchrun-style
// environment (RANK, WORLD_SIZE, MASTER_ADDR, ...) and gccl's own variables
// (GCCL_RANK, GCCL_BOOTSTRAP_ADDR, GCCL_SECRET, GCCL_JOB_ID, ...).
//
// Run supervises the children as one job: their output is tagged with the
// global rank line by line; the first rank to fail brings the others down
// (SIGTERM to each child's process group, SIGKILL after a grace period) and
// decides the exit code; a timeout or a forwarded signal stops the job the
// same way; and the job's leftover shared-memory segments are removed at the
// end. DetectJob works out the job's shape (nodes, this node's rank, master
// address, secret) from flags and the environment of Slurm or MPI launchers.
//
// cmd/gccl-run is the command-line front end; gccl-perf -np uses the same
// code to start its local ranks.
package launch

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Defaults used when the caller leaves a field zero.
const (
	// DefaultMasterPort is torchrun's rendezvous port, used on several nodes
	// when nothing else chose one.
	DefaultMasterPort = 29500
	// DefaultKillGrace is how long ranks get between SIGTERM and SIGKILL.
	DefaultKillGrace = 3 * time.Second
	// NoKillGrace as Job.KillGrace sends SIGKILL right after SIGTERM.
	NoKillGrace time.Duration = -1
	// DefaultShmDir is where the shared-memory transport creates segments.
	DefaultShmDir = "/dev/shm"
	// localMasterAddr is the rendezvous address of a single-node job.
	localMasterAddr = "127.0.0.1"
)

// Limits on a job's shape, checked before anything is allocated per rank,
// so that a typo such as -np 2147483647 is refused with a clear error
// instead of exhausting memory.
const (
	// MaxProcsPerNode bounds the ranks on one node: far more processes than
	// any node has hardware threads.
	MaxProcsPerNode = 1 << 16
	// MaxWorldSize bounds the ranks of a whole job, as gccl-bootstrap
	// --size does: the rendezvous's all-gather answers hold a descriptor of
	// every rank and are capped at 256 MiB (bootstrap's maxMessageSize), so
	// beyond 2^20 ranks each rank could contribute less than 256 bytes.
	MaxWorldSize = 1 << 20
)

// Exit codes of Run besides the ranks' own, chosen as a shell and
// timeout(1) choose them, so scripts can tell the cases apart.
const (
	ExitFailure       = 1   // the job could not be started or was canceled
	ExitTimeout       = 124 // Job.Timeout expired
	ExitNotExecutable = 126 // the program exists but cannot be executed
	ExitNotFound      = 127 // the program does not exist
	// A rank killed by signal s, or a job stopped by a forwarded signal s,
	// exits with 128+s.
	exitSignalBase = 128
)

// Job is one node's share of a gccl job: NProcs local ranks of Argv, which
// are ranks NodeRank*NProcs ... NodeRank*NProcs+NProcs-1 of a job of
// NNodes*NProcs ranks.
type Job struct {
	NProcs   int // ranks on this node (LOCAL_WORLD_SIZE)
	NNodes   int // nodes in the job; 0 means 1
	NodeRank int // this node's index, 0 <= NodeRank < NNodes

	// MasterAddr:MasterPort is where rank 0 serves the rendezvous. Resolve
	// fills in 127.0.0.1 and a free port on a single node.
	MasterAddr string
	MasterPort int

	// Secret is the job secret (32 hex characters) that ranks present to the
	// rendezvous. Resolve generates one on a single node; a job on several
	// nodes must be given the same secret on every node.
	Secret string
	// JobID names the job's resources (shared-memory segments
	// gccl-<JobID>-*). Resolve derives it from Secret, so every node agrees.
	JobID string

	Argv []string // the program and its arguments
	Env  []string // the ranks' base environment; nil means os.Environ()

	TagOutput      bool      // prefix every output line with "[rank R] "
	Stdout, Stderr io.Writer // where the ranks' output goes; nil: os.Stdout, os.Stderr

	Timeout time.Duration // stop the job after this long; 0: no limit
	// KillGrace is the time from SIGTERM to SIGKILL when the job is
	// stopped; 0 means DefaultKillGrace and NoKillGrace (any negative
	// value) SIGKILL at once.
	KillGrace time.Duration
	// KeepGoing lets the other ranks run on when one fails, for programs
	// that go on without it (comm.Comm.Shrink). The first failure still
	// decides the result, once every rank has ended.
	KeepGoing bool
	// Join starts newcomers to the running job at MasterAddr:MasterPort,
	// which join its Grow (join.go), instead of a job: they get no rank
	// from the launcher, and the job's shared memory is not cleaned up
	// when they end.
	Join bool

	// Signals, if not nil, delivers signals to forward to every rank (the
	// caller subscribes with signal.Notify). A forwarded signal stops the
	// job: ranks still running after KillGrace are killed, and a second
	// signal kills them at once.
	Signals <-chan os.Signal

	ShmDir string       // where to clean up segments; "" means DefaultShmDir
	Logger *slog.Logger // progress and diagnostics; nil discards them

	// Launcher says where the job's shape came from ("local", "flags",
	// "slurm", "open-mpi", "pmi"); DetectJob sets it, for logs only.
	Launcher string
}

// WorldSize is the number of ranks in the whole job.
func (j *Job) WorldSize() int { return j.nnodes() * j.NProcs }

// GlobalRank is the job-wide rank of local rank localRank of this node.
func (j *Job) GlobalRank(localRank int) int { return j.NodeRank*j.NProcs + localRank }

func (j *Job) nnodes() int {
	if j.NNodes == 0 {
		return 1
	}
	return j.NNodes
}

// ErrSecretRequired means a job on several nodes was given no secret: the
// nodes cannot agree on a random one without talking to each other.
var ErrSecretRequired = errors.New("a job on several nodes needs a secret shared by all nodes: " +
	"set GCCL_SECRET to the same 32 hex characters on every node " +
	"(e.g. export GCCL_SECRET=$(openssl rand -hex 16)) or pass --secret-file")

// Resolve checks the job and fills in what was left to defaults: one node,
// a free port and 127.0.0.1 on a single node, a fresh secret on a single
// node, the job ID and the kill grace. Run calls it; call it first to see
// (and log) the values the job will use.
func (j *Job) Resolve() error {
	if j.NNodes == 0 {
		j.NNodes = 1
	}
	switch {
	case j.NProcs < 1:
		return fmt.Errorf("launch: need at least one process per node, got %d", j.NProcs)
	case j.NProcs > MaxProcsPerNode:
		return fmt.Errorf("launch: %d processes per node is more than the %d gccl supports", j.NProcs, MaxProcsPerNode)
	case j.NNodes < 1:
		return fmt.Errorf("launch: need at least one node, got %d", j.NNodes)
	case j.NNodes > MaxWorldSize/j.NProcs: // dividing cannot overflow
		return fmt.Errorf("launch: %d nodes of %d processes is more than the %d ranks gccl supports in one job",
			j.NNodes, j.NProcs, MaxWorldSize)
	case j.NodeRank < 0 || j.NodeRank >= j.NNodes:
		return fmt.Errorf("launch: node rank %d is outside 0..%d for %d nodes", j.NodeRank, j.NNodes-1, j.NNodes)
	case len(j.Argv) == 0 || j.Argv[0] == "":
		return errors.New("launch: no program to run")
	}
	single := j.NNodes == 1
	addr, err := masterHost(j.MasterAddr)
	if err != nil {
		return err
	}
	j.MasterAddr = addr
	if j.MasterAddr == "" {
		if !single {
			return errors.New("launch: a job on several nodes needs the master address (rank 0's host)")
		}
		j.MasterAddr = localMasterAddr
	}
	if j.Join {
		if err := j.checkJoin(); err != nil {
			return err
		}
	}
	if j.MasterPort == 0 {
		if single {
			port, err := FreePort()
			if err != nil {
				return err
			}
			j.MasterPort = port
		} else {
			j.MasterPort = DefaultMasterPort
		}
	}
	if j.MasterPort < 1 || j.MasterPort > 65535 {
		return fmt.Errorf("launch: master port %d is outside 1..65535", j.MasterPort)
	}
	if j.Secret == "" {
		if !single {
			return fmt.Errorf("launch: %w", ErrSecretRequired)
		}
		secret, err := NewSecret()
		if err != nil {
			return err
		}
		j.Secret = secret
	}
	secret, err := NormalizeSecret(j.Secret)
	if err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	j.Secret = secret
	if j.JobID == "" {
		j.JobID = JobIDFromSecret(j.Secret)
	}
	switch {
	case j.KillGrace == 0:
		j.KillGrace = DefaultKillGrace
	case j.KillGrace < 0:
		j.KillGrace = NoKillGrace
	}
	return nil
}

// masterHost is a master address as a bare host: IPv6 addresses may come
// in brackets ([fe80::1], as in URLs), which RankEnv must not double when
// it adds the port. A host:port is refused, the port has a flag of its own.
func masterHost(addr string) (string, error) {
	host := addr
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	bad := strings.ContainsAny(host, "[]") || (host == "" && addr != "")
	if !bad && strings.Contains(host, ":") {
		// Only an IPv6 address (with an optional %zone) has colons.
		ip, _, _ := strings.Cut(host, "%")
		bad = net.ParseIP(ip) == nil
	}
	if bad {
		return "", fmt.Errorf("launch: master address %q is not a host name or IP address "+
			"(give the port with --master-port or MASTER_PORT)", addr)
	}
	return host, nil
}

// rankVariables are the variables RankEnv sets; inherited values of the same
// names are dropped so a rank never sees two.
var rankVariables = []string{
	"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
	"GROUP_RANK", "NODE_RANK",
	"GCCL_RANK", "GCCL_SIZE", "GCCL_LOCAL_RANK", "GCCL_LOCAL_SIZE",
	"GCCL_BOOTSTRAP_ADDR", "GCCL_SECRET", "GCCL_JOB_ID", "GCCL_JOIN",
}

// staleVariables are inherited variables that RankEnv drops without
// setting: the bootstrap reads them as aliases of what rankVariables say
// (GCCL_WORLD_SIZE of GCCL_SIZE, and refuses a job where they disagree), or
// they describe a torchrun agent that does not exist under gccl-run (whose
// TCPStore on MASTER_PORT moves the rendezvous to the next port). A value
// left over from an enclosing job would break every rank.
var staleVariables = []string{"GCCL_WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE"}

// RankEnv is the environment of local rank localRank: the base environment
// (Env, or os.Environ() when Env is nil) with the torchrun-compatible
// variables and gccl's own set for this rank. It uses the fields as they
// are; Run resolves them first.
func (j *Job) RankEnv(localRank int) []string {
	if j.Join {
		return j.newcomerEnv(localRank)
	}
	base := j.Env
	if base == nil {
		base = os.Environ()
	}
	env := make([]string, 0, len(base)+len(rankVariables))
	for _, kv := range base {
		if !isDropped(kv) {
			env = append(env, kv)
		}
	}
	rank := strconv.Itoa(j.GlobalRank(localRank))
	world := strconv.Itoa(j.WorldSize())
	local := strconv.Itoa(localRank)
	localSize := strconv.Itoa(j.NProcs)
	node := strconv.Itoa(j.NodeRank)
	port := strconv.Itoa(j.MasterPort)
	return append(env,
		// torchrun's names, so code written for torchrun finds its rank.
		"MASTER_ADDR="+j.MasterAddr,
		"MASTER_PORT="+port,
		"RANK="+rank,
		"WORLD_SIZE="+world,
		"LOCAL_RANK="+local,
		"LOCAL_WORLD_SIZE="+localSize,
		"GROUP_RANK="+node,
		"NODE_RANK="+node,
		// gccl's own, which the bootstrap prefers.
		"GCCL_RANK="+rank,
		"GCCL_SIZE="+world,
		"GCCL_LOCAL_RANK="+local,
		"GCCL_LOCAL_SIZE="+localSize,
		"GCCL_BOOTSTRAP_ADDR="+net.JoinHostPort(j.MasterAddr, port),
		"GCCL_SECRET="+j.Secret,
		"GCCL_JOB_ID="+j.JobID,
	)
}

// isDropped reports whether RankEnv drops the inherited variable kv.
func isDropped(kv string) bool {
	name, _, _ := strings.Cut(kv, "=")
	return slices.Contains(rankVariables, name) || slices.Contains(staleVariables, name)
}

// FreePort returns a TCP port that was free a moment ago, found by binding
// port 0 and closing the socket, as torchrun does on a single node. Another
// process may take it before rank 0 binds it; that is rare and fails loudly.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		return 0, fmt.Errorf("launch: finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// EnvMap turns an environment list such as os.Environ() into a map for
// DetectJob. Later entries win, as they do for exec.
func EnvMap(environ []string) map[string]string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if name, value, ok := strings.Cut(kv, "="); ok {
			m[name] = value
		}
	}
	return m
}

func (j *Job) logger() *slog.Logger {
	if j.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return j.Logger
}
