package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gccl/gccl/internal/testutil"
)

// Multi-process runs need real processes: TestMain builds gccl-perf (whose
// -np starts copies of itself) and gccl-run, once for all tests.
var bins struct{ perf, run string }

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	dir, err := os.MkdirTemp("", "gccl-perf-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bins.perf, bins.run = filepath.Join(dir, "gccl-perf"), filepath.Join(dir, "gccl-run")
	for _, b := range [][2]string{{bins.perf, "."}, {bins.run, "../gccl-run"}} {
		if out, err := exec.Command("go", "build", "-o", b[0], b[1]).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build %s: %v\n%s", b[1], err, out)
			return 1
		}
	}
	return m.Run()
}

// processResult is how a finished command exited and what it printed.
type processResult struct {
	stdout, stderr string
	status         int
	took           time.Duration
}

// runProcess runs argv with extra environment variables, failing the test
// if it takes longer than limit.
func runProcess(t *testing.T, limit time.Duration, extraEnv []string, argv ...string) processResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(append(testutil.EnvWithoutJob(), "GCCL_IB_DISABLE=1"), extraEnv...) // shm and TCP, even beside an RDMA device
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	res := processResult{stdout: stdout.String(), stderr: stderr.String(), took: time.Since(start)}
	if ctx.Err() != nil {
		t.Fatalf("%q did not finish within %v\nstdout:\n%s\nstderr:\n%s", argv, limit, res.stdout, res.stderr)
	}
	if ee, ok := err.(*exec.ExitError); ok {
		res.status = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%q: %v", argv, err)
	}
	return res
}

// perf runs gccl-perf with args (split at blanks).
func perf(t *testing.T, extraEnv []string, args string) processResult {
	t.Helper()
	return runProcess(t, 40*time.Second, extraEnv, append([]string{bins.perf}, strings.Fields(args)...)...)
}

var deviceLine = regexp.MustCompile(`^#  Rank +(\d+) Group +0 Pid +(\d+) on +(\S+) device +(\d+) \[host\] (\S+)$`)

// checkDevices checks that the header lists n ranks, in order, in n
// processes, each using transport.
func checkDevices(t *testing.T, out string, n int, transport string) {
	t.Helper()
	pids := map[string]bool{}
	rank := 0
	for _, line := range strings.Split(out, "\n") {
		m := deviceLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if m[1] != strconv.Itoa(rank) || m[5] != transport {
			t.Errorf("device line %q: want rank %d via %s", line, rank, transport)
		}
		pids[m[2]] = true
		rank++
	}
	if rank != n || len(pids) != n {
		t.Errorf("header lists %d ranks in %d processes, want %d in %d:\n%s", rank, len(pids), n, n, out)
	}
	if want := "#  Transports: all pairs via " + transport + "\n"; !strings.Contains(out, want) {
		t.Errorf("header lacks %q:\n%s", want, out)
	}
}

// checkOneCleanTable checks that out holds one table, untagged, with
// wantRows rows and no wrong elements.
func checkOneCleanTable(t *testing.T, out string, wantRows int) {
	t.Helper()
	if n := strings.Count(out, "#        (B)    (elements)"); n != 1 {
		t.Errorf("%d tables, want 1:\n%s", n, out)
	}
	if n := strings.Count(out, footerOKPrefix); n != 1 {
		t.Errorf("%d OK footers, want 1:\n%s", n, out)
	}
	if strings.Contains(out, "[rank") {
		t.Errorf("output carries rank tags:\n%s", out)
	}
	rows := tableRows(out)
	if len(rows) != wantRows {
		t.Errorf("%d rows, want %d:\n%s", len(rows), wantRows, out)
	}
	for _, r := range rows {
		if len(r) != fieldsPerRow || r[fieldWrongOut] != "0" || r[fieldWrongIn] != "0" {
			t.Errorf("row %q: want %d fields and #wrong 0", r, fieldsPerRow)
		}
	}
}

func TestMultiProcessAllReduce(t *testing.T) {
	jsonPath := filepath.Join(t.TempDir(), "shm.json")
	res := perf(t, nil, "all_reduce -np 2 -b 8 -e 64K -f 4 -c 1 -J "+jsonPath)
	if res.status != 0 {
		t.Fatalf("exit status %d\nstdout:\n%s\nstderr:\n%s", res.status, res.stdout, res.stderr)
	}
	if !strings.HasPrefix(res.stdout, "# gccl-perf all_reduce -np 2 -b 8 ") {
		t.Errorf("the header does not show the command that was run:\n%s", res.stdout)
	}
	checkDevices(t, res.stdout, 2, "SHM")
	checkOneCleanTable(t, res.stdout, 7)

	rep := readJSONReport(t, jsonPath)
	if rep.Ranks != 2 || rep.Processes != 2 || rep.Transport != "SHM" || len(rep.Devices) != 2 || len(rep.Rows) != 7 || !rep.Passed {
		t.Errorf("JSON report: ranks %d, processes %d, transport %q, %d devices, %d rows, passed %v",
			rep.Ranks, rep.Processes, rep.Transport, len(rep.Devices), len(rep.Rows), rep.Passed)
	}
	for r, d := range rep.Devices {
		want := []string{"SHM", "SHM"}
		want[r] = "" // no transport to itself
		if !reflect.DeepEqual(d.Via, want) {
			t.Errorf("rank %d via %q, want %q", r, d.Via, want)
		}
	}
}

