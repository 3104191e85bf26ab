package verbs

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func mustGID(t *testing.T, s string) GID {
	t.Helper()
	g, err := ParseGID(s)
	require.NoError(t, err)
	return g
}

// The GID table of a Soft-RoCE port with one IPv4 address, as the rxe VM
// shows it: the link-local and the IPv4-mapped address, each as RoCE v1
// and v2.
func rxeGIDs(t *testing.T) []GIDEntry {
	return []GIDEntry{
		{0, mustGID(t, "fe80:0000:0000:0000:d0fb:7eff:fec4:f85a"), GIDIB, "veth0"},
		{1, mustGID(t, "fe80:0000:0000:0000:d0fb:7eff:fec4:f85a"), GIDRoCEv2, "veth0"},
		{2, mustGID(t, "0000:0000:0000:0000:0000:ffff:a9fe:4d01"), GIDIB, "veth0"},
		{3, mustGID(t, "0000:0000:0000:0000:0000:ffff:a9fe:4d01"), GIDRoCEv2, "veth0"},
	}
}

func TestChooseGID(t *testing.T) {
	rxe := rxeGIDs(t)
	e, err := ChooseGID(rxe, LinkEthernet, -1)
	require.NoError(t, err)
	require.Equal(t, 3, e.Index)
	require.Equal(t, "::ffff:169.254.77.1", e.GID.String())
	require.True(t, e.GID.IPv4Mapped())

	// The order of the table does not matter.
	rev := []GIDEntry{rxe[3], rxe[2], rxe[1], rxe[0]}
	e, _ = ChooseGID(rev, LinkEthernet, -1)
	require.Equal(t, 3, e.Index)

	// Without an IPv4 address: a global IPv6 RoCE v2 GID before the
	// link-local one, and RoCE v2 before v1.
	v6 := []GIDEntry{rxe[0], rxe[1], {5, mustGID(t, "2001:db8::7"), GIDIB, "eth0"}, {6, mustGID(t, "2001:db8::7"), GIDRoCEv2, "eth0"}}
	e, _ = ChooseGID(v6, LinkEthernet, -1)
	require.Equal(t, 6, e.Index)
	e, _ = ChooseGID(v6[:2], LinkEthernet, -1)
	require.Equal(t, 1, e.Index)
	e, _ = ChooseGID([]GIDEntry{rxe[2], rxe[0]}, LinkEthernet, -1)
	require.Equal(t, 0, e.Index, "RoCE v1 only: the lowest index")

	// Unknown types (no gid_attrs) come last.
	e, _ = ChooseGID([]GIDEntry{{0, rxe[3].GID, GIDUnknown, ""}, {4, rxe[0].GID, GIDIB, ""}}, LinkEthernet, -1)
	require.Equal(t, 4, e.Index)

	// InfiniBand: the table's order (index 0, the port GID).
	ib := []GIDEntry{{0, mustGID(t, "fe80::248a:703:49:d4f0"), GIDIB, ""}, {1, mustGID(t, "fec0::248a:703:49:d4f0"), GIDIB, ""}}
	e, _ = ChooseGID(ib, LinkInfiniBand, -1)
	require.Equal(t, 0, e.Index)

	// GCCL_IB_GID_INDEX forces an index, which must be populated.
	e, err = ChooseGID(rxe, LinkEthernet, 1)
	require.NoError(t, err)
	require.Equal(t, 1, e.Index)
	_, err = ChooseGID(rxe, LinkEthernet, 7)
	require.ErrorContains(t, err, "GCCL_IB_GID_INDEX=7")
	require.ErrorContains(t, err, "0 1 2 3")

	// Zero GIDs are unused entries; a table of them has nothing to use.
	_, err = ChooseGID([]GIDEntry{{0, GID{}, GIDRoCEv2, ""}}, LinkEthernet, -1)
	require.ErrorContains(t, err, "no GID")
	_, err = ChooseGID(nil, LinkEthernet, 0)
	require.Error(t, err)
}

func TestGIDText(t *testing.T) {
	g := mustGID(t, "0000:0000:0000:0000:0000:ffff:0a00:0001")
	require.Equal(t, "::ffff:10.0.0.1", g.String())
	require.Equal(t, g, mustGID(t, "::ffff:10.0.0.1"))
	require.Equal(t, g, mustGID(t, "10.0.0.1"))
	require.Equal(t, uint64(0xfe80000000000000), mustGID(t, "fe80::1").SubnetPrefix())
	require.True(t, mustGID(t, "fe80::1").linkLocal())
	require.False(t, mustGID(t, "fec0::1").linkLocal())
	for _, bad := range []string{"", "x", "fe80:::1:"} {
		_, err := ParseGID(bad)
		require.Error(t, err, bad)
	}
	require.Equal(t, GIDRoCEv2, parseGIDType("RoCE v2\n"))
	require.Equal(t, GIDIB, parseGIDType("IB/RoCE v1"))
	require.Equal(t, GIDUnknown, parseGIDType(""))
}
