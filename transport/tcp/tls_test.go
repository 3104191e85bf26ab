package tcp

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gccl/gccl/internal/testutil"
	"github.com/gccl/gccl/internal/tlsx"
	"github.com/gccl/gccl/transport"
)

// TestTLSRunsTheSuite runs the data-path tests again with every connection
// under TLS: ordering, striping, backpressure, close and abort must behave
// the same. (Not the allocation tests: crypto/tls allocates a small reader
// for every record it reads from the socket, see tls.go.)
func TestTLSRunsTheSuite(t *testing.T) {
	testTLS = true
	defer func() { testTLS = false }()
	for name, f := range map[string]func(*testing.T){
		"FIFOTagsAndSizes":                   TestFIFOTagsAndSizes,
		"ThreeRanksAllPairs":                 TestThreeRanksAllPairs,
		"ExchangeWithoutDeadlock":            TestExchangeWithoutDeadlock,
		"Backpressure":                       TestBackpressure,
		"CloseDrainsThenPeerError":           TestCloseDrainsThenPeerError,
		"AbortWakesPeerWithReason":           TestAbortWakesPeerWithReason,
		"CloseWithUnreadInputDeliversAll":    TestCloseWithUnreadInputDeliversEverything,
		"AbortWithUnreadInputDeliversReason": TestAbortWithUnreadInputDeliversReason,
		"SimultaneousClose":                  TestSimultaneousClose,
		"PeerKilledMidMessage":               TestPeerKilledMidMessage,
		"ConnectWaitsForTheLastVerdict":      TestConnectWaitsForTheLastVerdict,
	} {
		t.Run(name, f)
	}
}

// TestTLSBulkBothWays streams messages of random sizes both ways at once
// over two striped TLS streams and checks every byte: ciphertext that waits
// for socket room and records split across reads must not lose or reorder
// anything. Each rank runs from one goroutine, as its executor does: an
// endpoint's bell has one sleeper (a sender and a receiver sleeping on it
// apart can each take the other's wake-up and hang).
func TestTLSBulkBothWays(t *testing.T) {
	const slotSize = 256 << 10
	cfg := testConfig(slotSize, 3, 2)
	cfg.TLS = true
	eps := connectWorld(t, 2, cfg)
	rng := rand.New(rand.NewPCG(3, 7))
	sizes := make([]int, 200)
	for i := range sizes {
		sizes[i] = rng.IntN(slotSize + 1)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for r, e := range eps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pump(e, r, 1-r, sizes, nil); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// tlsPair makes two TLS listeners logging to logs.
func tlsPair(t *testing.T, logs *testutil.SyncBuffer) (*Listener, *Listener) {
	t.Helper()
	cfg := testConfig(4096, 2, 1)
	cfg.TLS = true
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	l0, err := Listen(0, 2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l0.Close() })
	l1, err := Listen(1, 2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l1.Close() })
	if l0.Pin() == "" || l0.Pin() == l1.Pin() {
		t.Fatalf("pins %q and %q", l0.Pin(), l1.Pin())
	}
	return l0, l1
}

// isRemoteAlert reports whether err is a TLS alert the peer sent.
func isRemoteAlert(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "remote error"
}

// connectBoth runs both ranks' ConnectPinned, each with its own view of
// the pins, for at most a second.
func connectBoth(l0, l1 *Listener, pins0, pins1 []string) (err0, err1 error) {
	addrs := []string{l0.Addr(), l1.Addr()}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var e0, e1 *Endpoint
	wg.Add(1)
	go func() {
		defer wg.Done()
		e1, err1 = l1.ConnectPinned(ctx, []int{0}, addrs, pins1)
	}()
	e0, err0 = l0.ConnectPinned(ctx, []int{1}, addrs, pins0)
	wg.Wait()
	for _, e := range []*Endpoint{e0, e1} {
		if e != nil {
			e.Close()
		}
	}
	return err0, err1
}

func otherPin(t *testing.T) string {
	id, err := tlsx.NewIdentity(tlsx.Files{})
	if err != nil {
		t.Fatal(err)
	}
	return id.Pin.String()
}

