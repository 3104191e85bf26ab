package launch

import (
	"fmt"
	"strconv"

	"github.com/gccl/gccl/internal/hostlist"
)

// Flags are a launcher's command-line settings. A nil pointer or an empty
// string means "not given", so that DetectJob may fill the value in from
// the environment.
type Flags struct {
	NProcs     int  // ranks per node (-np); required
	NNodes     *int // --nnodes
	NodeRank   *int // --node-rank
	MasterAddr string
	MasterPort *int
	// Secret is a secret from --secret-file; it wins over GCCL_SECRET.
	Secret string
}

// slurmPortBase and slurmPortSpan give a Slurm job its default master port,
// slurmPortBase + SLURM_JOB_ID % slurmPortSpan, so that every node computes
// the same port and jobs sharing a node rarely collide.
const (
	slurmPortBase = 20000
	slurmPortSpan = 10000
)

// placement is what a parent launcher (Slurm, MPI) says about this node.
type placement struct {
	name       string // for Job.Launcher
	nnodes     int
	nodeRank   int
	masterAddr string // "" when the launcher cannot tell
	masterPort int    // 0 when the launcher has no convention
	// perNodeErr is set when the launcher started several copies of us on
	// one node; it matters only when the node rank comes from the launcher.
	perNodeErr error
	// missingAddr explains how to give the master address when the
	// launcher cannot tell it.
	missingAddr string
}

// DetectJob works out this node's share of the job from flags and the
// environment env (see EnvMap), without side effects. Explicit flags win;
// then a parent launcher, Open MPI (OMPI_COMM_WORLD_*) before MPICH-style PMI
// (PMI_RANK, PMI_SIZE) before Slurm (SLURM_NODEID, SLURM_NNODES, node list);
// then the single-node defaults.
//
// On several nodes the master address comes from --master-addr, MASTER_ADDR
// or the first host of the Slurm node list; the port from --master-port,
// MASTER_PORT, 20000 + SLURM_JOB_ID % 10000 under Slurm, or 29500; and the
// secret from --secret-file or GCCL_SECRET, or it is an error: the nodes
// could not agree on a random secret, and one derived from public facts
// could be guessed. On one node, MASTER_ADDR and MASTER_PORT are ignored;
// the returned Job has MasterPort 0 (Resolve picks a free port) and, when no
// secret was given, an empty Secret (Resolve generates one).
func DetectJob(env map[string]string, flags Flags) (*Job, error) {
	if flags.NProcs < 1 {
		return nil, fmt.Errorf("-np must be at least 1, got %d", flags.NProcs)
	}
	parent, err := detectParent(env)
	if err != nil {
		return nil, err
	}
	job := &Job{NProcs: flags.NProcs, NNodes: 1, Launcher: "local"}

	// The job's shape: flags, then the parent launcher, then one node.
	switch {
	case flags.NNodes != nil:
		job.NNodes, job.Launcher = *flags.NNodes, "flags"
	case parent != nil:
		job.NNodes, job.Launcher = parent.nnodes, parent.name
	}
	if job.NNodes < 1 {
		return nil, fmt.Errorf("--nnodes must be at least 1, got %d", job.NNodes)
	}
	switch {
	case flags.NodeRank != nil:
		job.NodeRank = *flags.NodeRank
	case parent != nil:
		if parent.perNodeErr != nil {
			return nil, parent.perNodeErr
		}
		job.NodeRank = parent.nodeRank
	case job.NNodes > 1:
		return nil, fmt.Errorf("--node-rank is required with --nnodes %d (or run under srun or mpirun)", job.NNodes)
	}
	if job.NodeRank < 0 || job.NodeRank >= job.NNodes {
		return nil, fmt.Errorf("node rank %d is outside 0..%d for %d nodes", job.NodeRank, job.NNodes-1, job.NNodes)
	}

	secret := flags.Secret
	if secret == "" {
		secret = env["GCCL_SECRET"]
	}
	if secret != "" {
		if secret, err = NormalizeSecret(secret); err != nil {
			if flags.Secret == "" {
				return nil, fmt.Errorf("GCCL_SECRET: %w", err)
			}
			return nil, err
		}
		job.Secret, job.JobID = secret, JobIDFromSecret(secret)
	}

	if job.NNodes == 1 {
		// Nothing to agree on with other nodes: stay on loopback with a
		// free port, so concurrent single-node jobs never collide.
		job.MasterAddr = flags.MasterAddr
		if job.MasterAddr == "" {
			job.MasterAddr = localMasterAddr
		}
		if flags.MasterPort != nil {
			job.MasterPort = *flags.MasterPort
		}
		return job, nil
	}

	if job.Secret == "" {
		return nil, fmt.Errorf("%w (the job has %d nodes)", ErrSecretRequired, job.NNodes)
	}
	job.MasterAddr = firstNonEmpty(flags.MasterAddr, env["MASTER_ADDR"])
	if job.MasterAddr == "" && parent != nil {
		job.MasterAddr = parent.masterAddr
	}
	if job.MasterAddr == "" {
		hint := "pass --master-addr (rank 0's host) or set MASTER_ADDR"
		if parent != nil && parent.missingAddr != "" {
			hint = parent.missingAddr
		}
		return nil, fmt.Errorf("a job on %d nodes needs the master address: %s", job.NNodes, hint)
	}
	switch {
	case flags.MasterPort != nil:
		job.MasterPort = *flags.MasterPort
	case env["MASTER_PORT"] != "":
		if job.MasterPort, err = envInt(env, "MASTER_PORT"); err != nil {
			return nil, err
		}
	case parent != nil && parent.masterPort != 0:
		job.MasterPort = parent.masterPort
	default:
		job.MasterPort = DefaultMasterPort
	}
	if job.MasterPort < 1 || job.MasterPort > 65535 {
		return nil, fmt.Errorf("master port %d is outside 1..65535", job.MasterPort)
	}
	return job, nil
}

