package launch

import (
	"slices"
	"strings"
	"testing"
)

func TestNewcomerEnv(t *testing.T) {
	j := &Job{NProcs: 2, MasterAddr: "10.0.0.1", MasterPort: 7000, Secret: strings.Repeat("ab", 16), Argv: []string{"p"}, Join: true,
		Env: []string{"PATH=/bin", "GCCL_RANK=5", "GCCL_SIZE=8", "RANK=5", "GCCL_JOIN=0"}}
	if err := j.Resolve(); err != nil {
		t.Fatal(err)
	}
	env := j.RankEnv(1)
	for _, want := range []string{"PATH=/bin", "GCCL_JOIN=1", "GCCL_BOOTSTRAP_ADDR=10.0.0.1:7000", "GCCL_SECRET=" + j.Secret,
		"GCCL_JOB_ID=" + JobIDFromSecret(j.Secret), "GCCL_LOCAL_RANK=1", "GCCL_LOCAL_SIZE=2"} {
		if !slices.Contains(env, want) {
			t.Errorf("newcomer env lacks %s: %v", want, env)
		}
	}
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if name == "GCCL_RANK" || name == "GCCL_SIZE" || name == "RANK" || kv == "GCCL_JOIN=0" {
			t.Errorf("newcomer env has %s: the rendezvous gives newcomers their ranks", kv)
		}
	}
	// A job's ranks never inherit GCCL_JOIN.
	j.Join = false
	if env := j.RankEnv(0); slices.Contains(env, "GCCL_JOIN=0") || slices.Contains(env, "GCCL_JOIN=1") {
		t.Errorf("a job's rank env has GCCL_JOIN: %v", env)
	}
}

func TestResolveRejectsNewcomersWithoutJob(t *testing.T) {
	for _, j := range []*Job{
		{NProcs: 1, MasterAddr: "h", Secret: strings.Repeat("ab", 16), Argv: []string{"p"}, Join: true},
		{NProcs: 1, MasterAddr: "h", MasterPort: 7000, Argv: []string{"p"}, Join: true},
	} {
		if err := j.Resolve(); err == nil || !strings.Contains(err.Error(), "running job") {
			t.Errorf("Resolve of newcomers without port or secret: %v, want an error naming the running job's", err)
		}
	}
}
