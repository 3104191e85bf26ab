// Package leakcheck fails a test binary whose tests leave goroutines
// running, as grpc-go's internal/leakcheck does: TestMain calls Main, which
// runs the tests and then waits a while for every goroutine they started to
// end, listing those that do not.
package leakcheck

import (
	"fmt"
	"os"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"
)

// Timeout is how long Main waits for goroutines to end after the tests.
var Timeout = 10 * time.Second

// ignored are goroutines of the runtime and the testing package, and of
// libraries that keep one for the life of the process.
var ignored = []string{
	"testing.Main(",
	"testing.tRunner(",
	"testing.(*M).",
	"testing.runTests",
	"created by runtime.gc",
	"created by runtime/trace",
	"runtime.MHeap_Scavenger",
	"signal.signal_recv",
	"os/signal.loop",
	"runtime_mcall",
	"goroutine in C code",
	"runtime.ensureSigM",
	// grpc-go's process-wide callback serializer and resolver goroutines.
	"google.golang.org/grpc/internal/grpcsync.NewCallbackSerializer",
}

// Main runs the tests and, when they passed, fails the binary if goroutines
// the tests started still run after Timeout (extra names stacks to ignore,
// as substrings); GCCL_LEAKCHECK=0 skips the check. Use it as TestMain's
// body: func TestMain(m *testing.M) { leakcheck.Main(m) }.
func Main(m *testing.M, extra ...string) { os.Exit(Run(m, nil, extra...)) }

// Run is Main for a TestMain with more to do: it runs the tests, then
// cleanup (which may end goroutines the package keeps across tests), then
// the check, and returns the exit code.
func Run(m *testing.M, cleanup func(), extra ...string) int {
	before := map[string]bool{}
	for _, g := range goroutines(nil) {
		before[g.id] = true
	}
	code := m.Run()
	if cleanup != nil {
		cleanup()
	}
	if code == 0 && os.Getenv("GCCL_LEAKCHECK") != "0" {
		if left := Wait(Timeout, before, extra...); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "leakcheck: %d goroutines still running %v after the tests:\n\n%s\n",
				len(left), Timeout, strings.Join(left, "\n\n"))
			code = 1
		}
	}
	return code
}

// Wait waits up to timeout for every goroutine not in before (by id) and
// not ignored to end, and returns the stacks of those still running.
func Wait(timeout time.Duration, before map[string]bool, extra ...string) []string {
	deadline := time.Now().Add(timeout)
	for {
		left := goroutines(before, extra...)
		if len(left) == 0 || time.Now().After(deadline) {
			stacks := make([]string, len(left))
			for i, g := range left {
				stacks[i] = g.stack
			}
			sort.Strings(stacks)
			return stacks
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type goroutine struct{ id, stack string }

// goroutines lists the goroutines other than the caller's, those in
// before and the ignored ones.
func goroutines(before map[string]bool, extra ...string) []goroutine {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []goroutine
	for i, g := range strings.Split(string(buf), "\n\n") {
		if i == 0 { // the caller
			continue
		}
		id, _, _ := strings.Cut(strings.TrimPrefix(g, "goroutine "), " ")
		if before[id] || isIgnored(g, extra) {
			continue
		}
		out = append(out, goroutine{id: id, stack: g})
	}
	return out
}

func isIgnored(stack string, extra []string) bool {
	for _, s := range ignored {
		if strings.Contains(stack, s) {
			return true
		}
	}
	for _, s := range extra {
		if strings.Contains(stack, s) {
			return true
		}
	}
	return false
}
