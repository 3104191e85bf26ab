package main

import (
	"bytes"
	"io"
	"testing"
)

func TestParseTestFault(t *testing.T) {
	for spec, want := range map[string]testFault{"corrupt@1": {"corrupt", 1}, "exit@0": {"exit", 0}} {
		if got, err := parseTestFault(spec); err != nil || got != want {
			t.Errorf("parseTestFault(%q) = %+v, %v; want %+v", spec, got, err, want)
		}
	}
	for _, spec := range []string{"corrupt", "corrupt@", "corrupt@x", "exit@-1", "hang@1", "@1"} {
		if _, err := parseTestFault(spec); err == nil {
			t.Errorf("parseTestFault(%q) accepted", spec)
		}
	}
}

// The corruption touches one element of the named rank's in-place outputs
// and nothing else.
func TestCorruptFaultHook(t *testing.T) {
	hook := testFault{"corrupt", 1}.hook(io.Discard)
	clean := make([]byte, 64)
	for _, tc := range []struct {
		rank    int
		inPlace bool
		changed bool
	}{{1, true, true}, {1, false, false}, {0, true, false}} {
		out := make([]byte, len(clean))
		hook(tc.rank, tc.inPlace, out)
		diff := 0
		for i := range out {
			if out[i] != clean[i] {
				diff++
				if i/4 != corruptElement {
					t.Errorf("rank %d in place %v: byte %d changed, outside element %d", tc.rank, tc.inPlace, i, corruptElement)
				}
			}
		}
		if (diff > 0) != tc.changed {
			t.Errorf("rank %d in place %v: %d bytes changed, want changed=%v", tc.rank, tc.inPlace, diff, tc.changed)
		}
	}
	// Outputs too short to hold the element are left alone.
	short := make([]byte, corruptElement*4)
	hook(1, true, short)
	if !bytes.Equal(short, make([]byte, len(short))) {
		t.Error("a short output was changed")
	}
}
