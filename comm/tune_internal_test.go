package comm

import "testing"

// intraOverNetwork: the tuner prices a host's pairs as TCP only where no
// two ranks of any host published shared memory, and some host has two.
func TestIntraOverNetwork(t *testing.T) {
	for _, c := range []struct {
		name  string
		hosts []string
		shm   []bool
		want  bool
	}{
		{"one host, shm on", []string{"a", "a", "a", "a"}, []bool{true, true, true, true}, false},
		{"one host, shm off", []string{"a", "a", "a", "a"}, []bool{false, false, false, false}, true},
		{"one host, shm off on all but one", []string{"a", "a", "a"}, []bool{false, true, false}, true},
		{"one host, shm on two", []string{"a", "a", "a"}, []bool{true, true, false}, false},
		{"one rank per host", []string{"a", "b"}, []bool{false, false}, false},
		{"two hosts, shm off", []string{"a", "a", "b", "b"}, []bool{false, false, false, false}, true},
		{"two hosts, shm on one", []string{"a", "a", "b", "b"}, []bool{false, false, true, true}, false},
		{"one rank", []string{"a"}, []bool{true}, false},
	} {
		if got := intraOverNetwork(c.hosts, c.shm); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