// Every test on 3 processes, each with another -z and -a so that the
// combinations are covered without a run for each.
func TestMultiProcessEveryTest(t *testing.T) {
	for i, coll := range collectives {
		args := fmt.Sprintf("%s -np 3 -b 8 -e 1K -f 8 -n 2 -w 1 -z %d -a %d", coll.name, i%2, i%4)
		res := perf(t, nil, args)
		if res.status != 0 {
			t.Errorf("%s: exit status %d\nstdout:\n%s\nstderr:\n%s", args, res.status, res.stdout, res.stderr)
			continue
		}
		checkDevices(t, res.stdout, 3, "SHM")
		checkOneCleanTable(t, res.stdout, 3)
	}
}

// -R across processes: the buffers are shared memory that the peer maps.
func TestMultiProcessRegistered(t *testing.T) {
	res := perf(t, nil, "all_reduce -np 2 -b 64K -e 4M -f 8 -n 3 -w 1 -R 1")
	if res.status != 0 {
		t.Fatalf("exit status %d\nstdout:\n%s\nstderr:\n%s", res.status, res.stdout, res.stderr)
	}
	checkDevices(t, res.stdout, 2, "SHM")
	checkOneCleanTable(t, res.stdout, 3)
}

func TestMultiProcessOverTCP(t *testing.T) {
	res := perf(t, []string{"GCCL_SHM_DISABLE=1", "GCCL_SOCKET_IFNAME=lo"}, "all_reduce -np 2 -b 8 -e 4K -f 8 -n 5")
	if res.status != 0 {
		t.Fatalf("exit status %d\nstdout:\n%s\nstderr:\n%s", res.status, res.stdout, res.stderr)
	}
	checkDevices(t, res.stdout, 2, "TCP")
	checkOneCleanTable(t, res.stdout, 4)
}

// A bit flipped in rank 1's in-place output is counted (once per size
// whose output holds the element), fails the footer and the exit status.
func TestMultiProcessCorruptionIsCounted(t *testing.T) {
	res := perf(t, []string{testFaultVar + "=corrupt@1"}, "all_reduce -np 2 -b 8 -e 64K -f 4")
	if res.status != 1 {
		t.Errorf("exit status %d, want 1\nstderr:\n%s", res.status, res.stderr)
	}
	rows := tableRows(res.stdout)
	if len(rows) != 7 {
		t.Fatalf("%d rows, want 7:\n%s", len(rows), res.stdout)
	}
	for _, r := range rows {
		size, _ := strconv.Atoi(r[fieldSize])
		wantIn := "0"
		if size > corruptElement*4 {
			wantIn = "1"
		}
		if r[fieldWrongOut] != "0" || r[fieldWrongIn] != wantIn {
			t.Errorf("row %q: #wrong out-of-place %s in-place %s, want 0 and %s", r, r[fieldWrongOut], r[fieldWrongIn], wantIn)
		}
	}
	if want := footerBadPrefix + "6 FAILED"; !strings.Contains(res.stdout, want) {
		t.Errorf("footer does not say %q:\n%s", want, res.stdout)
	}
}

// A rank that dies takes the job down at once, not after the
// communicator's timeout, and the exit status says so.
func TestMultiProcessRankFailure(t *testing.T) {
	res := perf(t, []string{testFaultVar + "=exit@1"}, "all_reduce -np 3 -b 8 -e 64K -f 4")
	if res.status == 0 {
		t.Fatalf("exit status 0 although rank 1 died\nstdout:\n%s", res.stdout)
	}
	if !strings.Contains(res.stderr, "rank 1") {
		t.Errorf("stderr does not name rank 1:\n%s", res.stderr)
	}
	if res.took > 20*time.Second {
		t.Errorf("took %v to stop", res.took)
	}
	if n := strings.Count(res.stdout, footerBadPrefix); n != 0 {
		t.Errorf("a failed run printed a footer:\n%s", res.stdout)
	}
}

// Started by gccl-run, gccl-perf is one rank of its job: rank 0 prints the
// only table (tagged by gccl-run), the others print nothing.
func TestRankModeUnderGcclRun(t *testing.T) {
	res := runProcess(t, 40*time.Second, nil, bins.run, "-np", "2", bins.perf, "all_reduce", "-b", "8", "-e", "64K", "-f", "4")
	if res.status != 0 {
		t.Fatalf("exit status %d\nstdout:\n%s\nstderr:\n%s", res.status, res.stdout, res.stderr)
	}
	var untagged []string
	for _, line := range strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n") {
		l, ok := strings.CutPrefix(line, "[rank 0] ")
		if !ok {
			t.Errorf("stdout line not from rank 0: %q", line)
		}
		untagged = append(untagged, l)
	}
	out := strings.Join(untagged, "\n")
	checkDevices(t, out, 2, "SHM")
	checkOneCleanTable(t, out, 7)

	// In-process ranks inside a job are refused, on every rank.
	res = runProcess(t, 40*time.Second, nil, bins.run, "-np", "2", bins.perf, "all_reduce", "-g", "2")
	if res.status != 2 || !strings.Contains(res.stderr, "-g 2 with 2 processes") {
		t.Errorf("-g 2 in a job: exit status %d, stderr:\n%s", res.status, res.stderr)
	}
}
