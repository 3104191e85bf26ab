package logx

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLevelsAndSubsystems(t *testing.T) {
	var buf bytes.Buffer
	l := New(&buf, "INFO", "INIT,COLL")
	l.Info("rank 0 -> 1 via SHM", "subsys", "INIT")
	l.Info("hidden", "subsys", "NET")
	l.Debug("hidden too", "subsys", "INIT")
	out := buf.String()
	if !strings.Contains(out, "INFO INIT rank 0 -> 1 via SHM") {
		t.Fatalf("missing INFO line: %q", out)
	}
	if strings.Contains(out, "hidden") {
		t.Fatalf("filtered record printed: %q", out)
	}

	buf.Reset()
	l = New(&buf, "", "^NET").With("rank", 3)
	l.Info("not at WARN", "subsys", "INIT")
	l.Warn("downgrade", "subsys", "INIT")
	l.Warn("excluded", "subsys", "NET")
	if got := buf.String(); !strings.Contains(got, "WARN INIT downgrade rank=3") || strings.Contains(got, "excluded") || strings.Contains(got, "not at WARN") {
		t.Fatalf("got %q", got)
	}
	if ParseLevel("trace") != LevelTrace || ParseLevel("bogus") != slog.LevelWarn {
		t.Fatal("ParseLevel")
	}
}

func TestDebugFileNames(t *testing.T) {
	for _, tc := range []struct{ pattern, want string }{
		{"/tmp/gccl.%h.%p.log", "/tmp/gccl.node7.4242.log"},
		{"plain.log", "plain.log"},
		{"100%%-%x-%", "100%-%x-%"},
	} {
		if got := ExpandDebugFile(tc.pattern, "node7", 4242); got != tc.want {
			t.Errorf("ExpandDebugFile(%q) = %q, want %q", tc.pattern, got, tc.want)
		}
	}
}

// TestDebugFile: the file is made per process, and records land in it.
func TestDebugFile(t *testing.T) {
	dir := t.TempDir()
	f, err := OpenDebugFile(filepath.Join(dir, "gccl.%p.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if want := filepath.Join(dir, fmt.Sprintf("gccl.%d.log", os.Getpid())); f.Name() != want {
		t.Fatalf("opened %s, want %s", f.Name(), want)
	}
	New(f, "INFO", "").Info("hello", "subsys", "INIT")
	b, err := os.ReadFile(f.Name())
	if err != nil || !strings.Contains(string(b), "INFO INIT hello") {
		t.Fatalf("file holds %q (%v), want the record", b, err)
	}
	if _, err := OpenDebugFile(filepath.Join(dir, "missing", "x.log")); err == nil {
		t.Fatal("a file in a missing directory opened")
	}
}
