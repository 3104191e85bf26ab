package main

import (
	"github.com/gccl/gccl/internal/units"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gccl/gccl/comm"
)

// modelTimer runs the loop but reports a modelled time: 5 µs per operation
// plus 1 ns per byte, rank r 100·r ns slower, so that tables are
// reproducible and -a has something to combine.
func modelTimer(m measurement, loop func() error) (time.Duration, error) {
	err := loop()
	perOp := 5*time.Microsecond + time.Duration(m.bytes) + time.Duration(m.rank)*100*time.Nanosecond
	return perOp * time.Duration(m.ops), err
}

// testEnvironment pins everything a run takes from the machine.
func testEnvironment() *environment {
	return &environment{
		hostname: "testhost", pid: 4242, cpuModel: "Test CPU", numCPU: 2, goVersion: "go-test",
		now:        func() time.Time { return time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC) },
		timer:      modelTimer,
		commConfig: comm.Config{Timeout: 30 * time.Second}, // fail, don't hang
	}
}

// runMain runs the program as main would and returns its output and status.
func runMain(t *testing.T, env *environment, args string) (stdout, stderr string, status int) {
	t.Helper()
	var out, errOut strings.Builder
	status = run(strings.Fields(args), &out, &errOut, env)
	return out.String(), errOut.String(), status
}

// tableRows returns the fields of the table's data lines.
func tableRows(out string) [][]string {
	var rows [][]string
	for _, line := range strings.Split(out, "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			rows = append(rows, strings.Fields(line))
		}
	}
	return rows
}

// Field positions in a data line.
const (
	fieldSize       = 0
	fieldBusBWOut   = 7
	fieldWrongOut   = 8
	fieldWrongIn    = 12
	fieldsPerRow    = 13
	footerOKPrefix  = "# Out of bounds values : 0 OK"
	footerBadPrefix = "# Out of bounds values : "
)

func TestAllReduceEndToEnd(t *testing.T) {
	env := testEnvironment()
	env.timer = wallClock // the real clock, as main uses
	out, errOut, status := runMain(t, env, "all_reduce -g 2 -b 8 -e 64K -f 4 -c 1")
	if status != 0 {
		t.Fatalf("exit status %d, stderr %s\n%s", status, errOut, out)
	}
	rows := tableRows(out)
	var sizes []string
	for _, r := range rows {
		if len(r) != fieldsPerRow {
			t.Fatalf("row %q has %d fields, want %d", r, len(r), fieldsPerRow)
		}
		if r[fieldWrongOut] != "0" || r[fieldWrongIn] != "0" {
			t.Errorf("row %q: #wrong not 0", r)
		}
		sizes = append(sizes, r[fieldSize])
	}
	if got, want := strings.Join(sizes, " "), "8 32 128 512 2048 8192 32768"; got != want {
		t.Errorf("sizes %s, want %s", got, want)
	}
	if !strings.Contains(out, footerOKPrefix) || !strings.Contains(out, "# Avg bus bandwidth    : ") {
		t.Errorf("footer missing:\n%s", out)
	}
}

// Every test, every placement, blocking and not, aggregating 2 operations
// per iteration, at 3 ranks, with a size (8 bytes) that rounds to nothing
// for the tests that split data.
func TestEveryTestEndToEnd(t *testing.T) {
	for _, coll := range collectives {
		for _, blocking := range []string{"0", "1"} {
			args := coll.name + "_perf -g 3 -b 8 -e 4K -f 8 -n 3 -w 2 -m 2 -z " + blocking
			out, errOut, status := runMain(t, testEnvironment(), args)
			if status != 0 {
				t.Errorf("%s: exit status %d, stderr %s\n%s", args, status, errOut, out)
				continue
			}
			rows := tableRows(out)
			if len(rows) != 4 {
				t.Errorf("%s: %d rows, want 4\n%s", args, len(rows), out)
			}
			for _, r := range rows {
				if r[fieldWrongOut] != "0" || r[fieldWrongIn] != "0" {
					t.Errorf("%s: row %q: #wrong not 0", args, r)
				}
			}
			if !strings.Contains(out, footerOKPrefix) {
				t.Errorf("%s: footer not OK\n%s", args, out)
			}
		}
	}
}

// -R: every test on buffers from comm.Alloc, at sizes where all-reduce
// takes the symmetric-memory path, with every check passing.
func TestRegisteredBuffers(t *testing.T) {
	for _, coll := range collectives {
		args := coll.name + " -g 3 -b 1K -e 1M -f 32 -n 2 -w 1 -R 1"
		out, errOut, status := runMain(t, testEnvironment(), args)
		if status != 0 {
			t.Errorf("%s: exit status %d, stderr %s\n%s", args, status, errOut, out)
			continue
		}
		if !strings.Contains(out, "# Registered buffers: send and receive buffers come from comm.Comm.Alloc") {
			t.Errorf("%s: the header does not say the buffers are registered:\n%s", args, out)
		}
		rows := tableRows(out)
		if len(rows) != 3 {
			t.Errorf("%s: %d rows, want 3\n%s", args, len(rows), out)
		}
		for _, r := range rows {
			if r[fieldWrongOut] != "0" || r[fieldWrongIn] != "0" {
				t.Errorf("%s: row %q: #wrong not 0", args, r)
			}
		}
	}
}

