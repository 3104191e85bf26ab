package records

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestBucket(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int
	}{{0, 0}, {time.Microsecond, 0}, {time.Microsecond + 1, 1}, {4 * time.Microsecond, 1}, {LatencyBounds[12], 12}, {LatencyBounds[12] + 1, 13}, {time.Hour, 13}} {
		if got := Bucket(c.d); got != c.want {
			t.Errorf("Bucket(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

func TestExpandPath(t *testing.T) {
	host, _ := os.Hostname()
	pid := strconv.Itoa(os.Getpid())
	for pattern, want := range map[string]string{
		"plain.jsonl": "plain.jsonl",
		"t-%r.jsonl":  "t-3.jsonl",
		"%h/%p/%r":    host + "/" + pid + "/3",
		"100%%-%x-%":  "100%-%x-%",
	} {
		if got := ExpandPath(pattern, "3"); got != want {
			t.Errorf("ExpandPath(%q) = %q, want %q", pattern, got, want)
		}
	}
}

// The writer drains on Wake, on its tick and at Close, appends to what
// the file held, and stops writing after a failed write.
func TestWriter(t *testing.T) {
	name := filepath.Join(t.TempDir(), "t.jsonl")
	if err := os.WriteFile(name, []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var drains atomic.Int64
	var pending atomic.Value
	pending.Store("")
	drain := func(w *Writer) {
		drains.Add(1)
		w.Write([]byte(pending.Swap("").(string)))
	}
	w, err := Open(name, drain, func(string, error) { t.Error("unexpected warning") })
	if err != nil {
		t.Fatal(err)
	}
	pending.Store("a\n")
	w.Wake()
	deadline := time.Now().Add(5 * time.Second)
	for pending.Load().(string) != "" && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	pending.Store("b\n")
	w.Close()
	got, _ := os.ReadFile(name)
	if string(got) != "old\na\nb\n" {
		t.Fatalf("file holds %q", got)
	}
	if drains.Load() < 2 {
		t.Fatalf("%d drains", drains.Load())
	}
	if _, err := Open(filepath.Join(t.TempDir(), "no", "dir"), drain, nil); err == nil {
		t.Fatal("opened a file in a missing directory")
	}
}

func TestWriterStopsAfterAFailedWrite(t *testing.T) {
	var warned []string
	w, err := Open(filepath.Join(t.TempDir(), "t"), func(w *Writer) { w.Write([]byte("x")) },
		func(msg string, err error) { warned = append(warned, msg+": "+err.Error()) })
	if err != nil {
		t.Fatal(err)
	}
	w.f.Close() // the next write fails
	w.Close()
	if len(warned) != 1 || !strings.Contains(warned[0], "writing stopped") || !w.failed {
		t.Fatalf("warnings %q, failed %v: want one, for the write", warned, w.failed)
	}
}

func TestAppendTimes(t *testing.T) {
	start := time.Unix(10, 0)
	got := string(AppendTimes(nil, start, start.Add(2*time.Millisecond), 2_000_000))
	want := `,"start_ns":10000000000,"end_ns":10002000000,"time_us":2000.000,"algbw_gbs":1.0000`
	if got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
	if got := string(AppendTimes(nil, start, start, 8)); strings.Contains(got, "algbw") {
		t.Errorf("an instant record has a bandwidth: %s", got)
	}
}
