package main

import (
	"strings"
	"testing"
)

func TestJoinArgs(t *testing.T) {
	secret := strings.Repeat("cd", 16)
	o, err := parseArgs([]string{"--join", "10.0.0.1:7000", "-np", "2", "prog"})
	if err != nil {
		t.Fatal(err)
	}
	job, err := newcomerJob(map[string]string{"GCCL_SECRET": strings.ToUpper(secret)}, o)
	if err != nil || !job.Join || job.NProcs != 2 || job.MasterAddr != "10.0.0.1" || job.MasterPort != 7000 || job.Secret != secret {
		t.Fatalf("newcomer job: %+v, %v", job, err)
	}
	if _, err := newcomerJob(map[string]string{}, o); err == nil || !strings.Contains(err.Error(), "secret") {
		t.Fatalf("newcomers without the job's secret: %v, want an error naming the secret", err)
	}
	for _, addr := range []string{"10.0.0.1", ":7000", "h:0", "h:x"} {
		o, err := parseArgs([]string{"--join", addr, "-np", "1", "prog"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := newcomerJob(map[string]string{"GCCL_SECRET": secret}, o); err == nil || !strings.Contains(err.Error(), "host:port") {
			t.Errorf("--join %q: %v, want an error asking for host:port", addr, err)
		}
	}
	if _, err := parseArgs([]string{"--join", "h:1", "--master-port", "2", "-np", "1", "prog"}); err == nil || !strings.Contains(err.Error(), "--master-port does not apply") {
		t.Fatalf("--join with --master-port: %v, want a refusal", err)
	}
}