// TestTLSWrongServerKeyRefused: the dialer (rank 0) expects another key
// for rank 1 than rank 1 holds, as with a machine in the middle.
func TestTLSWrongServerKeyRefused(t *testing.T) {
	var logs testutil.SyncBuffer
	l0, l1 := tlsPair(t, &logs)
	err0, err1 := connectBoth(l0, l1, []string{l0.Pin(), otherPin(t)}, []string{l0.Pin(), l1.Pin()})
	var pe *tlsx.PinError
	if !errors.Is(err0, errRefused) || !errors.As(err0, &pe) || !strings.Contains(err0.Error(), "rank 1") {
		t.Errorf("dialer: %v, want a pin refusal naming rank 1", err0)
	}
	if err1 == nil {
		t.Error("acceptor connected to a dialer that refused it")
	}
	checkNoGoroutines(t)
}

// TestTLSWrongClientKeyRefused: the acceptor (rank 1) expects another key
// for rank 0: it refuses the TLS handshake, and the dialer fails at once
// (no retrying until the timeout), naming rank 1.
func TestTLSWrongClientKeyRefused(t *testing.T) {
	var logs testutil.SyncBuffer
	l0, l1 := tlsPair(t, &logs)
	err0, err1 := connectBoth(l0, l1, []string{l0.Pin(), l1.Pin()}, []string{otherPin(t), l1.Pin()})
	if !errors.Is(err0, errRefused) || !strings.Contains(err0.Error(), "by rank 1") || !strings.Contains(err0.Error(), "key") {
		t.Errorf("dialer: %v, want a refusal by rank 1 of its key", err0)
	}
	if err1 == nil {
		t.Error("acceptor connected with a wrong key")
	}
	if !strings.Contains(logs.String(), "refused a connection") || !strings.Contains(logs.String(), "presented key") {
		t.Errorf("acceptor did not log the refusal:\n%s", logs.String())
	}
	checkNoGoroutines(t)
}

// TestTLSClientWithoutJobKeyRefused: a client that speaks TLS but holds no
// key of the job, and one that speaks plain gccl TCP, are both refused;
// rank 0 connects after them.
func TestTLSClientWithoutJobKeyRefused(t *testing.T) {
	var logs testutil.SyncBuffer
	l0, l1 := tlsPair(t, &logs)
	addrs, pins := []string{l0.Addr(), l1.Addr()}, []string{l0.Pin(), l1.Pin()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var e1 *Endpoint
	var err1 error
	wg.Add(1)
	go func() {
		defer wg.Done()
		e1, err1 = l1.ConnectPinned(ctx, []int{0}, addrs, pins)
	}()
	// A stranger with its own key, accepting any server key.
	stranger, _ := tlsx.NewIdentity(tlsx.Files{})
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", l1.Addr(), tlsx.ClientConfig(stranger, nil))
	if err == nil {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Write((&hello{rank: 0, size: 2, streams: 1, slotSize: 4096}).marshal())
		if err == nil {
			_, err = c.Read(make([]byte, 1))
		}
		c.Close()
	}
	if !isRemoteAlert(err) {
		t.Errorf("stranger with a key: %v, want a TLS alert", err)
	}
	// A plaintext gccl hello.
	pc, err := net.Dial("tcp", l1.Addr())
	if err != nil {
		t.Fatal(err)
	}
	pc.Write((&hello{rank: 0, size: 2, streams: 1, slotSize: 4096}).marshal())
	pc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := pc.Read(make([]byte, 64)); err == nil {
		t.Errorf("plaintext dialer got %d bytes back", n)
	}
	pc.Close()
	e0, err0 := l0.ConnectPinned(ctx, []int{1}, addrs, pins)
	wg.Wait()
	if err0 != nil || err1 != nil {
		t.Fatalf("the real rank 0 after the strangers: %v, %v", err0, err1)
	}
	send(t, e0, 1, []byte("real"), 1)
	if m, _ := recv(t, e1, 0); string(m) != "real" {
		t.Fatalf("got %q", m)
	}
	e0.Close()
	e1.Close()
	if n := strings.Count(logs.String(), "refused a connection"); n < 2 {
		t.Errorf("%d refusals logged, want 2:\n%s", n, logs.String())
	}
	checkNoGoroutines(t)
}

// TestTLSNeedsPins: a TLS listener given no pins refuses to connect.
func TestTLSNeedsPins(t *testing.T) {
	var logs testutil.SyncBuffer
	l0, _ := tlsPair(t, &logs)
	if _, err := l0.Connect(context.Background(), []int{1}, []string{"a:1", "b:2"}); err == nil || !strings.Contains(err.Error(), "pin") {
		t.Fatalf("Connect without pins: %v", err)
	}
}

func TestSplitJoinAddr(t *testing.T) {
	for _, c := range [][2]string{{"10.0.0.1:5000", ""}, {"[::1]:80", "ab12"}} {
		a, p := SplitAddr(JoinAddr(c[0], c[1]))
		if a != c[0] || p != c[1] {
			t.Errorf("SplitAddr(JoinAddr(%q, %q)) = %q, %q", c[0], c[1], a, p)
		}
	}
}

// TestTLSMixedJobFailsAtConnect: a rank with TLS and a rank without, in one
// job, fail the registered transport's Connect at once, each naming the
// other and GCCL_TLS, before any dial.
func TestTLSMixedJobFailsAtConnect(t *testing.T) {
	var ls [2]transport.Listener
	for r, on := range []string{"1", "0"} {
		env := func(k string) string {
			switch k {
			case "GCCL_TLS":
				return on
			case "GCCL_SOCKET_IFNAME":
				return "=lo"
			}
			return ""
		}
		l, err := tcpTransport{}.Listen(context.Background(), &transport.Setup{JobID: "j", Rank: r, Size: 2, SlotSize: 4096, SlotCount: 2, Unclaimed: []int{1 - r}, Getenv: env})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release()
		ls[r] = l
	}
	if _, pin := SplitAddr(string(ls[0].Addr())); pin == "" {
		t.Fatalf("the TLS rank's descriptor %q has no pin", ls[0].Addr())
	}
	descs := [2]*transport.Descriptor{}
	for r := range ls {
		descs[r] = transport.NewDescriptor(r, "h", r, map[string][]byte{Name: ls[r].Addr()}, nil)
	}
	for r, want := range []string{"rank 0 uses TLS (GCCL_TLS=1) and rank 1 does not use TLS", "rank 1 does not use TLS and rank 0 uses TLS"} {
		_, err := ls[r].Connect(context.Background(), transport.NewDoorbell(), []*transport.Descriptor{descs[1-r]})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("rank %d: %v, want %q", r, err, want)
		}
	}
}

