//go:build linux && cgo

package dl

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestOpenAndSym(t *testing.T) {
	lib, err := Open("libc.so.6")
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Close()
	if lib.Sym("getpid") == nil {
		t.Error("libc.so.6 has no getpid")
	}
	if lib.Sym("gccl_no_such_symbol") != nil {
		t.Error("found a symbol that does not exist")
	}
}

// A missing library is an error carrying the loader's message, which names
// the file.
func TestOpenMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "libnothing.so.1")
	if _, err := Open(path); err == nil || !strings.Contains(err.Error(), "libnothing.so.1") {
		t.Fatalf("Open(%s): %v, want the loader's error naming it", path, err)
	}
}
