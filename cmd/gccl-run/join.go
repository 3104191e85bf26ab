package main

import (
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/gccl/gccl/internal/launch"
)

// newcomerJob is the job of gccl-run --join: newcomers to the running job
// whose rendezvous is at opts.join, on this node, with the job's secret.
func newcomerJob(env map[string]string, opts *options) (*launch.Job, error) {
	host, portText, err := net.SplitHostPort(opts.join)
	port, perr := strconv.Atoi(portText)
	if err != nil || perr != nil || host == "" || port < 1 || port > 65535 {
		return nil, fmt.Errorf("--join %q: want host:port of the running job's rendezvous (its ranks' GCCL_BOOTSTRAP_ADDR)", opts.join)
	}
	secret := opts.flags.Secret
	if secret == "" {
		secret = env["GCCL_SECRET"]
	}
	if secret == "" {
		return nil, errors.New("--join needs the running job's secret: set GCCL_SECRET to it or pass --secret-file")
	}
	if secret, err = launch.NormalizeSecret(secret); err != nil {
		return nil, err
	}
	jobID := env["GCCL_JOB_ID"] // a job that named itself; else derived, as the job's is
	if jobID == "" {
		jobID = launch.JobIDFromSecret(secret)
	}
	return &launch.Job{NProcs: opts.flags.NProcs, NNodes: 1, MasterAddr: host, MasterPort: port,
		Secret: secret, JobID: jobID, Join: true, Launcher: "join"}, nil
}
