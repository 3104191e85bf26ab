package topo

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// CPUSet is a set of logical CPU numbers.
type CPUSet struct {
	words []uint64
}

// maxCPUs bounds what masks and lists from outside may name.
const maxCPUs = 1 << 16

// Add puts cpu in the set.
func (s *CPUSet) Add(cpu int) {
	w := cpu / 64
	for len(s.words) <= w {
		s.words = append(s.words, 0)
	}
	s.words[w] |= 1 << (uint(cpu) % 64)
}

// Has reports whether cpu is in the set.
func (s CPUSet) Has(cpu int) bool {
	w := cpu / 64
	return cpu >= 0 && w < len(s.words) && s.words[w]&(1<<(uint(cpu)%64)) != 0
}

// Count returns the number of CPUs in the set.
func (s CPUSet) Count() int {
	n := 0
	for _, w := range s.words {
		n += bits.OnesCount64(w)
	}
	return n
}

// CPUs returns the members in increasing order.
func (s CPUSet) CPUs() []int {
	var out []int
	for i, w := range s.words {
		for w != 0 {
			b := bits.TrailingZeros64(w)
			out = append(out, i*64+b)
			w &^= 1 << uint(b)
		}
	}
	return out
}

// Union returns s ∪ o.
func (s CPUSet) Union(o CPUSet) CPUSet {
	n := max(len(s.words), len(o.words))
	r := CPUSet{words: make([]uint64, n)}
	for i := range r.words {
		if i < len(s.words) {
			r.words[i] |= s.words[i]
		}
		if i < len(o.words) {
			r.words[i] |= o.words[i]
		}
	}
	return r
}

// Equal reports whether both sets have the same members.
func (s CPUSet) Equal(o CPUSet) bool {
	n := max(len(s.words), len(o.words))
	for i := 0; i < n; i++ {
		var a, b uint64
		if i < len(s.words) {
			a = s.words[i]
		}
		if i < len(o.words) {
			b = o.words[i]
		}
		if a != b {
			return false
		}
	}
	return true
}

// String returns the set in Linux cpulist form: "0-23,48-71".
func (s CPUSet) String() string {
	cpus := s.CPUs()
	var parts []string
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if i == j {
			parts = append(parts, strconv.Itoa(cpus[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", cpus[i], cpus[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// Mask returns the set as a Linux cpumask ("00000000,0000ffff"): 32-bit hex
// words, most significant first, as in sysfs and NCCL's affinity attribute.
// width is the minimum number of words.
func (s CPUSet) Mask(width int) string {
	n := max(width, 2*len(s.words), 1)
	words := make([]string, n)
	for i := 0; i < n; i++ {
		var v uint32
		if i/2 < len(s.words) {
			v = uint32(s.words[i/2] >> (32 * uint(i%2)))
		}
		words[n-1-i] = fmt.Sprintf("%08x", v)
	}
	// Drop leading all-zero words beyond width, as the kernel does not
	// print more words than it has CPUs for.
	for len(words) > width && len(words) > 1 && words[0] == "00000000" {
		words = words[1:]
	}
	return strings.Join(words, ",")
}

// ParseCPUMask parses a Linux cpumask: comma-separated 32-bit hex words, most
// significant first ("ffffffff,ffffffff,ffff0000,00000000,00000000").
func ParseCPUMask(mask string) (CPUSet, error) {
	var s CPUSet
	mask = strings.TrimSpace(mask)
	if mask == "" {
		return s, fmt.Errorf("topo: empty CPU mask")
	}
	words := strings.Split(mask, ",")
	if len(words)*32 > maxCPUs {
		return s, fmt.Errorf("topo: CPU mask %q names more than %d CPUs", truncate(mask), maxCPUs)
	}
	for i, w := range words {
		if w == "" || len(w) > 8 {
			return s, fmt.Errorf("topo: bad CPU mask word %q in %q", w, truncate(mask))
		}
		v, err := strconv.ParseUint(w, 16, 32)
		if err != nil {
			return s, fmt.Errorf("topo: bad CPU mask word %q in %q", w, truncate(mask))
		}
		base := 32 * (len(words) - 1 - i)
		for b := 0; b < 32; b++ {
			if v&(1<<uint(b)) != 0 {
				s.Add(base + b)
			}
		}
	}
	return s, nil
}

// ParseCPUList parses a Linux cpulist ("0-23,48-71"; "" is the empty set).
func ParseCPUList(list string) (CPUSet, error) {
	var s CPUSet
	list = strings.TrimSpace(list)
	if list == "" {
		return s, nil
	}
	for _, part := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 || a >= maxCPUs {
			return s, fmt.Errorf("topo: bad CPU list entry %q", part)
		}
		b := a
		if isRange {
			b, err = strconv.Atoi(hi)
			if err != nil || b < a || b >= maxCPUs {
				return s, fmt.Errorf("topo: bad CPU list entry %q", part)
			}
		}
		for c := a; c <= b; c++ {
			s.Add(c)
		}
	}
	return s, nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