// Every type, op and root against the real library: the check patterns
// must hold for all of them.
func TestEveryTypeOpAndRoot(t *testing.T) {
	for _, coll := range collectives {
		args := coll.name + " -g 3 -b 96 -e 96 -d all -o all -r all -n 1 -w 1 -c 2"
		out, errOut, status := runMain(t, testEnvironment(), args)
		if status != 0 {
			t.Errorf("%s: exit status %d, stderr %s\n%s", args, status, errOut, out)
			continue
		}
		want := len(dataTypes)
		if coll.reducing {
			want *= len(redOps)
		}
		if coll.rooted {
			want *= 3
		}
		if rows := tableRows(out); len(rows) != want {
			t.Errorf("%s: %d rows, want %d", args, len(rows), want)
		}
	}
}

func TestEndToEndGolden(t *testing.T) {
	out, errOut, status := runMain(t, testEnvironment(), "all_reduce -g 2 -b 8 -e 64K -f 4")
	if status != 0 {
		t.Fatalf("exit status %d, stderr %s", status, errOut)
	}
	checkGolden(t, "all_reduce_g2.golden", []byte(out))
}

// A corrupted output element must be counted, fail the footer and the exit
// status: the hook flips a bit of element 3 of rank 1's in-place output.
func TestPlantedCorruptionIsCaught(t *testing.T) {
	env := testEnvironment()
	const elem = 3
	env.afterCheckOp = func(rank int, inPlace bool, out []byte) {
		if rank == 1 && inPlace && len(out) > elem*4 {
			out[elem*4+1] ^= 0x40
		}
	}
	jsonPath := filepath.Join(t.TempDir(), "r.json")
	out, _, status := runMain(t, env, "all_reduce -g 2 -b 8 -e 64K -f 4 -J "+jsonPath)
	if status != 1 {
		t.Errorf("exit status %d, want 1", status)
	}
	for _, r := range tableRows(out) {
		size, _ := strconv.Atoi(r[fieldSize])
		wantIn := "0"
		if size > elem*4 { // the output holds element 3: every size but 8
			wantIn = "1"
		}
		if r[fieldWrongOut] != "0" || r[fieldWrongIn] != wantIn {
			t.Errorf("row %q: #wrong out-of-place %s in-place %s, want 0 and %s", r, r[fieldWrongOut], r[fieldWrongIn], wantIn)
		}
	}
	if want := footerBadPrefix + "6 FAILED"; !strings.Contains(out, want) {
		t.Errorf("footer does not say %q:\n%s", want, out)
	}
	rep := readJSONReport(t, jsonPath)
	if rep.Passed || rep.OutOfBounds != 6 || rep.Rows[1].InPlace.Wrong != 1 {
		t.Errorf("JSON: passed %v, out of bounds %d, row 1 in-place wrong %d", rep.Passed, rep.OutOfBounds, rep.Rows[1].InPlace.Wrong)
	}
}

// -J writes what the table shows, plus the run's context.
func TestJSONFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.json")
	out, errOut, status := runMain(t, testEnvironment(), "reduce_scatter -g 3 -b 3K -e 12K -f 2 -d bfloat16 -o max -J "+path)
	if status != 0 {
		t.Fatalf("exit status %d, stderr %s", status, errOut)
	}
	rep := readJSONReport(t, path)
	if rep.Test != "reduce_scatter" || rep.Ranks != 3 || rep.Transport != "INPROC" || rep.Version != version ||
		rep.Hostname != "testhost" || rep.CPUModel != "Test CPU" || rep.GoVersion != "go-test" ||
		rep.Date != "2025-01-02T03:04:05Z" || rep.Settings.MaxBytes != 12<<10 || !rep.Passed || rep.Memory != "host" ||
		rep.CommandLine != "gccl-perf reduce_scatter -g 3 -b 3K -e 12K -f 2 -d bfloat16 -o max -J "+path {
		t.Errorf("report context: %+v", rep)
	}
	rows := tableRows(out)
	if len(rep.Rows) != len(rows) {
		t.Fatalf("%d JSON rows, %d table rows", len(rep.Rows), len(rows))
	}
	for i, jr := range rep.Rows {
		tr := rows[i]
		if strconv.FormatInt(jr.Bytes, 10) != tr[0] || strconv.FormatInt(jr.Count, 10) != tr[1] || jr.Type != tr[2] ||
			jr.RedOp != tr[3] || strconv.Itoa(jr.Root) != tr[4] || units.FormatMicros(jr.OutOfPlace.TimeUs) != padTime(tr[5]) ||
			!jr.InPlace.Checked || jr.InPlace.Wrong != 0 {
			t.Errorf("JSON row %+v does not match table row %q", jr, tr)
		}
	}
}

