// Package units reads and writes the quantities gccl's tools and
// environment variables share with nccl-tests: byte counts with K, M and G
// suffixes, and the seven-character time column.
package units

import (
	"errors"
	"fmt"
	"math"
	"strconv"
)

// ParseBytes reads a byte count with an optional K, M or G suffix (powers of
// 1024, either case), as nccl-tests does: 8, 64K, 1.5M, 2g. It must be a
// whole number of bytes from 0 to max.
func ParseBytes(s string, max int64) (int64, error) {
	num, unit := s, int64(1)
	if s != "" {
		switch s[len(s)-1] {
		case 'k', 'K':
			unit = 1 << 10
		case 'm', 'M':
			unit = 1 << 20
		case 'g', 'G':
			unit = 1 << 30
		}
		if unit > 1 {
			num = s[:len(s)-1]
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(f) {
		return 0, errors.New("want a byte count such as 8, 64K, 32M or 1G")
	}
	bytes := f * float64(unit)
	switch {
	case bytes < 0:
		return 0, errors.New("size must not be negative")
	case bytes > float64(max):
		return 0, fmt.Errorf("size above %s", FormatBytes(max))
	case bytes != math.Trunc(bytes):
		return 0, errors.New("not a whole number of bytes")
	}
	return int64(bytes), nil
}

// FormatMicros writes a time in microseconds seven characters wide, with
// fewer decimals as it grows, as nccl-tests' time column.
func FormatMicros(us float64) string {
	switch {
	case us >= 10000:
		return fmt.Sprintf("%7.0f", us)
	case us >= 100:
		return fmt.Sprintf("%7.1f", us)
	}
	return fmt.Sprintf("%7.2f", us)
}

// FormatBytes writes n with the largest of the suffixes K, M, G and T that
// divides it (ParseBytes reads it back).
func FormatBytes(n int64) string {
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if n != 0 && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}
