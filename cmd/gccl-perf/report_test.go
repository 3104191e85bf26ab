package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// checkGolden compares got with testdata/name, or rewrites it with -update.
func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// fixedRows exercise every time format, N/A and wrong counts.
var fixedRows = []row{
	{Bytes: 8, Count: 2, Type: "float", RedOp: "sum", Root: -1,
		OutOfPlace: placementResult{TimeUs: 12.345, AlgBW: 0.000648, BusBW: 0.000972, Checked: true},
		InPlace:    placementResult{TimeUs: 11.5, AlgBW: 0.000696, BusBW: 0.001043, Checked: true}},
	{Bytes: 1048576, Count: 262144, Type: "bfloat16", RedOp: "mulsum", Root: 2,
		OutOfPlace: placementResult{TimeUs: 456.78, AlgBW: 2.29559, BusBW: 3.44339, Checked: true, Wrong: 3},
		InPlace:    placementResult{TimeUs: 999.99, AlgBW: 1.04858, BusBW: 1.57287, Checked: true}},
	{Bytes: 134217728, Count: 33554432, Type: "f8e5m2", RedOp: "none", Root: 0,
		OutOfPlace: placementResult{TimeUs: 123456.7, AlgBW: 1087.16, BusBW: 951.27},
		InPlace:    placementResult{TimeUs: 10000, AlgBW: 13421.77, BusBW: 11744.05}},
}

func TestTableGolden(t *testing.T) {
	cfg, err := parseArgs(strings.Fields("reduce -g 3 -b 8 -e 128M -f 2 -z 1"))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	writeHeader(&buf, headerInfo{commandLine: commandLine(cfg.args), cfg: cfg, devices: inProcessDevices(3, 31337, "node-7")})
	writeTableHeader(&buf)
	for i := range fixedRows {
		writeRow(&buf, &fixedRows[i])
	}
	outOfBounds, avg := summarize(fixedRows)
	writeFooter(&buf, outOfBounds, avg)
	checkGolden(t, "table.golden", buf.Bytes())
}

// The header of a job of 4 processes on two hosts: shared memory inside a
// host, TCP across.
func TestMultiProcessHeaderGolden(t *testing.T) {
	cfg, err := parseArgsInJob(strings.Fields("all_gather -b 1K -e 1M -f 2"), 4)
	if err != nil {
		t.Fatal(err)
	}
	devices := devicesWithVia(",SHM,TCP,TCP", "SHM,,TCP,TCP", "TCP,TCP,,SHM", "TCP,TCP,SHM,")
	for r := range devices {
		devices[r].Host = []string{"node-a", "node-b"}[r/2]
		devices[r].Device = r % 2
	}
	var buf bytes.Buffer
	writeHeader(&buf, headerInfo{commandLine: commandLine(cfg.args), cfg: cfg, devices: devices})
	checkGolden(t, "header_np4.golden", buf.Bytes())
}

// Under -M device the header says so, and each rank's line names its GPU
// where nccl-tests does: 3 ranks on 2 GPUs share them in turn.
func TestDeviceMemoryHeaderGolden(t *testing.T) {
	cfg, err := parseArgs(strings.Fields("all_reduce -g 3 -M device -b 8 -e 1M -f 2"))
	if err != nil {
		t.Fatal(err)
	}
	devices := inProcessDevices(3, 31337, "node-7")
	for r := range devices {
		devices[r].Device = r % 2
		devices[r].BusID = fmt.Sprintf("0000:%02X:00.0", 0x3B+r%2)
	}
	var buf bytes.Buffer
	writeHeader(&buf, headerInfo{commandLine: commandLine(cfg.args), cfg: cfg, devices: devices})
	checkGolden(t, "header_device.golden", buf.Bytes())
}

// inProcessDevices describes n ranks of one process.
func inProcessDevices(n, pid int, host string) []rankInfo {
	devices := make([]rankInfo, n)
	for r := range devices {
		devices[r] = rankInfo{Rank: r, Pid: pid, Host: host, Device: r, Via: make([]string, n)}
		for p := range n {
			if p != r {
				devices[r].Via[p] = "INPROC"
			}
		}
	}
	return devices
}

func TestSummarize(t *testing.T) {
	outOfBounds, avg := summarize(fixedRows)
	if outOfBounds != 1 {
		t.Errorf("out of bounds %d, want 1 (one checked half had wrong elements)", outOfBounds)
	}
	want := (0.000972 + 0.001043 + 3.44339 + 1.57287 + 951.27 + 11744.05) / 6
	if avg != want {
		t.Errorf("avg busbw %v, want %v", avg, want)
	}
}

func TestCommandLineQuotes(t *testing.T) {
	got := commandLine([]string{"all_reduce", "-J", "my results.json", ""})
	if want := `gccl-perf all_reduce -J "my results.json" ""`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestJSONRoundTrip(t *testing.T) {
	in := &jsonReport{
		Library: "gccl", Version: version, Test: "reduce", CommandLine: "gccl-perf reduce -g 3",
		Ranks: 3, Transport: "INPROC", Hostname: "node-7", CPUModel: "Test CPU @ 3.00GHz", NumCPU: 2,
		GoVersion: "go1.26.0", GOOS: "linux", GOARCH: "amd64", Date: "2025-01-02T03:04:05Z",
		Settings: jsonConfig{MinBytes: 8, MaxBytes: 128 << 20, StepBytes: 1 << 20, StepFactor: 2, Iters: 20,
			WarmupIters: 5, AggIters: 1, Check: 1, Blocking: true, Average: "mean"},
		Rows: fixedRows, OutOfBounds: 1, AvgBusBW: 2116.7232, Passed: false,
	}
	var buf bytes.Buffer
	if err := writeJSON(&buf, in); err != nil {
		t.Fatal(err)
	}
	out, err := decodeJSONReport(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Errorf("round trip changed the report:\nin  %+v\nout %+v", in, out)
	}
	for _, key := range []string{`"out_of_place"`, `"in_place"`, `"busbw_gbps"`, `"wrong"`, `"transport": "INPROC"`, `"cpu_model"`} {
		if !bytes.Contains(buf.Bytes(), []byte(key)) {
			t.Errorf("JSON lacks %s:\n%s", key, buf.Bytes())
		}
	}
}

func TestCPUModel(t *testing.T) {
	if got, want := cpuModel(filepath.Join("testdata", "cpuinfo.txt")), "Example CPU Model 9000 @ 2.40GHz"; got != want {
		t.Errorf("cpuModel = %q, want %q", got, want)
	}
	if got := cpuModel(filepath.Join("testdata", "no-such-file")); got == "" {
		t.Error("no fallback for a missing cpuinfo")
	}
}

// readJSONReport reads and decodes the -J file at path, failing t on any
// error.
func readJSONReport(t *testing.T, path string) *jsonReport {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := decodeJSONReport(b)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// decodeJSONReport reads a -J file strictly: a field the report does not
// define is an error.
func decodeJSONReport(b []byte) (*jsonReport, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var r jsonReport
	err := dec.Decode(&r)
	return &r, err
}
