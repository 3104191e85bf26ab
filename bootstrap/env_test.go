package bootstrap

import (
	"errors"
	"strings"
	"testing"
	"time"
)

const envSecret = "0123456789abcdef0123456789abcdef"

func TestFromEnv(t *testing.T) {
	withSecret := func(vars ...string) map[string]string {
		m := map[string]string{"GCCL_SECRET": envSecret}
		for i := 0; i < len(vars); i += 2 {
			m[vars[i]] = vars[i+1]
		}
		return m
	}
	single := Config{Rank: 0, Size: 1, LocalRank: 0, LocalSize: 1}
	derivedID := DeriveJobID(envSecret)
	job := func(rank, size, localRank, localSize int, addr string) Config {
		return Config{Rank: rank, Size: size, LocalRank: localRank, LocalSize: localSize, Addr: addr,
			Secret: envSecret, JobID: derivedID, Serve: rank == 0, ServedByRank0: true}
	}
	torchrun := []string{"RANK", "2", "WORLD_SIZE", "8", "LOCAL_RANK", "2", "LOCAL_WORLD_SIZE", "4", "MASTER_ADDR", "node0", "MASTER_PORT", "29400"}
	openMPI := []string{"OMPI_COMM_WORLD_RANK", "3", "OMPI_COMM_WORLD_SIZE", "4", "OMPI_COMM_WORLD_LOCAL_RANK", "1", "OMPI_COMM_WORLD_LOCAL_SIZE", "2"}
	pmi := []string{"PMI_RANK", "1", "PMI_SIZE", "6", "MPI_LOCALRANKID", "1", "MPI_LOCALNRANKS", "3"}
	slurm := []string{"SLURM_PROCID", "5", "SLURM_NTASKS", "8", "SLURM_LOCALID", "1", "SLURM_NTASKS_PER_NODE", "4",
		"SLURM_JOB_NODELIST", "gpu[03-04]", "SLURM_JOB_ID", "123456"}
	concat := func(lists ...[]string) []string {
		var out []string
		for _, l := range lists {
			out = append(out, l...)
		}
		return out
	}

	cases := []struct {
		name      string
		env       map[string]string
		want      Config
		wantFound bool
		wantErr   string // substring; errors must also wrap ErrInvalidArgument
	}{
		{name: "nothing set: single process", env: nil, want: single},
		{name: "secret alone: single process", env: withSecret(), want: single},

		// Explicit GCCL_* variables.
		{name: "explicit", env: withSecret("GCCL_RANK", "1", "GCCL_SIZE", "4", "GCCL_BOOTSTRAP_ADDR", "head:1234", "GCCL_LOCAL_RANK", "1", "GCCL_LOCAL_SIZE", "2"),
			want: job(1, 4, 1, 2, "head:1234"), wantFound: true},
		{name: "explicit GCCL_WORLD_SIZE", env: withSecret("GCCL_RANK", "0", "GCCL_WORLD_SIZE", "2", "GCCL_BOOTSTRAP_ADDR", "head:1234"),
			want: job(0, 2, 0, 0, "head:1234"), wantFound: true},
		{name: "explicit sizes disagree", env: withSecret("GCCL_RANK", "0", "GCCL_SIZE", "2", "GCCL_WORLD_SIZE", "3"), wantErr: "disagree"},
		{name: "explicit rank without size", env: withSecret("GCCL_RANK", "0"), wantErr: "GCCL_SIZE"},
		{name: "explicit size without rank", env: withSecret("GCCL_SIZE", "2"), wantErr: "GCCL_RANK"},
		{name: "explicit address from MASTER_*", env: withSecret("GCCL_RANK", "1", "GCCL_SIZE", "2", "MASTER_ADDR", "m", "MASTER_PORT", "7"),
			want: job(1, 2, 0, 0, "m:7"), wantFound: true},
		{name: "explicit beats torchrun", env: withSecret(concat(torchrun, []string{"GCCL_RANK", "5", "GCCL_SIZE", "6"})...),
			want: job(5, 6, 0, 0, "node0:29400"), wantFound: true},
		{name: "explicit size 1 is a single process", env: withSecret("GCCL_RANK", "0", "GCCL_SIZE", "1"), want: single},
		{name: "explicit rank out of range", env: withSecret("GCCL_RANK", "4", "GCCL_SIZE", "4", "GCCL_BOOTSTRAP_ADDR", "h:1"), wantErr: "rank 4 outside"},
		{name: "not an integer", env: withSecret("GCCL_RANK", "one", "GCCL_SIZE", "4"), wantErr: `GCCL_RANK="one"`},

		// torchrun.
		{name: "torchrun", env: withSecret(torchrun...), want: job(2, 8, 2, 4, "node0:29400"), wantFound: true},
		{name: "torchrun agent store takes MASTER_PORT", env: withSecret(concat(torchrun, []string{"TORCHELASTIC_USE_AGENT_STORE", "True"})...),
			want: job(2, 8, 2, 4, "node0:29401"), wantFound: true},
		{name: "GCCL_BOOTSTRAP_ADDR beats MASTER_*", env: withSecret(concat(torchrun, []string{"GCCL_BOOTSTRAP_ADDR", "other:9"})...),
			want: job(2, 8, 2, 4, "other:9"), wantFound: true},
		{name: "GCCL_LOCAL_* beat the launcher's", env: withSecret(concat(torchrun, []string{"GCCL_LOCAL_RANK", "0", "GCCL_LOCAL_SIZE", "1"})...),
			want: job(2, 8, 0, 1, "node0:29400"), wantFound: true},
		{name: "torchrun multi-host without address", env: withSecret("RANK", "1", "WORLD_SIZE", "8", "LOCAL_RANK", "1", "LOCAL_WORLD_SIZE", "4"),
			wantErr: "GCCL_BOOTSTRAP_ADDR"},
		{name: "RANK alone is not torchrun", env: withSecret("RANK", "3"), want: single},
		{name: "torchrun beats Open MPI", env: withSecret(concat(torchrun, openMPI)...), want: job(2, 8, 2, 4, "node0:29400"), wantFound: true},

		// Open MPI.
		{name: "Open MPI with MASTER_*", env: withSecret(concat(openMPI, []string{"MASTER_ADDR", "h0", "MASTER_PORT", "5000"})...),
			want: job(3, 4, 1, 2, "h0:5000"), wantFound: true},
		{name: "Open MPI with MASTER_ADDR only", env: withSecret(concat(openMPI, []string{"MASTER_ADDR", "h0"})...),
			want: job(3, 4, 1, 2, "h0:29500"), wantFound: true},
		{name: "Open MPI multi-host without address", env: withSecret(openMPI...), wantErr: "Open MPI job found"},
		{name: "Open MPI single host defaults to loopback",
			env:  withSecret("OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "2", "OMPI_COMM_WORLD_LOCAL_RANK", "0", "OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
			want: job(0, 2, 0, 2, "127.0.0.1:29500"), wantFound: true},
		{name: "Open MPI beats PMI", env: withSecret(concat(openMPI, pmi, []string{"GCCL_BOOTSTRAP_ADDR", "a:1"})...),
			want: job(3, 4, 1, 2, "a:1"), wantFound: true},

		// PMI (Hydra).
		{name: "PMI", env: withSecret(concat(pmi, []string{"GCCL_BOOTSTRAP_ADDR", "a:1"})...), want: job(1, 6, 1, 3, "a:1"), wantFound: true},
		{name: "PMI beats Slurm", env: withSecret(concat(pmi, slurm, []string{"GCCL_BOOTSTRAP_ADDR", "a:1"})...),
			want: job(1, 6, 1, 3, "a:1"), wantFound: true},

		// Slurm.
		{name: "Slurm", env: withSecret(slurm...), want: job(5, 8, 1, 4, "gpu03:23456"), wantFound: true},
		{name: "Slurm step node list first", env: withSecret(concat(slurm, []string{"SLURM_STEP_NODELIST", "gpu[04-05]"})...),
			want: job(5, 8, 1, 4, "gpu04:23456"), wantFound: true},
		{name: "Slurm SLURM_NODELIST", env: withSecret("SLURM_PROCID", "0", "SLURM_NPROCS", "2", "SLURM_LOCALID", "0", "SLURM_NODELIST", "a,b", "SLURM_JOBID", "7"),
			want: job(0, 2, 0, 0, "a:20007"), wantFound: true},
		{name: "Slurm MASTER_PORT", env: withSecret(concat(slurm, []string{"MASTER_PORT", "4000"})...),
			want: job(5, 8, 1, 4, "gpu03:4000"), wantFound: true},
		{name: "Slurm MASTER_ADDR", env: withSecret(concat(slurm, []string{"MASTER_ADDR", "login", "MASTER_PORT", "4000"})...),
			want: job(5, 8, 1, 4, "login:4000"), wantFound: true},
		{name: "Slurm local size from the per-node list",
			env: withSecret("SLURM_PROCID", "7", "SLURM_NTASKS", "8", "SLURM_LOCALID", "1", "SLURM_NODEID", "2",
				"SLURM_TASKS_PER_NODE", "3(x2),2", "SLURM_JOB_NODELIST", "n[1-3]", "SLURM_JOB_ID", "99"),
			want: job(7, 8, 1, 2, "n1:20099"), wantFound: true},
		{name: "Slurm step per-node list first",
			env: withSecret("SLURM_PROCID", "1", "SLURM_NTASKS", "3", "SLURM_LOCALID", "1", "SLURM_NODEID", "0",
				"SLURM_STEP_TASKS_PER_NODE", "2,1", "SLURM_TASKS_PER_NODE", "4(x2)", "SLURM_JOB_NODELIST", "n[1-2]", "SLURM_JOB_ID", "99"),
			want: job(1, 3, 1, 2, "n1:20099"), wantFound: true},
		{name: "Slurm malformed per-node list",
			env:     withSecret("SLURM_PROCID", "1", "SLURM_NTASKS", "3", "SLURM_NODEID", "0", "SLURM_TASKS_PER_NODE", "2(3)"),
			wantErr: "SLURM_TASKS_PER_NODE"},
		{name: "Slurm malformed node list", env: withSecret("SLURM_PROCID", "1", "SLURM_NTASKS", "3", "SLURM_JOB_NODELIST", "n[1-"), wantErr: "SLURM_JOB_NODELIST"},
		{name: "Slurm single task", env: withSecret("SLURM_PROCID", "0", "SLURM_NTASKS", "1", "SLURM_JOB_NODELIST", "n1"), want: single},

		// Secret, job ID, serving and timeouts.
		{name: "no secret", env: map[string]string{"GCCL_RANK": "0", "GCCL_SIZE": "2", "GCCL_BOOTSTRAP_ADDR": "h:1"}, wantErr: "GCCL_SECRET is not set"},
		{name: "uppercase secret is normalized", env: map[string]string{"GCCL_RANK": "1", "GCCL_SIZE": "2", "GCCL_BOOTSTRAP_ADDR": "h:1", "GCCL_SECRET": strings.ToUpper(envSecret)},
			want: job(1, 2, 0, 0, "h:1"), wantFound: true},
		{name: "malformed secret", env: map[string]string{"GCCL_RANK": "0", "GCCL_SIZE": "2", "GCCL_BOOTSTRAP_ADDR": "h:1", "GCCL_SECRET": "xyz"}, wantErr: "32 hex"},
		{name: "malformed address", env: withSecret("GCCL_RANK", "0", "GCCL_SIZE", "2", "GCCL_BOOTSTRAP_ADDR", "nohost"), wantErr: "not host:port"},
		{name: "GCCL_JOB_ID", env: withSecret("GCCL_RANK", "1", "GCCL_SIZE", "2", "GCCL_BOOTSTRAP_ADDR", "h:1", "GCCL_JOB_ID", "myjob"),
			want: func() Config { c := job(1, 2, 0, 0, "h:1"); c.JobID = "myjob"; return c }(), wantFound: true},
		{name: "external rendezvous", env: withSecret("GCCL_RANK", "0", "GCCL_SIZE", "2", "GCCL_BOOTSTRAP_ADDR", "h:1", "GCCL_BOOTSTRAP_SERVE", "0"),
			want: func() Config { c := job(0, 2, 0, 0, "h:1"); c.Serve, c.ServedByRank0 = false, false; return c }(), wantFound: true},
		{name: "serve only on rank 0", env: withSecret("GCCL_RANK", "1", "GCCL_SIZE", "2", "GCCL_BOOTSTRAP_ADDR", "h:1", "GCCL_BOOTSTRAP_SERVE", "1"),
			want: job(1, 2, 0, 0, "h:1"), wantFound: true},
		{name: "timeouts", env: withSecret("GCCL_RANK", "1", "GCCL_SIZE", "2", "GCCL_BOOTSTRAP_ADDR", "h:1", "GCCL_BOOTSTRAP_TIMEOUT", "90", "GCCL_HEARTBEAT_TIMEOUT", "1500ms"),
			want: func() Config {
				c := job(1, 2, 0, 0, "h:1")
				c.Timeout, c.HeartbeatTimeout = 90*time.Second, 1500*time.Millisecond
				return c
			}(),
			wantFound: true},
		{name: "bad timeout", env: withSecret("GCCL_RANK", "1", "GCCL_SIZE", "2", "GCCL_BOOTSTRAP_ADDR", "h:1", "GCCL_HEARTBEAT_TIMEOUT", "-1"), wantErr: "GCCL_HEARTBEAT_TIMEOUT"},
		{name: "timeout below 1ns", env: withSecret("GCCL_RANK", "1", "GCCL_SIZE", "2", "GCCL_BOOTSTRAP_ADDR", "h:1", "GCCL_BOOTSTRAP_TIMEOUT", "1e-10"), wantErr: "shorter than 1ns"},
		{name: "zero timeout", env: withSecret("GCCL_RANK", "1", "GCCL_SIZE", "2", "GCCL_BOOTSTRAP_ADDR", "h:1", "GCCL_BOOTSTRAP_TIMEOUT", "0s"), wantErr: "must be positive"},
		{name: "local rank out of range", env: withSecret(concat(torchrun, []string{"GCCL_LOCAL_RANK", "4"})...), wantErr: "local rank 4"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, found, err := fromEnv(func(name string) (string, bool) { v, ok := tc.env[name]; return v, ok })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrInvalidArgument) {
					t.Fatalf("error = %v, want ErrInvalidArgument containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if found != tc.wantFound || got != tc.want {
				t.Fatalf("got %+v, %v\nwant %+v, %v", got, found, tc.want, tc.wantFound)
			}
		})
	}
}

