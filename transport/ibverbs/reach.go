package ibverbs

import (
	"fmt"

	"github.com/gccl/gccl/internal/verbs"
	"github.com/gccl/gccl/transport"
)

// reach decides whether the ranks of two descriptors connect over RDMA.
// A rank whose host has RDMA devices publishes either its port (Addr) or
// why it cannot use them (Off); a rank without devices publishes nothing.
//   - Either side without devices: nothing to expect.
//   - Both with devices, on different hosts: RDMA is expected, and a
//     side that cannot use it (port down, RLIMIT_MEMLOCK, ...) or ports
//     with no common GID type are a downgrade, with the reason.
//   - InfiniBand on one side and Ethernet on the other are two fabrics:
//     nothing to expect.
//   - Ranks of one host never expect RDMA (shared memory comes first), but
//     may use it when shared memory is off.
//
// The answer is symmetric: Reach(a, b).OK == Reach(b, a).OK.
func reach(me, peer *transport.Descriptor) transport.Reach {
	ma, pa := me.Addr(Name), peer.Addr(Name)
	moff, poff := me.Off(Name), peer.Off(Name)
	if ma == nil && moff == "" || pa == nil && poff == "" {
		return transport.Reach{}
	}
	r := transport.Reach{Expected: me.Host != peer.Host}
	switch {
	case ma == nil:
		r.Why = moff
		return r
	case pa == nil:
		r.Why = fmt.Sprintf("on rank %d: %s", peer.Rank, poff)
		return r
	}
	a, err := parseAddr(ma)
	if err != nil {
		r.Why = err.Error()
		return r
	}
	b, err := parseAddr(pa)
	if err != nil {
		r.Why = fmt.Sprintf("rank %d: %v", peer.Rank, err)
		return r
	}
	switch {
	case a.LinkLayer != b.LinkLayer:
		return transport.Reach{Why: fmt.Sprintf("no common fabric: %s (%s) here, %s (%s) on rank %d",
			a.Name(), a.LinkLayer, b.Name(), b.LinkLayer, peer.Rank)}
	case a.LinkLayer == verbs.LinkEthernet && a.GIDType != b.GIDType:
		r.Why = fmt.Sprintf("no common GID type: %s GID %d is %s here, %s GID %d is %s on rank %d (set GCCL_IB_GID_INDEX)",
			a.Name(), a.GIDIndex, a.GIDType, b.Name(), b.GIDIndex, b.GIDType, peer.Rank)
		return r
	}
	r.OK = true
	return r
}
