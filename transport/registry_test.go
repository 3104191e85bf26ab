package transport_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gccl/gccl/internal/errs"
	"github.com/gccl/gccl/transport"
	"github.com/gccl/gccl/transport/shm"
	"github.com/gccl/gccl/transport/tcp"
)

// desc is a rank on host with the shared-memory and TCP addresses (nil:
// off, with reason off).
func desc(rank int, host string, shmAddr, tcpAddr []byte, off string) *transport.Descriptor {
	addrs, offs := map[string][]byte{}, map[string]string{}
	if shmAddr != nil {
		addrs[shm.Name] = shmAddr
	} else if off != "" {
		offs[shm.Name] = off
	}
	if tcpAddr != nil {
		addrs[tcp.Name] = tcpAddr
	}
	return transport.NewDescriptor(rank, host, 100+rank, addrs, offs)
}

func via(sel *transport.Selection, n int) []string {
	out := make([]string, n)
	for p := range out {
		out[p] = sel.Via(p)
	}
	return out
}

func TestSelectRoutes(t *testing.T) {
	ts := transport.Registered()
	require.GreaterOrEqual(t, len(ts), 2)
	require.Equal(t, shm.Name, ts[0].Name(), "shared memory first")
	require.Equal(t, tcp.Name, ts[len(ts)-1].Name(), "TCP last")

	// Two hosts with two ranks each: shm inside, tcp across.
	ds := []*transport.Descriptor{
		desc(0, "a", []byte("shm-a0"), []byte("a:1"), ""), desc(1, "a", []byte("shm-a1"), []byte("a:2"), ""),
		desc(2, "b", []byte("shm-b2"), []byte("b:1"), ""), desc(3, "b", []byte("shm-b3"), []byte("b:2"), ""),
	}
	sel, err := transport.SelectRoutes(0, ds, ts, false)
	require.NoError(t, err)
	require.Equal(t, []string{"", "SHM", "TCP", "TCP"}, via(sel, 4))
	require.Empty(t, sel.Downgrades)
	require.Contains(t, strings.Join(sel.Infos, "\n"), "rank 0 -> 1 via SHM")

	// GCCL_SHM_DISABLE=1: same-host peers go over TCP, with a WARN.
	ds[0] = desc(0, "a", nil, []byte("a:1"), "GCCL_SHM_DISABLE=1")
	ds[1] = desc(1, "a", nil, []byte("a:2"), "GCCL_SHM_DISABLE=1")
	sel, err = transport.SelectRoutes(0, ds, ts, false)
	require.NoError(t, err)
	require.Equal(t, "TCP", sel.Via(1))
	require.Len(t, sel.Downgrades, 1)
	require.Equal(t, "rank 0 -> 1 via TCP instead of SHM (GCCL_SHM_DISABLE=1)", sel.Downgrades[0])

	// The peer's reason, when this rank's shared memory is fine.
	ds[0] = desc(0, "a", []byte("shm-a0"), []byte("a:1"), "")
	sel, err = transport.SelectRoutes(0, ds, ts, false)
	require.NoError(t, err)
	require.Equal(t, "rank 0 -> 1 via TCP instead of SHM (on rank 1: GCCL_SHM_DISABLE=1)", sel.Downgrades[0])

	// GCCL_STRICT=1 turns that downgrade into an error.
	_, err = transport.SelectRoutes(0, ds, ts, true)
	require.ErrorIs(t, err, errs.ErrNotSupported)
	require.Contains(t, err.Error(), "GCCL_STRICT=1")

	// A peer with nothing in common is unreachable.
	ds[1] = desc(1, "a", []byte("shm-a1"), []byte("a:2"), "")
	ds[3] = desc(3, "b", []byte("shm-b3"), nil, "")
	_, err = transport.SelectRoutes(0, ds, ts, false)
	require.ErrorIs(t, err, errs.ErrNotSupported)
	require.Contains(t, err.Error(), "no transport reaches rank 3")
}

func TestDescriptorRoundTrip(t *testing.T) {
	d := transport.NewDescriptor(0, "h", 1, map[string][]byte{"TCP": []byte("10.0.0.1:5")}, map[string]string{"SHM": "GCCL_SHM_DISABLE=1"})
	b := transport.MarshalEntries(d)
	got, err := transport.ParseDescriptor(3, "h", 7, b)
	require.NoError(t, err)
	require.Equal(t, []byte("10.0.0.1:5"), got.Addr("TCP"))
	require.Equal(t, "GCCL_SHM_DISABLE=1", got.Off("SHM"))
	require.Nil(t, got.Addr("SHM"))
	require.Equal(t, 3, got.Rank)
	for _, bad := range [][]byte{nil, []byte("nope"), b[:len(b)-1], append(append([]byte{}, b...), 0)} {
		_, err := transport.ParseDescriptor(0, "h", 1, bad)
		require.Error(t, err, "%q", bad)
	}
}

func FuzzDescriptor(f *testing.F) {
	f.Add(transport.MarshalEntries(transport.NewDescriptor(0, "h", 1, map[string][]byte{"TCP": []byte("a:1")}, nil)))
	f.Add([]byte("gcclTD1\xff\xff\xff\xff\x0f"))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := transport.ParseDescriptor(0, "h", 1, b)
		if err != nil {
			return
		}
		again, err := transport.ParseDescriptor(0, "h", 1, transport.MarshalEntries(d))
		if err != nil {
			t.Fatalf("re-encoding: %v", err)
		}
		for _, n := range []string{"SHM", "TCP"} {
			if string(again.Addr(n)) != string(d.Addr(n)) || again.Off(n) != d.Off(n) {
				t.Fatalf("%s changed in a round trip", n)
			}
		}
	})
}
