package tests

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTelemetryFilesAcrossProcesses: a 4-process job with
// GCCL_TELEMETRY_FILE writes one file per rank (%r) holding one line per
// operation, numbered without gaps: each rank's file lists exactly the
// collectives collcheck ran, in its order and as many as it counted, and
// line i names the same collective, with the same sequence number and
// job, on every rank.
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
	// What collcheck's round runs (tests/collcheck: round and agree).
	var want []string
	for _, count := range []int{0, 1, 7, 4097, 1<<20 + 3} {
		want = append(want, "AllReduce", "AllReduce")
		if count <= 4097 {
			want = append(want, "AllGather", "ReduceScatter", "Broadcast", "Reduce", "AllToAll")
		}
	}
	for range 3 * 3 { // three counts, three ops: an all-reduce, then SameOnEveryRank's all-gather
		want = append(want, "AllReduce", "AllGather")
	}
	for range 2 * np * 2 { // largeBroadcasts: two counts, every root, out of place and in place
		want = append(want, "Broadcast")
	}
	want = append(want, "Barrier")
	for r := range np {
		ran := fmt.Sprintf("collcheck: rank %d of %d ok, %d collectives in 1 rounds", r, np, len(want))
		if !strings.Contains(res.out, ran) {
			t.Fatalf("collcheck's output lacks %q:\n%s", ran, res.out)
		}
		if len(files[r]) != len(want) {
			t.Fatalf("rank %d wrote %d records for the %d collectives it ran", r, len(files[r]), len(want))
		}
		for i, l := range files[r] {
			if l.Kind != want[i] {
				t.Fatalf("rank %d record %d is a %s; collcheck's collective %d is a %s", r, i, l.Kind, i, want[i])
			}
		}
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
