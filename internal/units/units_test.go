package units

import (
	"math"
	"testing"
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
