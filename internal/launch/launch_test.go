package launch

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const testSecret = "0123456789abcdef0123456789abcdef"

// envValues picks the rank variables out of an environment list, failing on
// duplicates (a rank must never see two values).
func envValues(t *testing.T, env []string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		if _, dup := m[name]; dup {
			t.Errorf("variable %s appears twice", name)
		}
		m[name] = value
	}
	return m
}

func TestRankEnv(t *testing.T) {
	// GCCL_WORLD_SIZE, left over from an enclosing job, would contradict
	// GCCL_SIZE; TORCHELASTIC_USE_AGENT_STORE would move the rendezvous
	// port of a torchrun-style rank: both are dropped.
	oneNode := &Job{NProcs: 2, NNodes: 1, MasterAddr: "127.0.0.1", MasterPort: 41000,
		Secret: testSecret, JobID: "3eb1bd439947", Env: []string{"PATH=/bin", "RANK=99", "HOME=/root",
			"GCCL_WORLD_SIZE=16", "TORCHELASTIC_USE_AGENT_STORE=True"}}
	twoNodes := &Job{NProcs: 4, NNodes: 2, NodeRank: 1, MasterAddr: "node01", MasterPort: 29500,
		Secret: testSecret, JobID: "3eb1bd439947", Env: []string{"PATH=/bin"}}
	ipv6 := &Job{NProcs: 1, NNodes: 1, MasterAddr: "fd00::1", MasterPort: 29500, Secret: testSecret, JobID: "x", Env: []string{}}
	tests := []struct {
		name  string
		job   *Job
		local int
		want  map[string]string
	}{
		{"one node, local rank 0", oneNode, 0, map[string]string{
			"PATH": "/bin", "HOME": "/root",
			"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "41000", "RANK": "0", "WORLD_SIZE": "2",
			"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "NODE_RANK": "0",
			"GCCL_RANK": "0", "GCCL_SIZE": "2", "GCCL_LOCAL_RANK": "0", "GCCL_LOCAL_SIZE": "2",
			"GCCL_BOOTSTRAP_ADDR": "127.0.0.1:41000", "GCCL_SECRET": testSecret, "GCCL_JOB_ID": "3eb1bd439947",
		}},
		{"one node, local rank 1 (inherited RANK replaced)", oneNode, 1, map[string]string{
			"PATH": "/bin", "HOME": "/root",
			"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "41000", "RANK": "1", "WORLD_SIZE": "2",
			"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "NODE_RANK": "0",
			"GCCL_RANK": "1", "GCCL_SIZE": "2", "GCCL_LOCAL_RANK": "1", "GCCL_LOCAL_SIZE": "2",
			"GCCL_BOOTSTRAP_ADDR": "127.0.0.1:41000", "GCCL_SECRET": testSecret, "GCCL_JOB_ID": "3eb1bd439947",
		}},
		{"second of two nodes, local rank 3", twoNodes, 3, map[string]string{
			"PATH":        "/bin",
			"MASTER_ADDR": "node01", "MASTER_PORT": "29500", "RANK": "7", "WORLD_SIZE": "8",
			"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1", "NODE_RANK": "1",
			"GCCL_RANK": "7", "GCCL_SIZE": "8", "GCCL_LOCAL_RANK": "3", "GCCL_LOCAL_SIZE": "4",
			"GCCL_BOOTSTRAP_ADDR": "node01:29500", "GCCL_SECRET": testSecret, "GCCL_JOB_ID": "3eb1bd439947",
		}},
		{"second of two nodes, local rank 0", twoNodes, 0, map[string]string{
			"PATH":        "/bin",
			"MASTER_ADDR": "node01", "MASTER_PORT": "29500", "RANK": "4", "WORLD_SIZE": "8",
			"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1", "NODE_RANK": "1",
			"GCCL_RANK": "4", "GCCL_SIZE": "8", "GCCL_LOCAL_RANK": "0", "GCCL_LOCAL_SIZE": "4",
			"GCCL_BOOTSTRAP_ADDR": "node01:29500", "GCCL_SECRET": testSecret, "GCCL_JOB_ID": "3eb1bd439947",
		}},
		{"IPv6 master address is bracketed in the bootstrap address", ipv6, 0, map[string]string{
			"MASTER_ADDR": "fd00::1", "MASTER_PORT": "29500", "RANK": "0", "WORLD_SIZE": "1",
			"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0", "NODE_RANK": "0",
			"GCCL_RANK": "0", "GCCL_SIZE": "1", "GCCL_LOCAL_RANK": "0", "GCCL_LOCAL_SIZE": "1",
			"GCCL_BOOTSTRAP_ADDR": "[fd00::1]:29500", "GCCL_SECRET": testSecret, "GCCL_JOB_ID": "x",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := envValues(t, tt.job.RankEnv(tt.local))
			if len(got) != len(tt.want) {
				t.Errorf("got %d variables, want %d: %v", len(got), len(tt.want), got)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

func TestResolveSingleNodeFillsDefaults(t *testing.T) {
	j := &Job{NProcs: 2, Argv: []string{"prog"}}
	if err := j.Resolve(); err != nil {
		t.Fatal(err)
	}
	if j.NNodes != 1 || j.MasterAddr != "127.0.0.1" || j.MasterPort <= 0 || j.KillGrace != DefaultKillGrace {
		t.Errorf("defaults: nnodes %d, addr %q, port %d, grace %v", j.NNodes, j.MasterAddr, j.MasterPort, j.KillGrace)
	}
	if !isHex(j.Secret, 32) {
		t.Errorf("generated secret %q is not 32 hex characters", j.Secret)
	}
	if j.JobID != JobIDFromSecret(j.Secret) {
		t.Errorf("job ID %q is not derived from the secret", j.JobID)
	}
}

func TestResolveRejects(t *testing.T) {
	tests := []struct {
		name string
		job  Job
		want string
	}{
		{"no processes", Job{NProcs: 0, Argv: []string{"p"}}, "at least one process"},
		{"no program", Job{NProcs: 1}, "no program"},
		{"node rank too big", Job{NProcs: 1, NNodes: 2, NodeRank: 2, Argv: []string{"p"}}, "node rank 2"},
		{"several nodes, no secret", Job{NProcs: 1, NNodes: 2, MasterAddr: "a", Argv: []string{"p"}}, "GCCL_SECRET"},
		{"several nodes, no master", Job{NProcs: 1, NNodes: 2, Secret: testSecret, Argv: []string{"p"}}, "master address"},
		{"short secret", Job{NProcs: 1, Secret: "abcd", Argv: []string{"p"}}, "32 hex characters"},
		{"bad port", Job{NProcs: 1, MasterPort: 70000, Secret: testSecret, Argv: []string{"p"}}, "outside 1..65535"},
		{"too many processes", Job{NProcs: MaxProcsPerNode + 1, Argv: []string{"p"}}, "more than the 65536"},
		{"huge process count", Job{NProcs: 2147483647, Argv: []string{"p"}}, "more than the 65536"},
		{"job too large", Job{NProcs: 8, NNodes: MaxWorldSize/8 + 1, Secret: testSecret, MasterAddr: "a", Argv: []string{"p"}},
			"more than the 1048576 ranks"},
		{"nodes overflow", Job{NProcs: 4, NNodes: 1 << 62, Secret: testSecret, MasterAddr: "a", Argv: []string{"p"}},
			"more than the 1048576 ranks"},
		{"host:port as master", Job{NProcs: 1, MasterAddr: "node0:7000", Argv: []string{"p"}}, "not a host name"},
		{"unbalanced bracket", Job{NProcs: 1, MasterAddr: "[fe80::1", Argv: []string{"p"}}, "not a host name"},
		{"empty brackets", Job{NProcs: 1, MasterAddr: "[]", Argv: []string{"p"}}, "not a host name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.job.Resolve()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Resolve() = %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
	j := Job{NProcs: 1, NNodes: 2, MasterAddr: "a", Argv: []string{"p"}}
	if err := j.Resolve(); !errors.Is(err, ErrSecretRequired) {
		t.Errorf("multi-node without secret: %v, want ErrSecretRequired", err)
	}
}

// isHex reports whether s is n lowercase hex digits.
func isHex(s string, n int) bool {
	return len(s) == n && strings.Trim(s, "0123456789abcdef") == ""
}

func TestNewSecret(t *testing.T) {
	a, err := NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	if !isHex(a, 32) || !isHex(b, 32) {
		t.Errorf("secrets %q, %q are not 32 lowercase hex characters", a, b)
	}
	if a == b {
		t.Errorf("two calls returned the same secret %q", a)
	}
}

func TestJobIDFromSecret(t *testing.T) {
	// printf %s 0123456789abcdef0123456789abcdef | sha256sum | cut -c1-12
	if got, want := JobIDFromSecret(testSecret), "3eb1bd439947"; got != want {
		t.Errorf("JobIDFromSecret = %q, want %q", got, want)
	}
	if JobIDFromSecret(testSecret) == JobIDFromSecret(strings.Repeat("f", 32)) {
		t.Error("different secrets gave the same job ID")
	}
}

func TestNormalizeSecret(t *testing.T) {
	got, err := NormalizeSecret(" 0123456789ABCDEF0123456789abcdef\n")
	if err != nil || got != testSecret {
		t.Errorf("NormalizeSecret = %q, %v; want %q", got, err, testSecret)
	}
	for _, bad := range []string{"", "abc", strings.Repeat("g", 32), strings.Repeat("a", 31), strings.Repeat("a", 64)} {
		if _, err := NormalizeSecret(bad); err == nil {
			t.Errorf("NormalizeSecret(%q) accepted a bad secret", bad)
		}
	}
}

func TestReadSecretFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "secret")
	if err := os.WriteFile(good, []byte(testSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadSecretFile(good); err != nil || got != testSecret {
		t.Errorf("ReadSecretFile = %q, %v", got, err)
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("hunter2"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadSecretFile(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("bad secret file: %v, want an error naming the file", err)
	}
	if _, err := ReadSecretFile(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing secret file: no error")
	}
}

func TestEnvMap(t *testing.T) {
	m := EnvMap([]string{"A=1", "B=x=y", "A=2", "NOEQUALS"})
	if m["A"] != "2" || m["B"] != "x=y" || len(m) != 2 {
		t.Errorf("EnvMap = %v", m)
	}
}

func TestFreePort(t *testing.T) {
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	if port < 1 || port > 65535 {
		t.Errorf("FreePort = %d", port)
	}
}

func TestResolveKillGrace(t *testing.T) {
	for _, tt := range []struct{ given, want time.Duration }{
		{0, DefaultKillGrace}, // unset
		{NoKillGrace, NoKillGrace},
		{-time.Second, NoKillGrace},
		{250 * time.Millisecond, 250 * time.Millisecond},
	} {
		j := &Job{NProcs: 1, Argv: []string{"p"}, KillGrace: tt.given}
		if err := j.Resolve(); err != nil {
			t.Fatal(err)
		}
		if j.KillGrace != tt.want {
			t.Errorf("KillGrace %v: resolved to %v, want %v", tt.given, j.KillGrace, tt.want)
		}
	}
}

func TestResolveAcceptsTheLargestJob(t *testing.T) {
	j := &Job{NProcs: MaxProcsPerNode, NNodes: MaxWorldSize / MaxProcsPerNode, NodeRank: 3,
		MasterAddr: "a", Secret: testSecret, Argv: []string{"p"}}
	if err := j.Resolve(); err != nil {
		t.Errorf("a job of %d ranks, %d per node: %v", j.WorldSize(), j.NProcs, err)
	}
}

// TestResolveIPv6MasterAddress checks that a bracketed IPv6 address (as in
// URLs) works like a bare one and is bracketed once in host:port.
func TestResolveIPv6MasterAddress(t *testing.T) {
	for _, addr := range []string{"fe80::1", "[fe80::1]", "fe80::1%eth0", "[fe80::1%eth0]", "node0", "10.0.0.1"} {
		j := &Job{NProcs: 1, NNodes: 2, MasterAddr: addr, Secret: testSecret, Argv: []string{"p"}}
		if err := j.Resolve(); err != nil {
			t.Errorf("%s: %v", addr, err)
			continue
		}
		host := strings.TrimSuffix(strings.TrimPrefix(addr, "["), "]")
		env := envValues(t, j.RankEnv(0))
		wantAddr := host + ":29500"
		if strings.Contains(host, ":") {
			wantAddr = "[" + host + "]:29500"
		}
		if env["MASTER_ADDR"] != host || env["GCCL_BOOTSTRAP_ADDR"] != wantAddr {
			t.Errorf("%s: MASTER_ADDR=%q GCCL_BOOTSTRAP_ADDR=%q, want %q and %q",
				addr, env["MASTER_ADDR"], env["GCCL_BOOTSTRAP_ADDR"], host, wantAddr)
		}
	}
}
