package launch

import (
	"errors"
	"net"
	"os"
	"strconv"
)

// Newcomers (Job.Join) are processes started to join a running job's
// Grow (comm.Comm.Grow) rather than to start a job: a replacement for a
// lost rank, or more ranks on a new host. They dial the running job's
// rendezvous (MasterAddr:MasterPort) with its secret; the rendezvous gives
// them their ranks.

// checkJoin checks what newcomers need: the running job's rendezvous port
// and its secret, which cannot be made up here.
func (j *Job) checkJoin() error {
	switch {
	case j.MasterPort == 0:
		return errors.New("launch: newcomers need the running job's rendezvous port (gccl-run --join host:port)")
	case j.Secret == "":
		return errors.New("launch: newcomers need the running job's secret: set GCCL_SECRET to it or pass --secret-file")
	}
	return nil
}

// newcomerEnv is RankEnv for a newcomer: the rendezvous, the secret and
// the placement on this node, and GCCL_JOIN=1, which makes comm.Init join
// the running job's Grow. No rank or size: the rendezvous gives them.
func (j *Job) newcomerEnv(localRank int) []string {
	base := j.Env
	if base == nil {
		base = os.Environ()
	}
	env := make([]string, 0, len(base)+8)
	for _, kv := range base {
		if !isDropped(kv) {
			env = append(env, kv)
		}
	}
	port := strconv.Itoa(j.MasterPort)
	return append(env,
		"MASTER_ADDR="+j.MasterAddr,
		"MASTER_PORT="+port,
		"LOCAL_RANK="+strconv.Itoa(localRank),
		"LOCAL_WORLD_SIZE="+strconv.Itoa(j.NProcs),
		"GCCL_LOCAL_RANK="+strconv.Itoa(localRank),
		"GCCL_LOCAL_SIZE="+strconv.Itoa(j.NProcs),
		"GCCL_BOOTSTRAP_ADDR="+net.JoinHostPort(j.MasterAddr, port),
		"GCCL_SECRET="+j.Secret,
		"GCCL_JOB_ID="+j.JobID,
		"GCCL_JOIN=1",
	)
}
