package tcp

import "github.com/gccl/gccl/internal/netif"

// Interface is a network interface that the transport can bind to
// (internal/netif, shared with the p2p agent).
type Interface = netif.Interface

// IfSpec is an interface filter in NCCL_SOCKET_IFNAME syntax (see
// netif.IfSpec).
type IfSpec = netif.IfSpec

// ParseIfSpec parses an NCCL_SOCKET_IFNAME-style filter (netif.ParseIfSpec).
func ParseIfSpec(s string) IfSpec { return netif.ParseIfSpec(s) }

// SelectInterfaces returns the up interfaces with a usable address that
// spec selects (netif.Select). Listen reads the environment
// (GCCL_SOCKET_IFNAME) when its Config names no interface; this function
// does not.
func SelectInterfaces(spec string) ([]Interface, error) { return netif.Select(spec) }
