// Package hostlist expands Slurm host lists such as "gpu[01-03,7],login1"
// into host names, as `scontrol show hostnames` does. Launchers and the
// bootstrap use it to find the job's first host (the rendezvous master).
package hostlist

import (
	"fmt"
	"strconv"
	"strings"
)

// maxHosts bounds an expansion so that a typo like "n[1-999999999]" fails
// instead of exhausting memory.
const maxHosts = 1 << 20

// Expand returns the hosts of list in order.
func Expand(list string) ([]string, error) {
	var hosts []string
	for _, item := range splitTop(list) {
		if item == "" {
			continue
		}
		names, err := expandItem(item)
		if err != nil {
			return nil, fmt.Errorf("hostlist %q: %w", list, err)
		}
		hosts = append(hosts, names...)
		if len(hosts) > maxHosts {
			return nil, fmt.Errorf("hostlist %q: more than %d hosts", list, maxHosts)
		}
	}
	return hosts, nil
}

// First returns the first host of list.
func First(list string) (string, error) {
	items := splitTop(list)
	if len(items) == 0 || items[0] == "" {
		return "", fmt.Errorf("hostlist %q is empty", list)
	}
	// Expanding only the first item keeps this cheap for huge lists.
	names, err := expandItem(items[0])
	if err != nil {
		return "", fmt.Errorf("hostlist %q: %w", list, err)
	}
	return names[0], nil
}

// splitTop splits on commas outside brackets.
func splitTop(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	return append(out, strings.TrimSpace(s[start:]))
}

// expandItem expands one name with any number of bracket groups, e.g.
// "rack[1-2]-node[01-02]" (the cartesian product, in order).
func expandItem(item string) ([]string, error) {
	open := strings.IndexByte(item, '[')
	if open < 0 {
		if strings.ContainsRune(item, ']') {
			return nil, fmt.Errorf("unbalanced ']' in %q", item)
		}
		return []string{item}, nil
	}
	end := strings.IndexByte(item[open:], ']')
	if end < 0 {
		return nil, fmt.Errorf("unbalanced '[' in %q", item)
	}
	end += open
	prefix, body, rest := item[:open], item[open+1:end], item[end+1:]
	suffixes, err := expandItem(rest)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range strings.Split(body, ",") {
		lo, hi, width, err := parseRange(r)
		if err != nil {
			return nil, err
		}
		if hi-lo+1 > maxHosts || len(out)+(hi-lo+1)*len(suffixes) > maxHosts {
			return nil, fmt.Errorf("range %q too large", r)
		}
		for v := lo; v <= hi; v++ {
			num := fmt.Sprintf("%0*d", width, v)
			for _, s := range suffixes {
				out = append(out, prefix+num+s)
			}
		}
	}
	return out, nil
}

// parseRange parses "7" or "01-10"; width is the zero-padded width.
func parseRange(r string) (lo, hi, width int, err error) {
	a, b, isRange := strings.Cut(strings.TrimSpace(r), "-")
	if a == "" || (isRange && b == "") {
		return 0, 0, 0, fmt.Errorf("bad range %q", r)
	}
	if lo, err = strconv.Atoi(a); err != nil || lo < 0 {
		return 0, 0, 0, fmt.Errorf("bad number in range %q", r)
	}
	hi = lo
	if isRange {
		if hi, err = strconv.Atoi(b); err != nil || hi < lo {
			return 0, 0, 0, fmt.Errorf("bad range %q", r)
		}
	}
	if len(a) > 1 && a[0] == '0' {
		width = len(a)
	}
	return lo, hi, width, nil
}
