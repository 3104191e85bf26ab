package topo

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadFromFileAndDump(t *testing.T) {
	in := filepath.Join("testdata", "azure-ndv4-8xA100-ib-topo.xml")
	out := filepath.Join(t.TempDir(), "dump.xml")
	env := map[string]string{EnvTopoFile: in, EnvTopoDumpFile: out}
	g, err := Load(func(k string) string { return env[k] }, Detector{Root: "/nonexistent"})
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Nodes[GPU]) != 8 {
		t.Fatalf("%d GPUs from %s", len(g.Nodes[GPU]), in)
	}
	written, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	orig, _ := os.ReadFile(in)
	if strings.TrimSpace(string(written)) != strings.TrimSpace(string(orig)) {
		t.Error("dump differs from the file read")
	}
	// A missing or broken file is an error naming it.
	env[EnvTopoFile] = filepath.Join(t.TempDir(), "missing.xml")
	if _, err := Load(func(k string) string { return env[k] }, Detector{}); err == nil {
		t.Error("no error for a missing file")
	}
	bad := filepath.Join(t.TempDir(), "bad.xml")
	os.WriteFile(bad, []byte(`<system><cpu/></system>`), 0o644)
	env[EnvTopoFile] = bad
	if _, err := Load(func(k string) string { return env[k] }, Detector{}); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("error %v does not name %s", err, bad)
	}
	// An unwritable dump path is an error, and leaves no temporary file.
	env[EnvTopoFile] = in
	env[EnvTopoDumpFile] = filepath.Join(t.TempDir(), "no", "such", "dir", "x.xml")
	if _, err := Load(func(k string) string { return env[k] }, Detector{}); err == nil {
		t.Error("no error for an unwritable dump path")
	}
}
