package logx

import (
	"bytes"
	"log/slog"
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
