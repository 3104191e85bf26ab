// Package units reads and writes the quantities gccl's tools and
// environment variables share with nccl-tests: byte counts with K, M and G
// suffixes, durations in seconds or Go's notation, and the seven-character
// time column.
package units

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
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

// ParseDuration reads a duration as a Go duration ("90s", "1h30m") or a plain
// number of seconds ("90", "0.5"), as timeout(1) users expect. It must be
// zero or from 1ns to the largest time.Duration; whether zero is allowed,
// and what it means, is the caller's to say.
func ParseDuration(s string) (time.Duration, error) {
	// Below 1ns either spelling rounds to zero, which callers read as
	// "none" or "forever": only a zero spelling may mean that.
	var d time.Duration
	if secs, err := strconv.ParseFloat(s, 64); err == nil {
		switch {
		case math.IsNaN(secs):
			return 0, errNotDuration
		case secs < 0:
			return 0, errNegativeDuration
		case secs >= float64(math.MaxInt64)/float64(time.Second): // Inf too
			return 0, fmt.Errorf("duration longer than %v", time.Duration(math.MaxInt64))
		}
		if d = time.Duration(secs * float64(time.Second)); d == 0 && secs != 0 {
			return 0, errBelowNanosecond
		}
		return d, nil
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return 0, errNotDuration
	case d < 0:
		return 0, errNegativeDuration
	case d == 0 && strings.ContainsAny(s, "123456789"): // "0.5ns"
		return 0, errBelowNanosecond
	}
	return d, nil
}

var (
	errNotDuration      = errors.New("want a duration such as 90s, 2m or 90 (seconds)")
	errNegativeDuration = errors.New("duration must not be negative")
	errBelowNanosecond  = errors.New("duration shorter than 1ns")
)

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
