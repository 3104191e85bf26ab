package units

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

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

// FuzzParseDuration: a duration from the command line or environment parses
// without panicking, to zero only from a zero spelling, never negative.
func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"90s", "2m", "90", "0", "-1", "1e300", "1e-10", "NaN", "Inf", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDuration(s)
		if err != nil {
			return
		}
		if d < 0 {
			t.Fatalf("ParseDuration(%q) = %v", s, d)
		}
		if secs, ferr := strconv.ParseFloat(s, 64); d == 0 && ferr == nil && secs != 0 {
			t.Fatalf("ParseDuration(%q) = 0 from %v s", s, secs)
		}
		if g, gerr := time.ParseDuration(s); d == 0 && gerr == nil && g == 0 && strings.ContainsAny(s, "123456789") {
			t.Fatalf("ParseDuration(%q) = 0 from a duration below 1ns", s)
		}
	})
}
