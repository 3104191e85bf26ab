package tests

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestTelemetryFilesAcrossProcesses: a 4-process job with
// GCCL_TELEMETRY_FILE writes one file per rank (%r) holding one line per
// operation, numbered without gaps: the ranks' files have the same number
// of lines, and line i names the same collective, with the same sequence
// number and job, on every rank.
func TestTelemetryFilesAcrossProcesses(t *testing.T) {
	const np = 4
	dir := t.TempDir()
	res := run(t, 2*time.Minute, []string{"GCCL_TELEMETRY_FILE=" + filepath.Join(dir, "tel-%r.jsonl")},
		bins.run, "-np", fmt.Sprint(np), bins.collcheck)
	if res.code != 0 {
		t.Fatalf("exit %d:\n%s", res.code, res.out)
	}
	type line struct {
		Rank, Size int
		Comm       string
		N, Seq     uint64
		Kind       string
		Transport  string
		StartNs    int64 `json:"start_ns"`
		EndNs      int64 `json:"end_ns"`
		Failed     bool
	}
	files := make([][]line, np)
	for r := range np {
		f, err := os.Open(filepath.Join(dir, fmt.Sprintf("tel-%d.jsonl", r)))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var l line
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				t.Fatalf("rank %d: %q: %v", r, sc.Text(), err)
			}
			if l.Rank != r || l.Size != np || l.N != uint64(len(files[r])+1) || l.Transport != "SHM" ||
				l.Failed || l.Comm == "" || l.EndNs < l.StartNs {
				t.Fatalf("rank %d line %d: %s", r, len(files[r]), sc.Text())
			}
			files[r] = append(files[r], l)
		}
		f.Close()
	}
	if len(files[0]) < 20 {
		t.Fatalf("rank 0 wrote %d records", len(files[0]))
	}
	for r := 1; r < np; r++ {
		if len(files[r]) != len(files[0]) {
			t.Fatalf("rank %d wrote %d records, rank 0 %d", r, len(files[r]), len(files[0]))
		}
		for i, l := range files[r] {
			if o := files[0][i]; l.Kind != o.Kind || l.Seq != o.Seq || l.Comm != o.Comm {
				t.Fatalf("record %d: rank %d %+v, rank 0 %+v", i, r, l, o)
			}
		}
	}
}
