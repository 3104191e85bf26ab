package verbs

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gccl/gccl/internal/logx"
	"github.com/gccl/gccl/topo"
)

// ibmHost is the topology of an 8×H100 server with eight RoCE NICs, one
// under each GPU's PCI switch (a real NCCL dump), and its NICs as RDMA
// devices: the device of each port named in the file, on its PCI function
// and NUMA node.
func ibmHost(t *testing.T) (*topo.Graph, []Device) {
	t.Helper()
	f, err := os.Open("../../topo/testdata/ibm-gx3d-8xH100-nvswitch-roce-topo-dump.xml")
	require.NoError(t, err)
	defer f.Close()
	doc, err := topo.ParseXML(f)
	require.NoError(t, err)
	g, err := topo.Build(doc)
	require.NoError(t, err)
	var devs []Device
	for _, n := range g.Nodes[topo.NET] {
		devs = append(devs, Device{Name: n.ID, BusID: n.Parent.ID, NUMA: g.LocalCPU(n).CPU.NUMA, Ports: []PortInfo{{
			Num: 1, State: PortActive, LinkLayer: LinkEthernet, GIDs: rxeGIDs(t),
		}}})
	}
	require.Len(t, devs, 8)
	return g, devs
}

func TestChooseNearestToGPU(t *testing.T) {
	g, devs := ibmHost(t)
	require.Len(t, g.Nodes[topo.GPU], 8)
	for _, gpu := range g.Nodes[topo.GPU] {
		c, err := Choose(devs, DefaultConfig(), Near{Graph: g, GPU: gpu.ID, NUMA: -1})
		require.NoError(t, err)
		// The one NIC under the GPU's own switch.
		require.Equal(t, topo.PathPIX, c.Path, "GPU %s", gpu.ID)
		require.True(t, c.Known)
		nic := g.FindBusID(c.BusID)
		require.Equal(t, topo.PathPIX, g.Path(gpu, nic).Type)
		require.Equal(t, 3, c.GID.Index, "the RoCE v2 IPv4 GID")
	}
	// mlx5_7 is under GPU 0000:a4:00.0's switch: excluding it leaves the
	// other NICs of the same NUMA node (PHB: topo's PXN routes through a
	// peer GPU, but the rank uses the HCA directly), before the other
	// socket's (SYS).
	cfg := DefaultConfig()
	cfg.HCA, _ = ParseHCAFilter("^=mlx5_7")
	cands, skipped, err := Candidates(devs, cfg, Near{Graph: g, GPU: "0000:a4:00.0", NUMA: -1})
	require.NoError(t, err)
	require.Equal(t, []string{"mlx5_7:1: not selected by GCCL_IB_HCA=^=mlx5_7"}, skipped)
	require.Len(t, cands, 7)
	var classes []string
	for _, c := range cands {
		classes = append(classes, c.Device+" "+c.Path.String())
	}
	require.Equal(t, []string{"mlx5_4 PHB", "mlx5_5 PHB", "mlx5_6 PHB", "mlx5_0 SYS", "mlx5_1 SYS", "mlx5_2 SYS", "mlx5_3 SYS"}, classes)
	// Ranks of the same GPU class spread over the equally near ones.
	seen := map[string]bool{}
	for r := range 3 {
		c, err := Choose(devs, cfg, Near{Graph: g, GPU: "0000:a4:00.0", NUMA: -1, LocalRank: r})
		require.NoError(t, err)
		seen[c.Device] = true
	}
	require.Equal(t, map[string]bool{"mlx5_4": true, "mlx5_5": true, "mlx5_6": true}, seen)
}

func TestChooseNearNUMA(t *testing.T) {
	g, devs := ibmHost(t)
	for _, graph := range []*topo.Graph{g, nil} { // from the topology, and from the devices' numa_node
		got := map[string]bool{}
		for r := range 8 {
			c, err := Choose(devs, DefaultConfig(), Near{Graph: graph, NUMA: 1, LocalRank: r})
			require.NoError(t, err)
			require.Equal(t, topo.PathPHB, c.Path)
			got[c.Device] = true
		}
		require.Equal(t, map[string]bool{"mlx5_0": true, "mlx5_1": true, "mlx5_2": true, "mlx5_3": true}, got)
	}
}

func TestChooseSkipsAndFails(t *testing.T) {
	ib := PortInfo{Num: 1, State: PortActive, LinkLayer: LinkInfiniBand, LID: 3, GIDs: []GIDEntry{{0, mustGID(t, "fe80::1"), GIDIB, ""}}}
	down := ib
	down.Num, down.State = 2, PortDown
	devs := []Device{
		{Name: "rxe0", NUMA: -1, Ports: []PortInfo{{Num: 1, State: PortActive, LinkLayer: LinkEthernet, GIDs: rxeGIDs(t)}}},
		{Name: "mlx5_0", BusID: "0000:3b:00.0", NUMA: 0, Ports: []PortInfo{ib, down}},
		{Name: "roce_noip", NUMA: 0, Ports: []PortInfo{{Num: 1, State: PortActive, LinkLayer: LinkEthernet}}},
	}
	cands, skipped, err := Candidates(devs, DefaultConfig(), Near{NUMA: 0})
	require.NoError(t, err)
	require.Len(t, cands, 2)
	require.Equal(t, "mlx5_0:1", cands[0].Name())
	require.Equal(t, topo.PathPHB, cands[0].Path)
	require.Equal(t, "rxe0:1", cands[1].Name(), "a device of unknown distance comes last")
	require.False(t, cands[1].Known)
	require.Equal(t, "rxe0:1/RoCE GID 3 ::ffff:169.254.77.1 (RoCE v2, veth0), distance unknown", cands[1].String())
	require.Equal(t, []string{"mlx5_0:2: port DOWN",
		"roce_noip:1: the port has no GID (on RoCE: its network interface has no IP address, or is down)"}, skipped)

	cfg := DefaultConfig()
	cfg.GIDIndex = 1
	c, err := Choose(devs, cfg, Near{NUMA: -1})
	require.NoError(t, err)
	require.Equal(t, 1, c.GID.Index)

	cfg.HCA, _ = ParseHCAFilter("=rxe")
	_, err = Choose(devs, cfg, Near{NUMA: -1})
	require.ErrorIs(t, err, ErrNotSupported)
	require.ErrorContains(t, err, "no usable RDMA port (rxe0:1: not selected by GCCL_IB_HCA==rxe; mlx5_0:1:")

	cfg = DefaultConfig()
	cfg.Disable = true
	_, err = Choose(devs, cfg, Near{NUMA: -1})
	require.ErrorIs(t, err, ErrNotSupported)
	require.ErrorContains(t, err, "GCCL_IB_DISABLE=1")
	_, err = Select(cfg, Near{NUMA: -1}, nil)
	require.ErrorContains(t, err, "GCCL_IB_DISABLE=1")

	_, err = Choose(nil, DefaultConfig(), Near{NUMA: -1})
	require.ErrorContains(t, err, "no RDMA devices")
}

// Select logs its choice at INFO; here, without devices, it fails with
// ErrNotSupported instead (the rxe VM test checks the log line).
func TestSelectHere(t *testing.T) {
	var buf bytes.Buffer
	c, err := Select(DefaultConfig(), Near{NUMA: -1}, logx.New(&buf, "INFO", ""))
	if err != nil {
		require.ErrorIs(t, err, ErrNotSupported)
		return
	}
	require.Contains(t, buf.String(), "INFO NET NET/IB : Using "+c.Name())
}