// TestTLSTamperingFailsThePeer: a machine in the middle that flips one
// bit of the data stream makes the receiver fail the connection with an
// error naming the peer, instead of delivering altered data.
func TestTLSTamperingFailsThePeer(t *testing.T) {
	var logs testutil.SyncBuffer
	l0, l1 := tlsPair(t, &logs)
	// Forward rank 0's connections to rank 1, flipping a bit far past the
	// handshakes in the direction of the data.
	proxy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	var pwg sync.WaitGroup
	defer pwg.Wait()
	pwg.Add(1)
	go func() {
		defer pwg.Done()
		c, err := proxy.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", l1.Addr())
		if err != nil {
			c.Close()
			return
		}
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			buf := make([]byte, 32<<10)
			total := 0
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if total < 200<<10 && total+n >= 200<<10 {
						buf[200<<10-total-1] ^= 0x10
					}
					total += n
					if _, werr := s.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			s.Close()
		}()
		io.Copy(c, s)
		c.Close()
	}()
	addrs0 := []string{l0.Addr(), proxy.Addr().String()}
	pins := []string{l0.Pin(), l1.Pin()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var e1 *Endpoint
	var err1 error
	wg.Add(1)
	go func() {
		defer wg.Done()
		e1, err1 = l1.ConnectPinned(ctx, []int{0}, []string{l0.Addr(), l1.Addr()}, pins)
	}()
	e0, err0 := l0.ConnectPinned(ctx, []int{1}, addrs0, pins)
	wg.Wait()
	if err0 != nil || err1 != nil {
		t.Fatalf("connect through the proxy: %v, %v", err0, err1)
	}
	defer e0.Close()
	defer e1.Close()
	msg := make([]byte, 4096)
	go func() {
		for i := 0; i < 200; i++ {
			if trySend(e0, 1, msg, 1) != nil {
				return
			}
		}
	}()
	var rerr error
	for i := 0; i < 200 && rerr == nil; i++ {
		var m []byte
		m, _, rerr = tryRecv(e1, 0)
		if rerr == nil && !bytes.Equal(m, msg) {
			t.Fatalf("message %d altered and delivered", i)
		}
	}
	var pe *transport.PeerError
	if !errors.As(rerr, &pe) || pe.Peer != 0 || !strings.Contains(rerr.Error(), "bad record MAC") {
		t.Fatalf("after tampering: %v, want a PeerError for rank 0 saying the message did not authenticate", rerr)
	}
}
