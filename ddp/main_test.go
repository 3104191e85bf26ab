package ddp_test

import (
	"os"
	"testing"

	"github.com/gccl/gccl/internal/leakcheck"
)

// TestMain runs the tests, failing the binary if they leave goroutines
// running; started as a rank of TestAcrossProcesses (helperEnv set), the
// binary runs that rank instead.
func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helperRank(mode))
	}
	leakcheck.Main(m)
}