func padTime(s string) string { return strings.Repeat(" ", max(0, 7-len(s))) + s }

func TestCheckDisabledPrintsNA(t *testing.T) {
	out, _, status := runMain(t, testEnvironment(), "broadcast -g 2 -b 64 -e 64 -c 0")
	if status != 0 {
		t.Fatalf("exit status %d", status)
	}
	rows := tableRows(out)
	if len(rows) != 1 || rows[0][fieldWrongOut] != "N/A" || rows[0][fieldWrongIn] != "N/A" {
		t.Errorf("rows %q, want #wrong N/A", rows)
	}
	if !strings.Contains(out, "validation: 0") {
		t.Errorf("header does not say validation: 0:\n%s", out)
	}
}

func TestCommandLineErrors(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{"all_reduce -np 2 -g 2", "-g 2 with 2 processes: several in-process ranks per process are not supported yet"},
		{"all_reduce -b 1X", `invalid value "1X" for -b/--minbytes`},
		{"nonsense", `unknown test "nonsense"`},
	} {
		out, errOut, status := runMain(t, testEnvironment(), tc.args)
		if status != 2 || out != "" || !strings.Contains(errOut, tc.want) || !strings.Contains(errOut, "gccl-perf -h") {
			t.Errorf("%q: status %d, stdout %q, stderr %q; want status 2 and %q", tc.args, status, out, errOut, tc.want)
		}
	}
	out, _, status := runMain(t, testEnvironment(), "-h")
	if status != 0 || !strings.HasPrefix(out, "Usage: gccl-perf <test> [flags]") {
		t.Errorf("-h: status %d, output %q", status, out)
	}
}

func TestCombineTimes(t *testing.T) {
	times := []time.Duration{30, 10, 50}
	for mode, want := range map[averageMode]time.Duration{averageRank0: 30, averageMean: 30, averageMin: 10, averageMax: 50} {
		if got := combineTimes(times, mode); got != want {
			t.Errorf("-a %d: %v, want %v", mode, got, want)
		}
	}
	// The modes reach the table: the model makes rank 1 slower than rank 0.
	rank0, _, _ := runMain(t, testEnvironment(), "all_gather -g 2 -b 1K -e 1K -a 0")
	slowest, _, _ := runMain(t, testEnvironment(), "all_gather -g 2 -b 1K -e 1K -a 3")
	r0, r3 := tableRows(rank0)[0][5], tableRows(slowest)[0][5]
	if r0 != "6.02" || r3 != "6.12" {
		t.Errorf("-a 0 time %s, -a 3 time %s; want 6.02 and 6.12", r0, r3)
	}
}

// --simulate prints the cost model's table for a topology file: on the IBM
// 8xH100 dump the large ring all-reduce must come within 20% of the
// ~370 GB/s busbw published for 8 H100s on NVLink.
func TestSimulate(t *testing.T) {
	file := "../../topo/testdata/ibm-gx3d-8xH100-nvswitch-roce-topo-dump.xml"
	out, errOut, status := runMain(t, testEnvironment(), "all_reduce --simulate --topo-file "+file+" -b 1G -e 8G -f 8")
	if status != 0 {
		t.Fatalf("exit status %d, stderr %s\n%s", status, errOut, out)
	}
	if !strings.Contains(out, "# Predicted by gccl's cost model, not measured") {
		t.Errorf("the table does not say it is a prediction:\n%s", out)
	}
	rows := tableRows(out)
	if len(rows) != 2 {
		t.Fatalf("%d rows, want 2:\n%s", len(rows), out)
	}
	last := rows[len(rows)-1]
	busbw, err := strconv.ParseFloat(last[fieldBusBWOut], 64)
	if err != nil {
		t.Fatalf("row %q: %v", last, err)
	}
	if busbw < 0.8*370 || busbw > 1.2*370 {
		t.Errorf("predicted busbw %.1f GB/s at 8 GiB, want 370 +- 20%%", busbw)
	}
	for _, tc := range []struct{ args, want string }{
		{"all_reduce --simulate", "--simulate needs --topo-file"},
		{"alltoall --simulate --topo-file " + file, "does not cover alltoall"},
		{"all_reduce --simulate --topo-file /nonexistent.xml", "nonexistent"},
	} {
		_, errOut, status := runMain(t, testEnvironment(), tc.args)
		if status == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: status %d, stderr %q; want failure with %q", tc.args, status, errOut, tc.want)
		}
	}
}
