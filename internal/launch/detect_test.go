package launch

import (
	"errors"
	"strings"
	"testing"
)

func intp(n int) *int { return &n }

func TestDetectJob(t *testing.T) {
	const otherSecret = "ffffffffffffffffffffffffffffffff"
	slurm := func(extra map[string]string) map[string]string {
		env := map[string]string{
			"SLURM_JOB_ID": "1234567", "SLURM_NNODES": "4", "SLURM_NODEID": "2",
			"SLURM_JOB_NODELIST": "gpu[03-06]", "GCCL_SECRET": testSecret,
		}
		for k, v := range extra {
			if v == "" {
				delete(env, k)
			} else {
				env[k] = v
			}
		}
		return env
	}
	ompi := func(extra map[string]string) map[string]string {
		env := map[string]string{"OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_RANK": "1",
			"OMPI_COMM_WORLD_LOCAL_SIZE": "1", "GCCL_SECRET": testSecret}
		for k, v := range extra {
			if v == "" {
				delete(env, k)
			} else {
				env[k] = v
			}
		}
		return env
	}
	type want struct {
		nnodes, nodeRank int
		addr             string
		port             int
		secret           string
		launcher         string
	}
	tests := []struct {
		name    string
		env     map[string]string
		flags   Flags
		want    want
		wantErr string
	}{
		// One node: loopback, a port chosen later, a secret generated later.
		{"single node defaults", nil, Flags{NProcs: 4},
			want{1, 0, "127.0.0.1", 0, "", "local"}, ""},
		{"single node keeps GCCL_SECRET", map[string]string{"GCCL_SECRET": testSecret}, Flags{NProcs: 4},
			want{1, 0, "127.0.0.1", 0, testSecret, "local"}, ""},
		{"single node ignores MASTER_ADDR and MASTER_PORT", map[string]string{"MASTER_ADDR": "elsewhere", "MASTER_PORT": "1"},
			Flags{NProcs: 2}, want{1, 0, "127.0.0.1", 0, "", "local"}, ""},
		{"single node flags", nil, Flags{NProcs: 2, MasterAddr: "10.0.0.1", MasterPort: intp(4000)},
			want{1, 0, "10.0.0.1", 4000, "", "local"}, ""},
		{"--nnodes 1 is a single node", nil, Flags{NProcs: 2, NNodes: intp(1)},
			want{1, 0, "127.0.0.1", 0, "", "flags"}, ""},

		// Several nodes from flags.
		{"flags: two nodes", map[string]string{"GCCL_SECRET": testSecret},
			Flags{NProcs: 4, NNodes: intp(2), NodeRank: intp(1), MasterAddr: "head"},
			want{2, 1, "head", 29500, testSecret, "flags"}, ""},
		{"flags: MASTER_ADDR and MASTER_PORT from the environment",
			map[string]string{"GCCL_SECRET": testSecret, "MASTER_ADDR": "head", "MASTER_PORT": "6000"},
			Flags{NProcs: 4, NNodes: intp(2), NodeRank: intp(0)},
			want{2, 0, "head", 6000, testSecret, "flags"}, ""},
		{"flags beat MASTER_ADDR and MASTER_PORT",
			map[string]string{"GCCL_SECRET": testSecret, "MASTER_ADDR": "head", "MASTER_PORT": "6000"},
			Flags{NProcs: 4, NNodes: intp(2), NodeRank: intp(0), MasterAddr: "other", MasterPort: intp(7000)},
			want{2, 0, "other", 7000, testSecret, "flags"}, ""},
		{"secret file beats GCCL_SECRET", map[string]string{"GCCL_SECRET": otherSecret},
			Flags{NProcs: 1, NNodes: intp(2), NodeRank: intp(0), MasterAddr: "head", Secret: testSecret},
			want{2, 0, "head", 29500, testSecret, "flags"}, ""},
		{"GCCL_SECRET is normalized to lowercase", map[string]string{"GCCL_SECRET": strings.ToUpper(testSecret)},
			Flags{NProcs: 1, NNodes: intp(2), NodeRank: intp(0), MasterAddr: "head"},
			want{2, 0, "head", 29500, testSecret, "flags"}, ""},
		{"flags: two nodes without a secret", nil,
			Flags{NProcs: 4, NNodes: intp(2), NodeRank: intp(1), MasterAddr: "head"}, want{}, "GCCL_SECRET"},
		{"flags: --nnodes without --node-rank", map[string]string{"GCCL_SECRET": testSecret},
			Flags{NProcs: 4, NNodes: intp(2), MasterAddr: "head"}, want{}, "--node-rank is required"},
		{"flags: two nodes without a master", map[string]string{"GCCL_SECRET": testSecret},
			Flags{NProcs: 4, NNodes: intp(2), NodeRank: intp(0)}, want{}, "--master-addr"},
		{"flags: node rank out of range", nil,
			Flags{NProcs: 4, NNodes: intp(2), NodeRank: intp(2)}, want{}, "node rank 2 is outside 0..1"},
		{"flags: bad GCCL_SECRET", map[string]string{"GCCL_SECRET": "password"},
			Flags{NProcs: 1}, want{}, "GCCL_SECRET: the job secret must be 32 hex"},
		{"-np 0", nil, Flags{NProcs: 0}, want{}, "-np must be at least 1"},

		// Slurm: srun gccl-run, one task per node.
		{"slurm", slurm(nil), Flags{NProcs: 4},
			want{4, 2, "gpu03", 24567, testSecret, "slurm"}, ""},
		{"slurm: step variables beat the allocation's",
			slurm(map[string]string{"SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NODELIST": "gpu[05-06]",
				"SLURM_STEP_NUM_TASKS": "2", "SLURM_NODEID": "1"}),
			Flags{NProcs: 4}, want{2, 1, "gpu05", 24567, testSecret, "slurm"}, ""},
		{"slurm: SLURM_NODELIST when SLURM_JOB_NODELIST is absent",
			slurm(map[string]string{"SLURM_JOB_NODELIST": "", "SLURM_NODELIST": "a1,b2,c3,d4"}),
			Flags{NProcs: 4}, want{4, 2, "a1", 24567, testSecret, "slurm"}, ""},
		{"slurm: MASTER_ADDR and MASTER_PORT beat the node list and job ID",
			slurm(map[string]string{"MASTER_ADDR": "gpu04-ib", "MASTER_PORT": "5000"}),
			Flags{NProcs: 4}, want{4, 2, "gpu04-ib", 5000, testSecret, "slurm"}, ""},
		{"slurm: flags win", slurm(nil),
			Flags{NProcs: 4, NNodes: intp(2), NodeRank: intp(0), MasterAddr: "x", MasterPort: intp(1234)},
			want{2, 0, "x", 1234, testSecret, "flags"}, ""},
		{"slurm: one node is a single-node job", slurm(map[string]string{"SLURM_NNODES": "1", "SLURM_NODEID": "0", "GCCL_SECRET": ""}),
			Flags{NProcs: 4}, want{1, 0, "127.0.0.1", 0, "", "slurm"}, ""},
		{"slurm: no job ID gives port 29500", slurm(map[string]string{"SLURM_JOB_ID": ""}),
			Flags{NProcs: 4}, want{4, 2, "gpu03", 29500, testSecret, "slurm"}, ""},
		{"slurm: no secret", slurm(map[string]string{"GCCL_SECRET": ""}), Flags{NProcs: 4},
			want{}, "GCCL_SECRET"},
		{"slurm: several gccl-run per node", slurm(map[string]string{"SLURM_STEP_NUM_NODES": "4", "SLURM_STEP_NUM_TASKS": "16"}),
			Flags{NProcs: 4}, want{}, "--ntasks-per-node=1"},
		{"slurm: several per node is fine with an explicit node rank",
			slurm(map[string]string{"SLURM_STEP_NUM_NODES": "4", "SLURM_STEP_NUM_TASKS": "16"}),
			Flags{NProcs: 4, NodeRank: intp(3)}, want{4, 3, "gpu03", 24567, testSecret, "slurm"}, ""},
		{"slurm: bad SLURM_NNODES", slurm(map[string]string{"SLURM_NNODES": "four"}), Flags{NProcs: 4},
			want{}, `SLURM_NNODES="four" is not a number`},
		{"slurm: bad node list", slurm(map[string]string{"SLURM_JOB_NODELIST": "gpu[03-"}), Flags{NProcs: 4},
			want{}, "Slurm node list"},

		// MPI: mpirun -npernode 1 gccl-run.
		{"open mpi", ompi(map[string]string{"MASTER_ADDR": "head"}), Flags{NProcs: 8},
			want{3, 1, "head", 29500, testSecret, "open-mpi"}, ""},
		{"open mpi: --master-addr", ompi(nil), Flags{NProcs: 8, MasterAddr: "head2"},
			want{3, 1, "head2", 29500, testSecret, "open-mpi"}, ""},
		{"open mpi: no master address", ompi(nil), Flags{NProcs: 8},
			want{}, "mpirun -x MASTER_ADDR"},
		{"open mpi: several gccl-run per node", ompi(map[string]string{"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "h"}),
			Flags{NProcs: 8}, want{}, "mpirun -npernode 1"},
		{"open mpi beats Slurm (mpirun inside an allocation)",
			func() map[string]string {
				env := slurm(nil)
				for k, v := range ompi(map[string]string{"MASTER_ADDR": "head"}) {
					env[k] = v
				}
				return env
			}(),
			Flags{NProcs: 8}, want{3, 1, "head", 29500, testSecret, "open-mpi"}, ""},
		{"open mpi: flags win", ompi(map[string]string{"MASTER_ADDR": "head"}),
			Flags{NProcs: 8, NNodes: intp(5), NodeRank: intp(4)}, want{5, 4, "head", 29500, testSecret, "flags"}, ""},
		{"pmi (mpich)", map[string]string{"PMI_SIZE": "2", "PMI_RANK": "0", "MASTER_ADDR": "h", "GCCL_SECRET": testSecret},
			Flags{NProcs: 2}, want{2, 0, "h", 29500, testSecret, "pmi"}, ""},
		{"pmi: several per node", map[string]string{"PMI_SIZE": "4", "PMI_RANK": "0", "MPI_LOCALNRANKS": "2",
			"MASTER_ADDR": "h", "GCCL_SECRET": testSecret}, Flags{NProcs: 2}, want{}, "mpiexec -ppn 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job, err := DetectJob(tt.env, tt.flags)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("DetectJob error = %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("DetectJob: %v", err)
			}
			got := want{job.NNodes, job.NodeRank, job.MasterAddr, job.MasterPort, job.Secret, job.Launcher}
			if got != tt.want {
				t.Errorf("DetectJob =\n  %+v\nwant\n  %+v", got, tt.want)
			}
			if job.NProcs != tt.flags.NProcs {
				t.Errorf("NProcs = %d, want %d", job.NProcs, tt.flags.NProcs)
			}
			wantID := ""
			if job.Secret != "" {
				wantID = JobIDFromSecret(job.Secret)
			}
			if job.JobID != wantID {
				t.Errorf("JobID = %q, want %q", job.JobID, wantID)
			}
		})
	}
}

func TestDetectJobMultiNodeWithoutSecretIsErrSecretRequired(t *testing.T) {
	_, err := DetectJob(map[string]string{}, Flags{NProcs: 1, NNodes: intp(2), NodeRank: intp(0), MasterAddr: "h"})
	if !errors.Is(err, ErrSecretRequired) {
		t.Fatalf("err = %v, want ErrSecretRequired", err)
	}
	for _, hint := range []string{"GCCL_SECRET", "--secret-file", "openssl rand -hex 16", "2 nodes"} {
		if !strings.Contains(err.Error(), hint) {
			t.Errorf("error %q does not mention %q", err, hint)
		}
	}
}
