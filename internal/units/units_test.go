package units

import (
	"math"
	"testing"
	"time"
)

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "8": 8, "1024": 1024, "1K": 1 << 10, "1k": 1 << 10, "32M": 32 << 20, "32m": 32 << 20,
		"2G": 2 << 30, "2g": 2 << 30, "1.5M": 3 << 19, "0.5K": 512,
	} {
		got, err := ParseBytes(in, 1<<40)
		if err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "K", "M8", "8MB", "8X", "-1", "0.3", "2048G", "NaN"} {
		if got, err := ParseBytes(in, 1<<40); err == nil {
			t.Errorf("ParseBytes(%q) = %d, want an error", in, got)
		}
	}
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"0": 0, "90": 90 * time.Second, "0.5": 500 * time.Millisecond, "1e-9": time.Nanosecond,
		"90s": 90 * time.Second, "1h30m": 90 * time.Minute, "0s": 0, "0h0m": 0, "0.0": 0, "0e1": 0, "250ms": 250 * time.Millisecond,
	} {
		got, err := ParseDuration(in)
		if err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	// 1e-10 s rounds to zero nanoseconds: it must not pass as zero ("wait
	// forever" for some callers), nor NaN or Inf as anything.
	for _, in := range []string{"", "s", "-1", "-1s", "1e-10", "0.5ns", "NaN", "Inf", "-Inf", "1e300", "300000000000", "9000000h"} {
		if got, err := ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q) = %v, want an error", in, got)
		}
	}
}

func TestFormatMicros(t *testing.T) {
	for us, want := range map[float64]string{
		0: "   0.00", 3.14159: "   3.14", 99.994: "  99.99", 100: "  100.0", 9999.94: " 9999.9", 10000: "  10000", 1234567: "1234567",
	} {
		if got := FormatMicros(us); got != want {
			t.Errorf("FormatMicros(%v) = %q, want %q", us, got, want)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 1000: "1000", 1 << 10: "1K", 3 << 19: "1536K", 1 << 40: "1T", math.MaxInt64: "9223372036854775807"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
