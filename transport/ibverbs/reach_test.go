package ibverbs

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gccl/gccl/internal/verbs"
	"github.com/gccl/gccl/transport"
)

func TestReach(t *testing.T) {
	gid := func(s string) verbs.GID { g, _ := verbs.ParseGID(s); return g }
	roce2 := portAddr{Device: "mlx5_0", Port: 1, LinkLayer: verbs.LinkEthernet, GIDType: verbs.GIDRoCEv2, GIDIndex: 3,
		GID: gid("::ffff:10.0.0.1"), MTU: verbs.MTU4096, QPs: 2}
	roce1 := roce2
	roce1.GIDType, roce1.GIDIndex, roce1.GID = verbs.GIDIB, 0, gid("fe80::1")
	ib := portAddr{Device: "mlx5_1", Port: 1, LinkLayer: verbs.LinkInfiniBand, GIDType: verbs.GIDIB,
		GID: gid("fe80::2"), LID: 7, MTU: verbs.MTU4096, QPs: 1}
	type side struct {
		host string
		addr *portAddr
		off  string
	}
	desc := func(rank int, s side) *transport.Descriptor {
		addrs, offs := map[string][]byte{}, map[string]string{}
		if s.addr != nil {
			addrs[Name] = s.addr.marshal()
		}
		if s.off != "" {
			offs[Name] = s.off
		}
		return transport.NewDescriptor(rank, s.host, 100+rank, addrs, offs)
	}
	for _, c := range []struct {
		name      string
		a, b      side
		ok, exp   bool
		why, why2 string // why for a -> b, and for b -> a
	}{
		{name: "no devices anywhere", a: side{host: "h0"}, b: side{host: "h1"}},
		{name: "devices on one side only", a: side{host: "h0", addr: &roce2}, b: side{host: "h1"}},
		{name: "unusable on one side, none on the other", a: side{host: "h0", off: "rxe0:1: port DOWN"}, b: side{host: "h1"}},
		{name: "RoCE v2 across hosts", a: side{host: "h0", addr: &roce2}, b: side{host: "h1", addr: &roce2}, ok: true, exp: true},
		{name: "InfiniBand across hosts", a: side{host: "h0", addr: &ib}, b: side{host: "h1", addr: &ib}, ok: true, exp: true},
		{name: "one host: usable, not expected", a: side{host: "h0", addr: &roce2}, b: side{host: "h0", addr: &roce2}, ok: true},
		{name: "one host, port down: not expected", a: side{host: "h0", off: "port DOWN"}, b: side{host: "h0", addr: &roce2},
			why: "port DOWN", why2: "on rank 0: port DOWN"},
		{name: "port down across hosts", a: side{host: "h0", off: "no usable RDMA port (mlx5_0:1: port DOWN)"}, b: side{host: "h1", addr: &roce2},
			exp: true, why: "no usable RDMA port (mlx5_0:1: port DOWN)", why2: "on rank 0: no usable RDMA port (mlx5_0:1: port DOWN)"},
		{name: "memlock on both", a: side{host: "h0", off: "RLIMIT_MEMLOCK is 65536 bytes"}, b: side{host: "h1", off: "RLIMIT_MEMLOCK is 65536 bytes"},
			exp: true, why: "RLIMIT_MEMLOCK is 65536 bytes", why2: "RLIMIT_MEMLOCK is 65536 bytes"},
		{name: "no common GID type", a: side{host: "h0", addr: &roce2}, b: side{host: "h1", addr: &roce1},
			exp: true, why: "no common GID type: mlx5_0:1 GID 3 is RoCE v2 here, mlx5_0:1 GID 0 is IB/RoCE v1 on rank 1 (set GCCL_IB_GID_INDEX)",
			why2: "no common GID type: mlx5_0:1 GID 0 is IB/RoCE v1 here, mlx5_0:1 GID 3 is RoCE v2 on rank 0 (set GCCL_IB_GID_INDEX)"},
		{name: "InfiniBand and Ethernet: two fabrics", a: side{host: "h0", addr: &ib}, b: side{host: "h1", addr: &roce2},
			why:  "no common fabric: mlx5_1:1 (InfiniBand) here, mlx5_0:1 (Ethernet) on rank 1",
			why2: "no common fabric: mlx5_0:1 (Ethernet) here, mlx5_1:1 (InfiniBand) on rank 0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := desc(0, c.a), desc(1, c.b)
			r := reach(a, b)
			require.Equal(t, transport.Reach{OK: c.ok, Expected: c.exp, Why: c.why}, r, "0 -> 1")
			r2 := reach(b, a)
			require.Equal(t, transport.Reach{OK: c.ok, Expected: c.exp, Why: c.why2}, r2, "1 -> 0")
		})
	}
}

// Through the registry's selection: IB between hosts before TCP, shared
// memory inside a host, and the downgrade WARN (or, strict, the error)
// naming the pair and the reason.
func TestSelectRoutes(t *testing.T) {
	gid, _ := verbs.ParseGID("::ffff:10.0.0.1")
	a := portAddr{Device: "rxe0", Port: 1, LinkLayer: verbs.LinkEthernet, GIDType: verbs.GIDRoCEv2, GIDIndex: 1, GID: gid, MTU: verbs.MTU1024, QPs: 2}
	shm := fakeTransport{name: "SHM", sameHost: true}
	tcp := fakeTransport{name: "TCP"}
	ts := []transport.Transport{shm, ibTransport{}, tcp}
	d := func(rank int, host string, ib []byte, off string) *transport.Descriptor {
		addrs := map[string][]byte{"SHM": []byte("x"), "TCP": []byte("x")}
		offs := map[string]string{}
		if ib != nil {
			addrs[Name] = ib
		}
		if off != "" {
			offs[Name] = off
		}
		return transport.NewDescriptor(rank, host, rank, addrs, offs)
	}
	descs := []*transport.Descriptor{d(0, "h0", a.marshal(), ""), d(1, "h0", a.marshal(), ""), d(2, "h1", a.marshal(), ""), d(3, "h1", nil, "RLIMIT_MEMLOCK is 65536 bytes, ...")}
	sel, err := transport.SelectRoutes(0, descs, ts, false)
	require.NoError(t, err)
	require.Equal(t, "SHM", sel.Via(1))
	require.Equal(t, Name, sel.Via(2))
	require.Equal(t, "TCP", sel.Via(3))
	require.Equal(t, []string{"rank 0 -> 1 via SHM", "rank 0 -> 2 via IB", "rank 0 -> 3 via TCP"}, sel.Infos)
	require.Equal(t, []string{"rank 0 -> 3 via TCP instead of IB (on rank 3: RLIMIT_MEMLOCK is 65536 bytes, ...)"}, sel.Downgrades)
	_, err = transport.SelectRoutes(0, descs, ts, true)
	require.ErrorContains(t, err, "GCCL_STRICT=1")
	require.ErrorContains(t, err, "rank 0 -> 3 via TCP instead of IB")
}

// fakeTransport reaches every rank (sameHost: those of its host).
type fakeTransport struct {
	name     string
	sameHost bool
}

func (f fakeTransport) Name() string { return f.name }
func (f fakeTransport) Listen(_ context.Context, s *transport.Setup) (transport.Listener, error) {
	return nil, nil
}
func (f fakeTransport) Reach(me, peer *transport.Descriptor) transport.Reach {
	if f.sameHost && me.Host != peer.Host {
		return transport.Reach{}
	}
	return transport.Reach{OK: true, Expected: true}
}
