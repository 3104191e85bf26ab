package units

import "testing"

// FuzzParseBytes: a size from the command line or environment parses
// without panicking, within [0, max].
func FuzzParseBytes(f *testing.F) {
	for _, s := range []string{"8", "64K", "1.5M", "2g", "", "-1", "9999999999G", "1e3"} {
		f.Add(s, int64(1<<40))
	}
	f.Fuzz(func(t *testing.T, s string, max int64) {
		v, err := ParseBytes(s, max)
		if err == nil && (v < 0 || v > max) {
			t.Fatalf("ParseBytes(%q, %d) = %d", s, max, v)
		}
	})
}
