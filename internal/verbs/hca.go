package verbs

import (
	"fmt"
	"strconv"
	"strings"
)

// HCAFilter is a GCCL_IB_HCA list, with NCCL_IB_HCA's syntax: a comma list
// of device names, each optionally followed by ":port"
// ("mlx5_0:1,mlx5_1"). A name matches every device it is a prefix of
// ("mlx5" matches mlx5_0 and mlx5_10) unless the list starts with "=",
// which asks for exact names. A list starting with "^" excludes what it
// matches instead ("^mlx5_2", "^=mlx5_1"). An entry without a port matches
// every port of its devices. The zero value (an empty variable) matches
// everything.
type HCAFilter struct {
	Exclude bool // "^": use every port except those matched
	Exact   bool // "=": names must match whole
	Entries []HCAEntry
}

// HCAEntry is one item of a GCCL_IB_HCA list.
type HCAEntry struct {
	Name string
	Port int // 0: any port
}

// ParseHCAFilter reads a GCCL_IB_HCA value.
func ParseHCAFilter(s string) (HCAFilter, error) {
	var f HCAFilter
	s = strings.TrimSpace(s)
	if rest, ok := strings.CutPrefix(s, "^"); ok {
		f.Exclude, s = true, rest
	}
	if rest, ok := strings.CutPrefix(s, "="); ok {
		f.Exact, s = true, rest
	}
	if strings.HasPrefix(s, "^") {
		return HCAFilter{}, fmt.Errorf("verbs: GCCL_IB_HCA=%q: write \"^=\" (exclude exact names), not \"=^\"", s)
	}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		e := HCAEntry{Name: item}
		if name, port, ok := strings.Cut(item, ":"); ok {
			p, err := strconv.Atoi(port)
			if err != nil || p < 1 || p > 255 || name == "" {
				return HCAFilter{}, fmt.Errorf("verbs: GCCL_IB_HCA entry %q: want name or name:port (port 1-255)", item)
			}
			e = HCAEntry{Name: name, Port: p}
		}
		f.Entries = append(f.Entries, e)
	}
	return f, nil
}

// Match reports whether the filter lets port of device dev be used.
func (f HCAFilter) Match(dev string, port int) bool {
	if len(f.Entries) == 0 {
		return true
	}
	hit := false
	for _, e := range f.Entries {
		if e.Port != 0 && e.Port != port {
			continue
		}
		if f.Exact && dev == e.Name || !f.Exact && strings.HasPrefix(dev, e.Name) {
			hit = true
			break
		}
	}
	return hit != f.Exclude
}

// String writes the filter back in GCCL_IB_HCA's syntax.
func (f HCAFilter) String() string {
	var b strings.Builder
	if f.Exclude {
		b.WriteByte('^')
	}
	if f.Exact {
		b.WriteByte('=')
	}
	for i, e := range f.Entries {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.Name)
		if e.Port != 0 {
			fmt.Fprintf(&b, ":%d", e.Port)
		}
	}
	return b.String()
}
