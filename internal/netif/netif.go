// Package netif selects the network interfaces gccl binds to, from a filter
// in NCCL_SOCKET_IFNAME syntax (GCCL_SOCKET_IFNAME): the tcp transport and
// the p2p agent listen where it says.
package netif

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
)

// Interface is a network interface gccl can bind to.
type Interface struct {
	Name  string
	Index int
	Flags net.Flags
	// Addrs are the interface's usable addresses, IPv4 first. IPv6
	// link-local addresses are left out: they need a zone to be dialled.
	Addrs []netip.Addr
}

// Addr returns the address to bind to: the first IPv4 address
// if there is one, else the first IPv6 address.
func (i Interface) Addr() netip.Addr { return i.Addrs[0] }

// IfSpec is an interface filter in NCCL_SOCKET_IFNAME syntax: a
// comma-separated list of name prefixes ("eth,ib"); a leading ^ excludes
// the listed interfaces instead ("^docker,lo"); a leading = (after the ^,
// if any) matches whole names instead of prefixes ("=eth0", "^=docker0").
type IfSpec struct {
	Exclude bool
	Exact   bool
	Names   []string
}

// ParseIfSpec parses an NCCL_SOCKET_IFNAME-style filter. Empty elements are
// ignored, so "" and "^" are valid and match nothing and everything.
func ParseIfSpec(s string) IfSpec {
	var spec IfSpec
	s = strings.TrimSpace(s)
	if rest, ok := strings.CutPrefix(s, "^"); ok {
		spec.Exclude, s = true, rest
	}
	if rest, ok := strings.CutPrefix(s, "="); ok {
		spec.Exact, s = true, rest
	}
	for _, name := range strings.Split(s, ",") {
		if name = strings.TrimSpace(name); name != "" {
			spec.Names = append(spec.Names, name)
		}
	}
	return spec
}

// Match reports whether the filter selects the interface called name.
func (s IfSpec) Match(name string) bool {
	listed := slices.ContainsFunc(s.Names, func(n string) bool {
		if s.Exact {
			return name == n
		}
		return strings.HasPrefix(name, n)
	})
	return listed != s.Exclude
}

func (s IfSpec) String() string {
	var b strings.Builder
	if s.Exclude {
		b.WriteByte('^')
	}
	if s.Exact {
		b.WriteByte('=')
	}
	b.WriteString(strings.Join(s.Names, ","))
	return b.String()
}

// defaultIfSpecs is the search order without a filter, as in NCCL: any
// interface but loopback and docker bridges; else docker bridges; else
// loopback (a single-host job on a machine without a network).
var defaultIfSpecs = []string{"^docker,lo", "docker", "lo"}

// EnvVar is the environment variable that holds the filter
// (NCCL_SOCKET_IFNAME's counterpart).
const EnvVar = "GCCL_SOCKET_IFNAME"

// FromEnv returns the filter the environment sets (EnvVar), "" if none.
func FromEnv() string { return os.Getenv(EnvVar) }

// Select returns the up interfaces with a usable address that spec
// (NCCL_SOCKET_IFNAME syntax, see IfSpec) selects, in the system's order.
// An empty spec means the default search order: everything but loopback
// and docker*, falling back to docker* and then to loopback. It is an error
// if nothing matches. It does not read the environment: callers pass
// FromEnv() where no filter is configured.
func Select(spec string) ([]Interface, error) {
	all, err := systemInterfaces()
	if err != nil {
		return nil, err
	}
	return selectFrom(spec, all)
}

// selectFrom applies spec to a list of candidate interfaces.
func selectFrom(spec string, all []Interface) ([]Interface, error) {
	var usable []Interface
	for _, it := range all {
		if it.Flags&net.FlagUp != 0 && len(it.Addrs) > 0 {
			usable = append(usable, it)
		}
	}
	specs := []string{spec}
	if strings.TrimSpace(spec) == "" {
		specs = defaultIfSpecs
	}
	for _, s := range specs {
		f := ParseIfSpec(s)
		var out []Interface
		for _, it := range usable {
			if f.Match(it.Name) {
				out = append(out, it)
			}
		}
		if len(out) > 0 {
			return out, nil
		}
	}
	names := make([]string, len(usable))
	for i, it := range usable {
		names[i] = it.Name
	}
	if strings.TrimSpace(spec) == "" {
		return nil, fmt.Errorf("netif: no network interface is up with an address (candidates: %v)", names)
	}
	return nil, fmt.Errorf("netif: no interface matches %q among the usable ones %v (GCCL_SOCKET_IFNAME syntax: eth,ib or ^docker,lo or =eth0)", spec, names)
}

// systemInterfaces lists the host's interfaces with their usable addresses.
func systemInterfaces() ([]Interface, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("netif: listing network interfaces: %w", err)
	}
	out := make([]Interface, 0, len(ifs))
	for _, ni := range ifs {
		addrs, err := ni.Addrs()
		if err != nil {
			continue
		}
		it := Interface{Name: ni.Name, Index: ni.Index, Flags: ni.Flags}
		for _, a := range addrs {
			pfx, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(pfx.IP)
			if !ok {
				continue
			}
			it.Addrs = append(it.Addrs, ip.Unmap())
		}
		it.Addrs = usableAddrs(it.Addrs)
		out = append(out, it)
	}
	return out, nil
}

// usableAddrs drops addresses that cannot be dialled without a zone and
// puts IPv4 first.
func usableAddrs(addrs []netip.Addr) []netip.Addr {
	var v4, v6 []netip.Addr
	for _, a := range addrs {
		switch {
		case a.Is4():
			v4 = append(v4, a)
		case a.Is6() && !a.IsLinkLocalUnicast() && !a.IsLinkLocalMulticast():
			v6 = append(v6, a)
		}
	}
	return append(v4, v6...)
}
