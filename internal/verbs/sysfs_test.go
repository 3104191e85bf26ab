package verbs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

type fakePort struct {
	num   int
	state string // "4: ACTIVE"
	link  string // "Ethernet", "InfiniBand"
	lid   string
	gids  map[int][2]string // index -> GID text, type ("" when the type file fails)
	slots int               // table length (unused entries are zeros)
}

type fakeDev struct {
	name  string
	busID string // "" for a software device
	numa  int
	ports []fakePort
}

// writeSysfs builds a fake /sys with the given RDMA devices under root.
func writeSysfs(t *testing.T, root string, devs ...fakeDev) {
	t.Helper()
	put := func(path, s string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte(s+"\n"), 0o644))
	}
	for _, d := range devs {
		dir := filepath.Join(root, "sys/class/infiniband", d.name)
		put(filepath.Join(dir, "node_guid"), "d0fb:7eff:fec4:f85a")
		if d.busID != "" {
			pci := filepath.Join(root, "sys/devices/pci0000:00", d.busID)
			put(filepath.Join(pci, "numa_node"), fmt.Sprint(d.numa))
			require.NoError(t, os.Symlink(pci, filepath.Join(dir, "device")))
		}
		for _, p := range d.ports {
			pd := filepath.Join(dir, "ports", fmt.Sprint(p.num))
			put(filepath.Join(pd, "state"), p.state)
			put(filepath.Join(pd, "link_layer"), p.link)
			put(filepath.Join(pd, "rate"), "100 Gb/sec (4X EDR)")
			put(filepath.Join(pd, "lid"), p.lid)
			require.NoError(t, os.MkdirAll(filepath.Join(pd, "gid_attrs/types"), 0o755))
			for i := range max(p.slots, len(p.gids)) {
				g, ok := p.gids[i]
				if !ok {
					put(filepath.Join(pd, "gids", fmt.Sprint(i)), "0000:0000:0000:0000:0000:0000:0000:0000")
					continue
				}
				put(filepath.Join(pd, "gids", fmt.Sprint(i)), g[0])
				if g[1] != "" {
					put(filepath.Join(pd, "gid_attrs/types", fmt.Sprint(i)), g[1])
					put(filepath.Join(pd, "gid_attrs/ndevs", fmt.Sprint(i)), "eth0")
				}
			}
		}
	}
}

var rxePort = fakePort{num: 1, state: "4: ACTIVE", link: "Ethernet", lid: "0x0", slots: 8, gids: map[int][2]string{
	0: {"fe80:0000:0000:0000:d0fb:7eff:fec4:f85a", "IB/RoCE v1"},
	1: {"fe80:0000:0000:0000:d0fb:7eff:fec4:f85a", "RoCE v2"},
	2: {"0000:0000:0000:0000:0000:ffff:a9fe:4d01", "IB/RoCE v1"},
	3: {"0000:0000:0000:0000:0000:ffff:a9fe:4d01", "RoCE v2"},
}}

func TestScanSysfs(t *testing.T) {
	root := t.TempDir()
	writeSysfs(t, root,
		fakeDev{name: "rxe0", ports: []fakePort{rxePort}},
		fakeDev{name: "mlx5_0", busID: "0000:3b:00.0", numa: 1, ports: []fakePort{
			{num: 2, state: "1: DOWN", link: "InfiniBand", lid: "0x0"},
			{num: 1, state: "4: ACTIVE", link: "InfiniBand", lid: "0x1a", gids: map[int][2]string{0: {"fe80:0000:0000:0000:248a:0703:0049:d4f0", ""}}},
		}},
	)
	devs, err := scanDevices(root, deviceNames(root))
	require.NoError(t, err)
	require.Len(t, devs, 2)
	m, r := devs[0], devs[1]
	require.Equal(t, "mlx5_0", m.Name)
	require.Equal(t, "0000:3b:00.0", m.BusID)
	require.Equal(t, 1, m.NUMA)
	require.Len(t, m.Ports, 2)
	require.Equal(t, PortInfo{Num: 1, State: PortActive, LinkLayer: LinkInfiniBand, Rate: "100 Gb/sec (4X EDR)", LID: 0x1a,
		GIDs: []GIDEntry{{0, mustGID(t, "fe80::248a:703:49:d4f0"), GIDUnknown, ""}}}, m.Ports[0])
	require.Equal(t, PortDown, m.Ports[1].State)

	require.Equal(t, "rxe0", r.Name)
	require.Equal(t, "", r.BusID)
	require.Equal(t, -1, r.NUMA)
	require.Equal(t, "d0fb:7eff:fec4:f85a", r.NodeGUID)
	require.Len(t, r.Ports, 1)
	p := r.Ports[0]
	require.Equal(t, LinkEthernet, p.LinkLayer)
	require.Len(t, p.GIDs, 4, "the zero entries are left out")
	require.Equal(t, GIDEntry{3, mustGID(t, "::ffff:169.254.77.1"), GIDRoCEv2, "eth0"}, p.GIDs[3])
	require.Equal(t, "rxe0:1", p.Name("rxe0"))

	// A missing tree is no devices, not an error.
	devs, err = scanDevices(t.TempDir(), deviceNames(t.TempDir()))
	require.NoError(t, err)
	require.Empty(t, devs)
}

// On the build machines (no RDMA), Devices says so with ErrNotSupported;
// in the rxe VM it finds rxe0.
func TestDevicesHere(t *testing.T) {
	devs, err := Devices()
	if _, statErr := os.Stat("/sys/class/infiniband"); statErr != nil || len(dirNames("/sys/class/infiniband")) == 0 {
		require.ErrorIs(t, err, ErrNotSupported)
		require.True(t, strings.Contains(err.Error(), "no RDMA devices"), err.Error())
		return
	}
	require.NoError(t, err)
	require.NotEmpty(t, devs)
}
