package tcp

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gccl/gccl/internal/testutil"
	"github.com/gccl/gccl/transport"
)

// connectLazyWorld makes n ranks' lazy endpoints (each rank serves every
// other), closing the listeners at once as the registry's Release does,
// and the endpoints when the test ends.
func connectLazyWorld(t *testing.T, n int, cfgs ...Config) []*Endpoint {
	t.Helper()
	ls := make([]*Listener, n)
	addrs := make([]string, n)
	for r := range ls {
		c := testConfig(64<<10, 2, 2)
		if r < len(cfgs) {
			c = cfgs[r]
		}
		c.TLS = false
		c.Bell = transport.NewDoorbell()
		l, err := Listen(r, n, c)
		if err != nil {
			t.Fatal(err)
		}
		ls[r], addrs[r] = l, l.Addr()
	}
	eps := make([]*Endpoint, n)
	for r, l := range ls {
		var peers []int
		for p := range n {
			if p != r {
				peers = append(peers, p)
			}
		}
		e, err := l.ConnectLazy(peers, addrs, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil { // leaves the socket to e
			t.Fatal(err)
		}
		eps[r] = e
	}
	t.Cleanup(func() {
		for _, e := range eps {
			e.Close()
		}
		checkNoGoroutines(t)
	})
	return eps
}

// sockets counts the connected streams of e.
func sockets(e *Endpoint) int {
	n := 0
	for _, p := range e.allPeers() {
		n += len(p.fds)
	}
	return n
}

// A pair connects when one of its ranks first uses it, whichever rank that
// is, and no other pair connects.
func TestLazyConnectsOnFirstUse(t *testing.T) {
	eps := connectLazyWorld(t, 4)
	for r, e := range eps {
		if n := sockets(e); n != 0 {
			t.Fatalf("rank %d holds %d sockets before any use", r, n)
		}
	}
	// The lower rank uses the pair first: it dials.
	send(t, eps[0], 2, pattern(0, 0, 1000), 7)
	if m, tag := recv(t, eps[2], 0); !bytes.Equal(m, pattern(0, 0, 1000)) || tag != 7 {
		t.Fatalf("0 -> 2: got %d bytes, tag %d", len(m), tag)
	}
	// The higher rank uses the pair first: its messages wait in its slots
	// until the lower rank's first use dials.
	for i := range 2 {
		send(t, eps[3], 1, pattern(3, i, 300<<10/64), 9)
	}
	time.Sleep(20 * time.Millisecond)
	if n := sockets(eps[3]); n != 0 {
		t.Fatalf("rank 3 holds %d sockets before rank 1 used the pair", n)
	}
	for i := range 2 {
		if m, _ := recv(t, eps[1], 3); !bytes.Equal(m, pattern(3, i, 300<<10/64)) {
			t.Fatalf("3 -> 1: message %d differs", i)
		}
	}
	streams := testConfig(64<<10, 2, 2).Streams
	for r, want := range []int{1, 1, 1, 1} {
		if n := sockets(eps[r]); n != want*streams {
			t.Errorf("rank %d holds %d sockets, want %d (one pair)", r, n, want*streams)
		}
	}
	for _, pair := range [][2]int{{0, 1}, {0, 3}, {1, 2}, {2, 3}} {
		if eps[pair[0]].peers[pair[1]].Load() != nil || eps[pair[1]].peers[pair[0]].Load() != nil {
			t.Errorf("pair %v was never used but has a connection", pair)
		}
	}
}

// A rank may use a pair while its peer is busy elsewhere and sleep on its
// bell: the connection coming up wakes it.
func TestLazyReceiverSleepsUntilConnected(t *testing.T) {
	eps := connectLazyWorld(t, 2)
	done := make(chan error, 1)
	go func() {
		m, _, err := tryRecv(eps[1], 0)
		if err == nil && !bytes.Equal(m, pattern(0, 1, 5000)) {
			err = errors.New("wrong payload")
		}
		done <- err
	}()
	time.Sleep(30 * time.Millisecond) // rank 1 sleeps, not yet connected
	send(t, eps[0], 1, pattern(0, 1, 5000), 1)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A pair that cannot connect (the peer holds another token) fails the
// first use's sends and receives with an error naming the peer; other
// pairs are unaffected.
func TestLazyRefusedPairNamesThePeer(t *testing.T) {
	good := testConfig(4096, 2, 1)
	bad := good
	bad.Token = []byte("not the job token")
	eps := connectLazyWorld(t, 3, good, good, bad)
	send(t, eps[0], 1, []byte("fine"), 1)
	if m, _ := recv(t, eps[1], 0); string(m) != "fine" {
		t.Fatalf("0 -> 1: %q", m)
	}
	// Rank 0 dials rank 2, which cannot prove the token.
	_, _, err := tryRecv(eps[0], 2)
	var pe *transport.PeerError
	if !errors.As(err, &pe) || pe.Peer != 2 || !errors.Is(err, errRefused) || !strings.Contains(err.Error(), "token") {
		t.Fatalf("receive from the refused peer: %v", err)
	}
	if err := trySend(eps[0], 2, []byte("x"), 1); !errors.As(err, &pe) || pe.Peer != 2 {
		t.Fatalf("send to the refused peer: %v", err)
	}
	send(t, eps[1], 0, []byte("still fine"), 2)
	if m, _ := recv(t, eps[0], 1); string(m) != "still fine" {
		t.Fatalf("1 -> 0 after the refusal: %q", m)
	}
}

// Close delivers what was committed to a pair still connecting, if the peer
// connects within the linger deadline, and otherwise returns at it.
func TestLazyCloseDeliversToAPairStillConnecting(t *testing.T) {
	old := closeLinger
	closeLinger = 2 * time.Second
	t.Cleanup(func() { closeLinger = old })
	eps := connectLazyWorld(t, 3)
	send(t, eps[2], 0, []byte("queued before the pair connected"), 3)
	send(t, eps[2], 1, []byte("never read"), 4)
	closed := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		eps[2].Close()
		closed <- time.Since(start)
	}()
	time.Sleep(50 * time.Millisecond)
	if m, tag := recv(t, eps[0], 2); string(m) != "queued before the pair connected" || tag != 3 {
		t.Fatalf("rank 0 got %q, tag %d", m, tag)
	}
	if _, _, err := tryRecv(eps[0], 2); !errors.Is(err, transport.ErrPeerClosed) {
		t.Fatalf("after the message: %v, want ErrPeerClosed", err)
	}
	// Rank 1 never uses the pair: Close gives up on it at the deadline.
	if d := <-closed; d < closeLinger-100*time.Millisecond || d > closeLinger+5*time.Second {
		t.Fatalf("Close took %v with a pair that never connected (linger %v)", d, closeLinger)
	}
}

// registeredJob connects n ranks through the registered transport, as
// comm's Init does (Listen, Connect, then Release), with env.
func registeredJob(t *testing.T, n int, env map[string]string) []*Endpoint {
	t.Helper()
	getenv := func(k string) string {
		if k == "GCCL_SOCKET_IFNAME" {
			return "=lo"
		}
		return env[k]
	}
	ls := make([]transport.Listener, n)
	descs := make([]*transport.Descriptor, n)
	for r := range n {
		var others []int
		for p := range n {
			if p != r {
				others = append(others, p)
			}
		}
		l, err := tcpTransport{}.Listen(context.Background(), &transport.Setup{JobID: "j", Rank: r, Size: n, SlotSize: 4096, SlotCount: 2, Unclaimed: others, Getenv: getenv})
		if err != nil {
			t.Fatal(err)
		}
		ls[r] = l
		descs[r] = transport.NewDescriptor(r, "h", r, map[string][]byte{Name: l.Addr()}, nil)
	}
	eps := make([]*Endpoint, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, l := range ls {
		var peers []*transport.Descriptor
		for p, d := range descs {
			if p != r {
				peers = append(peers, d)
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			var ep transport.Endpoint
			if ep, errs[r] = l.Connect(ctx, transport.NewDoorbell(), peers); errs[r] == nil {
				eps[r] = ep.(*Endpoint)
			}
		}()
	}
	wg.Wait()
	for r, l := range ls {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		if err := l.Release(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, e := range eps {
			e.Close()
		}
		checkNoGoroutines(t)
	})
	return eps
}

// The registered transport connects pairs at their first use, with or
// without TLS, and keeps accepting after Release; GCCL_RUNTIME_CONNECT=0
// connects every pair in Connect; GCCL_SOCKET_NSOCKS sets the sockets per
// pair.
func TestRegisteredTransportConnects(t *testing.T) {
	for _, c := range []struct {
		name    string
		env     map[string]string
		eager   bool
		streams int
	}{
		{"first use", nil, false, DefaultStreams},
		{"first use, TLS", map[string]string{"GCCL_TLS": "1"}, false, DefaultStreams},
		{"first use, one socket", map[string]string{EnvSockets: "1"}, false, 1},
		{"at Init", map[string]string{EnvRuntimeConnect: "0"}, true, DefaultStreams},
		{"at Init, three sockets", map[string]string{EnvRuntimeConnect: "0", EnvSockets: "3"}, true, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			eps := registeredJob(t, 3, c.env)
			for r, e := range eps {
				want := 0
				if c.eager {
					want = 2 * c.streams
				}
				if n := sockets(e); n != want {
					t.Fatalf("rank %d holds %d sockets after Connect, want %d", r, n, want)
				}
			}
			send(t, eps[2], 0, []byte("hello"), 5)
			if m, tag := recv(t, eps[0], 2); string(m) != "hello" || tag != 5 {
				t.Fatalf("2 -> 0: %q, tag %d", m, tag)
			}
			want := c.streams // one pair used
			if c.eager {
				want = 2 * c.streams
			}
			if n := sockets(eps[0]); n != want {
				t.Errorf("rank 0 holds %d sockets after using one pair, want %d", n, want)
			}
		})
	}
}

func TestRegisteredTransportSettings(t *testing.T) {
	for _, kv := range [][2]string{
		{EnvRuntimeConnect, "yes"},
		{EnvSockets, "0"},
		{EnvSockets, "17"},
		{EnvSockets, "two"},
	} {
		env := func(k string) string {
			if k == kv[0] {
				return kv[1]
			}
			return ""
		}
		_, err := tcpTransport{}.Listen(context.Background(), &transport.Setup{JobID: "j", Rank: 0, Size: 2, SlotSize: 4096, SlotCount: 2, Unclaimed: []int{1}, Getenv: env})
		if err == nil || !strings.Contains(err.Error(), kv[0]) {
			t.Errorf("%s=%s: %v", kv[0], kv[1], err)
		}
	}
}

// Ranks that disagree on the sockets per pair fail that pair, the dialer
// with an error naming the peer, the acceptor's log naming the setting.
func TestLazyMismatchedSocketsFailThePair(t *testing.T) {
	var logs testutil.SyncBuffer
	one := testConfig(4096, 2, 1)
	two := testConfig(4096, 2, 2)
	two.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	eps := connectLazyWorld(t, 2, one, two)
	go func() { _, _ = eps[1].Receiver(0) }() // rank 1 accepts whatever comes
	_, _, err := tryRecv(eps[0], 1)
	var pe *transport.PeerError
	if !errors.As(err, &pe) || pe.Peer != 1 || !errors.Is(err, errRefused) {
		t.Fatalf("rank 0: %v", err)
	}
	// The acceptor logs once its side of the handshake has ended.
	for i := 0; !strings.Contains(logs.String(), EnvSockets); i++ {
		if i == 200 {
			t.Fatalf("rank 1's log does not name %s:\n%s", EnvSockets, logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
