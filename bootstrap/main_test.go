package bootstrap

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/gccl/gccl/internal/leakcheck"
)

// TestMain fails the package's tests if they leave goroutines running or a
// Client unclosed. An unclosed Client's connection leaks no goroutine while
// it idles, and one only when gRPC happens to redial it after its
// rendezvous stopped, so sessions are checked directly.
func TestMain(m *testing.M) {
	var open []string
	code := leakcheck.Run(m, func() { open = sessionsOpen() })
	if code == 0 && len(open) > 0 {
		fmt.Fprintf(os.Stderr, "bootstrap: %d sessions still open after the tests (a Client was not closed):\n  %s\n",
			len(open), strings.Join(open, "\n  "))
		code = 1
	}
	os.Exit(code)
}