// detectParent recognizes the launcher that started this process, if any.
func detectParent(env map[string]string) (*placement, error) {
	switch {
	case env["OMPI_COMM_WORLD_SIZE"] != "" && env["OMPI_COMM_WORLD_RANK"] != "":
		return mpiPlacement(env, "open-mpi", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
			"OMPI_COMM_WORLD_LOCAL_SIZE", "mpirun -npernode 1 (or --map-by ppr:1:node)",
			"pass --master-addr or export MASTER_ADDR to every node (mpirun -x MASTER_ADDR)")
	case env["PMI_SIZE"] != "" && env["PMI_RANK"] != "":
		return mpiPlacement(env, "pmi", "PMI_SIZE", "PMI_RANK",
			"MPI_LOCALNRANKS", "mpiexec -ppn 1",
			"pass --master-addr or export MASTER_ADDR to every node (mpiexec -genv MASTER_ADDR ...)")
	case env["SLURM_NODEID"] != "" && firstNonEmpty(env["SLURM_STEP_NUM_NODES"], env["SLURM_NNODES"]) != "":
		return slurmPlacement(env)
	}
	return nil, nil
}

// mpiPlacement reads an MPI launcher's world size and rank, which are the
// node count and node rank when it runs one gccl-run per node.
func mpiPlacement(env map[string]string, name, sizeVar, rankVar, localSizeVar, onePerNode, addrHint string) (*placement, error) {
	size, err := envInt(env, sizeVar)
	if err != nil {
		return nil, err
	}
	rank, err := envInt(env, rankVar)
	if err != nil {
		return nil, err
	}
	p := &placement{name: name, nnodes: size, nodeRank: rank, missingAddr: addrHint}
	if env[localSizeVar] != "" {
		local, err := envInt(env, localSizeVar)
		if err != nil {
			return nil, err
		}
		if local > 1 {
			p.perNodeErr = fmt.Errorf("%s=%d: the MPI launcher started %d copies of gccl-run on this node; "+
				"start one per node (%s) and let -np start the ranks", localSizeVar, local, local, onePerNode)
		}
	}
	return p, nil
}

// slurmPlacement reads srun's view of the step. Step variables come first:
// a step may use only part of the allocation (srun -N1 inside salloc -N2).
func slurmPlacement(env map[string]string) (*placement, error) {
	nnodesVar := "SLURM_STEP_NUM_NODES"
	if env[nnodesVar] == "" {
		nnodesVar = "SLURM_NNODES"
	}
	nnodes, err := envInt(env, nnodesVar)
	if err != nil {
		return nil, err
	}
	nodeID, err := envInt(env, "SLURM_NODEID")
	if err != nil {
		return nil, err
	}
	p := &placement{name: "slurm", nnodes: nnodes, nodeRank: nodeID,
		missingAddr: "pass --master-addr or set MASTER_ADDR (no Slurm node list in the environment)"}
	if tasks := env["SLURM_STEP_NUM_TASKS"]; tasks != "" && tasks != strconv.Itoa(nnodes) {
		p.perNodeErr = fmt.Errorf("SLURM_STEP_NUM_TASKS=%s on %d nodes: srun must start one gccl-run per node "+
			"(srun --ntasks-per-node=1) and let -np start the ranks", tasks, nnodes)
	}
	if list := firstNonEmpty(env["SLURM_STEP_NODELIST"], env["SLURM_JOB_NODELIST"], env["SLURM_NODELIST"]); list != "" {
		first, err := hostlist.First(list)
		if err != nil {
			return nil, fmt.Errorf("Slurm node list: %w", err)
		}
		p.masterAddr = first
	}
	if id := firstNonEmpty(env["SLURM_JOB_ID"], env["SLURM_JOBID"]); id != "" {
		jobID, err := strconv.ParseUint(id, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("SLURM_JOB_ID=%q is not a number", id)
		}
		p.masterPort = slurmPortBase + int(jobID%slurmPortSpan)
	}
	return p, nil
}

func envInt(env map[string]string, name string) (int, error) {
	n, err := strconv.Atoi(env[name])
	if err != nil {
		return 0, fmt.Errorf("%s=%q is not a number", name, env[name])
	}
	return n, nil
}

func firstNonEmpty(values ...string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}
