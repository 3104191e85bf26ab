package layers

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/gccl/gccl"

// below lists the package trees below comm, which must not depend on it
// (test kits excepted: they exist to drive it).
var below = []string{"algo", "bootstrap", "device", "dtype", "gpu", "internal", "p2p", "topo", "transport"}

var testKits = map[string]bool{module + "/internal/commtest": true}

// TestNothingBelowCommImportsComm runs go list over the module and checks
// every package of the layers below comm for comm among its dependencies.
func TestNothingBelowCommImportsComm(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not on PATH")
	}
	cmd := exec.Command(goBin, "list", "-f", "{{.ImportPath}} {{join .Deps \" \"}}", module+"/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(line, " ")
		if !isBelow(pkg) || testKits[pkg] {
			continue
		}
		checked++
		for _, d := range strings.Fields(deps) {
			if d == module+"/comm" || strings.HasPrefix(d, module+"/comm/") || strings.HasPrefix(d, module+"/cmd/") {
				t.Errorf("%s depends on %s", pkg, d)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d packages checked: go list's output changed?\n%s", checked, out)
	}
}

func isBelow(pkg string) bool {
	rel, ok := strings.CutPrefix(pkg, module+"/")
	if !ok {
		return false
	}
	for _, b := range below {
		if rel == b || strings.HasPrefix(rel, b+"/") {
			return true
		}
	}
	return false
}
