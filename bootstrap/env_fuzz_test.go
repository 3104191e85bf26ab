package bootstrap

import "testing"

// FuzzParseDuration: GCCL_BOOTSTRAP_TIMEOUT and GCCL_HEARTBEAT_TIMEOUT
// parse without panicking, to a positive duration or an error.
func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"90s", "2m", "90", "0", "-1", "1e300", "1e-10", "NaN", "Inf", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := parseDuration(s)
		if err == nil && d <= 0 {
			t.Fatalf("parseDuration(%q) = %v, not positive", s, d)
		}
	})
}
