package metrics

import (
	"os/exec"
	"strings"
	"testing"
)

// TestCoreDoesNotDependOnPrometheus: only this package brings Prometheus
// in; a program that uses comm or p2p alone does not link it.
func TestCoreDoesNotDependOnPrometheus(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not on PATH")
	}
	cmd := exec.Command(goBin, "list", "-deps", "github.com/gccl/gccl/comm", "github.com/gccl/gccl/p2p")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	if !strings.Contains(string(out), "github.com/gccl/gccl/transport") {
		t.Fatalf("go list's output changed?\n%s", out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.Contains(dep, "prometheus") {
			t.Errorf("the core depends on %s", dep)
		}
	}
}
