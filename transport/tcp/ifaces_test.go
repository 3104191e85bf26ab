package tcp

import (
	"net"
	"net/netip"
	"slices"
)

// fakeIf is an interface called name with addrs, IPv4 first as
// netif lists them.
func fakeIf(name string, up bool, addrs ...string) Interface {
	it := Interface{Name: name}
	if up {
		it.Flags = net.FlagUp
	}
	for _, a := range addrs {
		it.Addrs = append(it.Addrs, netip.MustParseAddr(a))
	}
	slices.SortStableFunc(it.Addrs, func(a, b netip.Addr) int {
		switch {
		case a.Is4() == b.Is4():
			return 0
		case a.Is4():
			return -1
		}
		return 1
	})
	return it
}
