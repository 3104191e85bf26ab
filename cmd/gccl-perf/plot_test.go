package main

import (
	"bytes"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runPlotArgs runs gccl-perf plot with args split at blanks.
func runPlotArgs(args string) (stdout, stderr string, status int) {
	var out, errOut strings.Builder
	status = run(append([]string{"plot"}, strings.Fields(args)...), &out, &errOut, testEnvironment())
	return out.String(), errOut.String(), status
}

// checkWellFormedXML fails the test if svg does not parse as XML.
func checkWellFormedXML(t *testing.T, svg []byte) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(svg))
	for {
		_, err := dec.Token()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed XML: %v", err)
		}
	}
}

// Two real runs, shared memory against TCP, on one chart.
func TestPlotGolden(t *testing.T) {
	path := filepath.Join(t.TempDir(), "chart.svg")
	_, errOut, status := runPlotArgs("testdata/plot_shm.json testdata/plot_tcp.json -o " + path)
	if status != 0 {
		t.Fatalf("exit status %d: %s", status, errOut)
	}
	svg, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	checkWellFormedXML(t, svg)
	// Two files, two placements, two panels.
	if n := bytes.Count(svg, []byte("<polyline")); n != 8 {
		t.Errorf("%d lines, want 8", n)
	}
	for _, label := range []string{
		"testdata/plot_shm.json: all_reduce, 2 ranks, SHM (out-of-place)",
		"testdata/plot_tcp.json: all_reduce, 2 ranks, TCP (in-place)",
	} {
		if !bytes.Contains(svg, []byte(">"+label+"<")) {
			t.Errorf("legend lacks %q", label)
		}
	}
	checkGolden(t, "plot.golden.svg", svg)
}

func TestPlotPlacementAndTitle(t *testing.T) {
	svg, errOut, status := runPlotArgs("--placement=in testdata/plot_shm.json -t <SHM&co>")
	if status != 0 {
		t.Fatalf("exit status %d: %s", status, errOut)
	}
	checkWellFormedXML(t, []byte(svg))
	if strings.Contains(svg, "(out-of-place)") || !strings.Contains(svg, "(in-place)") {
		t.Errorf("--placement in drew other series:\n%s", svg)
	}
	if n := strings.Count(svg, "<polyline"); n != 2 {
		t.Errorf("%d lines, want 2 (one per panel)", n)
	}
	if !strings.Contains(svg, ">&lt;SHM&amp;co&gt;</text>") {
		t.Error("the title is missing or not escaped")
	}
}

// A file with several types gets one colour and label per type.
func TestPlotGroupsWithinAFile(t *testing.T) {
	rep := &jsonReport{Test: "reduce", Ranks: 3, Transport: "INPROC", Rows: fixedRows}
	c, err := buildChart([]plotInput{{"r.json", rep}}, "out", "")
	if err != nil {
		t.Fatal(err)
	}
	var labels []string
	for _, s := range c.series {
		labels = append(labels, s.label)
	}
	want := "r.json: reduce, 3 ranks, INPROC, float sum (out-of-place)|" +
		"r.json: reduce, 3 ranks, INPROC, bfloat16 mulsum root 2 (out-of-place)|" +
		"r.json: reduce, 3 ranks, INPROC, f8e5m2 none root 0 (out-of-place)"
	if got := strings.Join(labels, "|"); got != want || c.title != "gccl-perf reduce" {
		t.Errorf("labels %q, title %q; want %q, gccl-perf reduce", got, c.title, want)
	}
	if c.series[0].color == c.series[1].color {
		t.Error("two groups share a colour")
	}
}

func TestPlotErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	truncated := write("truncated.json", `{"test": "all_reduce", "results": [`)
	notReport := write("other.json", `{"name": "something else"}`)
	zeroSize := write("zero.json", `{"test": "all_reduce", "results": [{"size_bytes": 0}]}`)
	for _, tc := range []struct{ args, want string }{
		{"", "no input"},
		{"-o x.svg", "no input"},
		{filepath.Join(dir, "missing.json"), "missing.json: no such file"},
		{truncated, "truncated.json: not a gccl-perf JSON report"},
		{notReport, "other.json: no results to plot"},
		{zeroSize, "no results above 0 bytes"},
		{"testdata/plot_shm.json --bogus", "unknown flag --bogus"},
		{"testdata/plot_shm.json -p sideways", `invalid placement "sideways"`},
		{"testdata/plot_shm.json -o", "flag -o needs a value"},
	} {
		out, errOut, status := runPlotArgs(tc.args)
		if status != 2 || out != "" || !strings.Contains(errOut, tc.want) || !strings.Contains(errOut, "gccl-perf plot -h") {
			t.Errorf("plot %s: status %d, stdout %q, stderr %q; want status 2 and %q", tc.args, status, out, errOut, tc.want)
		}
	}
	_, errOut, status := runPlotArgs("testdata/plot_shm.json -o " + filepath.Join(dir, "no-such-dir", "c.svg"))
	if status != 1 || !strings.Contains(errOut, "writing the chart") {
		t.Errorf("unwritable output: status %d, stderr %q; want 1", status, errOut)
	}
	out, _, status := runPlotArgs("-h")
	if status != 0 || !strings.HasPrefix(out, "Usage: gccl-perf plot") {
		t.Errorf("plot -h: status %d, output %q", status, out)
	}
}

func TestChartLabels(t *testing.T) {
	for k, want := range map[int]string{-1: "0.5", 0: "1", 3: "8", 10: "1K", 16: "64K", 25: "32M", 30: "1G", 41: "2T"} {
		if got := formatPow2(k); got != want {
			t.Errorf("formatPow2(%d) = %q, want %q", k, got, want)
		}
	}
	for v, want := range map[float64]string{0.01: "0.01", 1: "1", 100: "100", 10000: "10000", 1e5: "1e5", 1e7: "1e7"} {
		if got := formatDecade(v); got != want {
			t.Errorf("formatDecade(%g) = %q, want %q", v, got, want)
		}
	}
	for rough, want := range map[float64]float64{0: 0.2, 0.3: 0.5, 1: 1, 1.2: 2, 4: 5, 7: 10, 1300: 2000} {
		if got := niceStep(rough); got != want {
			t.Errorf("niceStep(%g) = %g, want %g", rough, got, want)
		}
	}
}
