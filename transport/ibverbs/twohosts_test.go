package ibverbs

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gccl/gccl/bootstrap"
	"github.com/gccl/gccl/internal/logx"
	"github.com/gccl/gccl/internal/testutil"
	"github.com/gccl/gccl/internal/verbs"
	"github.com/gccl/gccl/transport"
)

// TestTwoHosts is one rank of a two-host job: tests/rxe/run.sh runs it in
// two VMs joined by a virtual wire (RXEVM_RANK 0 and 1), each with its own
// rxe0, the bootstrap served by rank 0. The ranks exchange their QPs
// through the bootstrap's store, as Init does, and stream messages of
// every size both ways over RoCE between the two kernels.
func TestTwoHosts(t *testing.T) {
	rankEnv, peerAddr := os.Getenv("RXEVM_RANK"), os.Getenv("RXEVM_PEER_ADDR")
	if rankEnv == "" {
		t.Skip("not one of two VMs (tests/rxe/run.sh runs this test in two)")
	}
	requireDevice(t)
	rank := 0
	if rankEnv == "1" {
		rank = 1
	}
	server := os.Getenv("RXEVM_SELF_ADDR")
	if rank == 1 {
		server = peerAddr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	client, err := bootstrap.Join(ctx, bootstrap.Config{Rank: rank, Size: 2, Addr: server + ":29517", Serve: rank == 0,
		Secret: "0123456789abcdef0123456789abcdef", Timeout: 2 * time.Minute})
	require.NoError(t, err)
	defer client.Close()
	var log testutil.SyncBuffer
	s := transport.Setup{JobID: client.JobID(), Rank: rank, Size: 2, SlotSize: 512 << 10, SlotCount: 4,
		Hosts: []string{"vm0", "vm1"}, Pids: []int{1, 2}, Unclaimed: []int{1 - rank}, Store: client,
		Getenv: func(k string) string {
			if k == "GCCL_IB_QPS_PER_CONNECTION" {
				return "2" // large messages striped between the two kernels
			}
			return os.Getenv(k)
		}, Logger: logx.New(&log, "INFO", "")}
	l, err := ibTransport{}.Listen(ctx, &s)
	require.NoError(t, err)
	require.NotNil(t, l)
	addrs, err := client.AllGather(ctx, l.Addr())
	require.NoError(t, err)
	descs := []*transport.Descriptor{
		transport.NewDescriptor(0, "vm0", 1, map[string][]byte{Name: addrs[0]}, nil),
		transport.NewDescriptor(1, "vm1", 2, map[string][]byte{Name: addrs[1]}, nil),
	}
	r := reach(descs[rank], descs[1-rank])
	require.True(t, r.OK && r.Expected, "%+v", r)
	ep, err := l.Connect(ctx, transport.NewDoorbell(), descs[1-rank:2-rank])
	require.NoError(t, err)
	require.NoError(t, l.Release())
	require.NoError(t, client.Barrier(ctx))

	sizes := []int{0, 1, 4096, stripeMin, 512 << 10}
	var all []int
	for range 4 {
		all = append(all, sizes...)
	}
	start := time.Now()
	require.NoError(t, pump(ep, []int{1 - rank}, all))
	t.Logf("rank %d: %d messages each way in %v", rank, len(all), time.Since(start))
	// The pair connected at its first use, through the bootstrap's store.
	t.Logf("rank %d: %s", rank, log.String())
	require.Contains(t, log.String(), fmt.Sprintf("rank %d -> %d via NET/IB/", rank, 1-rank))
	require.NoError(t, client.Barrier(ctx))
	require.NoError(t, ep.Close())
	require.Zero(t, verbs.Live().Total(), "%v", verbs.Live())
}