func TestFromEnvReadsProcessEnvironment(t *testing.T) {
	t.Setenv("GCCL_RANK", "1")
	t.Setenv("GCCL_SIZE", "3")
	t.Setenv("GCCL_BOOTSTRAP_ADDR", "127.0.0.1:4567")
	t.Setenv("GCCL_SECRET", envSecret)
	cfg, found, err := FromEnv()
	if err != nil || !found || cfg.Rank != 1 || cfg.Size != 3 || cfg.Addr != "127.0.0.1:4567" {
		t.Fatalf("FromEnv = %+v, %v, %v", cfg, found, err)
	}
}

func TestTasksOnNode(t *testing.T) {
	for _, tc := range []struct {
		spec string
		node int
		want int
		err  bool
	}{
		{"4", 0, 4, false},
		{"2(x3),1", 0, 2, false},
		{"2(x3),1", 2, 2, false},
		{"2(x3),1", 3, 1, false},
		{"2(x3),1", 4, 0, true},
		{"1(x1000000000)", 999999999, 1, false},
		{"2(3)", 0, 0, true},
		{"0", 0, 0, true},
		{"", 0, 0, true},
		{"2(x0)", 0, 0, true},
		{"2", -1, 0, true},
		{"1,(", 0, 0, true}, // a malformed tail fails even when node 0 was found
	} {
		got, err := tasksOnNode(tc.spec, tc.node)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("tasksOnNode(%q, %d) = %d, %v; want %d (error %v)", tc.spec, tc.node, got, err, tc.want, tc.err)
		}
	}
}
