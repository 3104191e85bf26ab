package comm_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/transport"
	"github.com/gccl/gccl/transport/tcp"
)

// loopTransport is a transport registered by this test only: TCP sockets
// on loopback under another name, ahead of shared memory. It shows that a
// transport is added by registering it, with no change to comm.
type loopTransport struct{}

func (loopTransport) Name() string { return "LOOP" }

func (loopTransport) Listen(ctx context.Context, s *transport.Setup) (transport.Listener, error) {
	bell := transport.NewDoorbell()
	ln, err := tcp.Listen(s.Rank, s.Size, tcp.Config{SlotSize: s.SlotSize, SlotCount: s.SlotCount,
		IfName: "lo", Bell: bell, Token: []byte("loop:" + s.JobID)})
	if err != nil {
		return nil, err
	}
	return &loopListener{ln: ln, bell: bell, size: s.Size}, nil
}

func (loopTransport) Reach(me, peer *transport.Descriptor) transport.Reach {
	return transport.Reach{OK: me.Addr("LOOP") != nil && peer.Addr("LOOP") != nil}
}

type loopListener struct {
	ln   *tcp.Listener
	bell *transport.Doorbell
	size int
}

func (l *loopListener) Addr() []byte         { return []byte(l.ln.Addr()) }
func (l *loopListener) Bell() transport.Bell { return l.bell }
func (l *loopListener) Release() error       { return l.ln.Close() }

func (l *loopListener) Connect(ctx context.Context, bell transport.Bell, peers []*transport.Descriptor) (transport.Endpoint, error) {
	if bell != transport.Bell(l.bell) {
		return nil, fmt.Errorf("the rank's bell is not its bell owner's")
	}
	ranks, addrs := make([]int, len(peers)), make([]string, l.size)
	for i, d := range peers {
		ranks[i], addrs[d.Rank] = d.Rank, string(d.Addr("LOOP"))
	}
	ep, err := l.ln.Connect(ctx, ranks, addrs)
	if err != nil {
		return nil, err
	}
	return loopEndpoint{ep}, nil
}

// loopEndpoint renames TCP's endpoint (its PrepareWait comes along).
type loopEndpoint struct{ *tcp.Endpoint }

func (loopEndpoint) Name() string { return "LOOP" }

func TestTransportAddedByRegistering(t *testing.T) {
	const n = 3
	unregister := transport.Register(loopTransport{}, 0)
	defer unregister()
	cs, stop := initJobOver(t, n)
	defer stop()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range n {
				if via := c.Via(p); p != c.Rank() && via != "LOOP" {
					errs[c.Rank()] = fmt.Errorf("rank %d -> %d via %s, want LOOP", c.Rank(), p, via)
					return
				}
			}
			x := make([]float32, 100000) // several slots
			for i := range x {
				x[i] = float32(c.Rank() + i)
			}
			if err := comm.AllReduce(context.Background(), c, x, x, comm.Sum); err != nil {
				errs[c.Rank()] = err
				return
			}
			for i, v := range x {
				if want := float32(n*i + n*(n-1)/2); v != want {
					errs[c.Rank()] = fmt.Errorf("element %d = %v, want %v", i, v, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for _, c := range cs {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// Unregistered, the same job takes shared memory again.
	unregister()
	cs, stop2 := initJobOver(t, 2)
	defer stop2()
	if via := cs[0].Via(1); via != "SHM" {
		t.Errorf("without the test transport: rank 0 -> 1 via %s, want SHM", via)
	}
	for _, c := range cs {
		c.Close()
	}
}
