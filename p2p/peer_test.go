package p2p

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// TestCloseWithSilentConnection: a connection that never sends its hello
// must not hold Close up until the handshake timeout.
func TestCloseWithSilentConnection(t *testing.T) {
	a, err := New("a", Config{ListenAddr: "127.0.0.1:0", Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", a.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(50 * time.Millisecond) // accepted, waiting for the hello
	start := time.Now()
	a.Close()
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Close took %v with a silent connection", d)
	}
}

// fakePeer connects a progress engine of a to a pipe the test writes.
func fakePeer(t *testing.T, a *Agent) (*peer, net.Conn) {
	p, ours := fakePeerNotReading(t, a)
	go io.Copy(io.Discard, ours)
	return p, ours
}

// fakePeerNotReading is fakePeer whose side reads nothing: over the
// unbuffered pipe, the target's first write to it blocks.
func fakePeerNotReading(t *testing.T, a *Agent) (*peer, net.Conn) {
	ours, theirs := net.Pipe()
	p := newPeer(a, theirs, bufio.NewReader(theirs), &agentInfo{Name: "fake"})
	a.mu.Lock()
	a.conns[p] = true
	a.wg.Add(2)
	a.mu.Unlock()
	go p.readLoop()
	go p.respond()
	t.Cleanup(func() { ours.Close() })
	return p, ours
}

// TestSlowPayloadKeepsPeer: a peer streaming one long payload is sending,
// so it must not be dropped for silence (PeerTimeout) in the middle of it.
func TestSlowPayloadKeepsPeer(t *testing.T) {
	a := newAgent(t, "target", Config{ListenAddr: "-", PeerTimeout: 300 * time.Millisecond})
	mem := make([]byte, 64<<10)
	r, _ := a.RegisterMem(mem)
	p, c := fakePeer(t, a)
	c.Write(frame(header{op: opWrite, region: r.ID(), req: 1, offset: r.Addr(), length: uint64(len(mem))}, nil))
	chunk := bytes.Repeat([]byte{7}, len(mem)/16)
	for range 16 {
		time.Sleep(50 * time.Millisecond) // 800 ms in all, chunks well within PeerTimeout
		if _, err := c.Write(chunk); err != nil {
			t.Fatalf("target dropped the connection mid-payload: %v (%v)", err, p.err())
		}
	}
	c.Write(frame(header{op: opPing}, nil))
	waitFor(t, func() bool { return mem[len(mem)-1] == 7 })
	if err := p.err(); err != nil {
		t.Fatal(err)
	}
}

// TestPeerChurnLeavesNoGoroutines: peers that come, transfer and go leave
// no goroutine behind in a long-lived agent (a lane per peer ever met).
func TestPeerChurnLeavesNoGoroutines(t *testing.T) {
	a := newAgent(t, "a", Config{DisableSHM: true, DisablePVM: true})
	lr, _ := a.RegisterMem(make([]byte, 4096))
	round := func(i int) {
		b, err := New("b"+string(rune('0'+i)), Config{ListenAddr: "127.0.0.1:0", Logger: testLogger()})
		if err != nil {
			t.Fatal(err)
		}
		tr, _ := b.RegisterMem(make([]byte, 4096))
		name, err := a.LoadRemote(ctxT(t), b.LocalMetadata())
		if err != nil {
			t.Fatal(err)
		}
		req, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, 4096)}}, name, DescList{Type: DRAM, Descs: []Desc{tr.Desc(0, 4096)}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Post()
		if err := req.Wait(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		req.Release()
		b.Close()
		waitFor(t, func() bool { _, err := a.remote(name); return err != nil })
	}
	round(0)
	time.Sleep(20 * time.Millisecond)
	g0 := runtime.NumGoroutine()
	for i := 1; i <= 8; i++ {
		round(i)
	}
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > g0 {
		if time.Now().After(deadline) {
			t.Fatalf("goroutines %d -> %d after 8 peers came and went", g0, runtime.NumGoroutine())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAcceptSurvivesFDExhaustion: running out of file descriptors for a
// moment (EMFILE on accept) must not stop the listener for good.
func TestAcceptSurvivesFDExhaustion(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("rlimit")
	}
	a := newAgent(t, "a", Config{})
	b := newAgent(t, "b", Config{})
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	fds, _ := os.ReadDir("/proc/self/fd")
	// Room for the dialling socket only (ReadDir's own descriptor is shut).
	low := lim
	low.Cur = uint64(len(fds))
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Skip(err)
	}
	c, derr := net.Dial("tcp", a.Addr())
	time.Sleep(100 * time.Millisecond) // the accept fails meanwhile
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if derr != nil {
		t.Skipf("could not set up the exhaustion: %v", derr)
	}
	c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := b.Connect(ctx, a.Addr()); err != nil {
		t.Fatalf("connecting after a moment without descriptors: %v", err)
	}
}

// FuzzPeerStream feeds arbitrary bytes to an agent's progress engine, as a
// connected peer would send them: whatever arrives, the agent neither
// panics, nor writes outside its registered region, nor hangs.
func FuzzPeerStream(f *testing.F) {
	a, err := New("target", Config{ListenAddr: "-", Logger: testLogger()})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { a.Close() })
	mem := make([]byte, 3*4096)
	guardL, region, guardR := mem[:4096], mem[4096:8192], mem[8192:]
	r, err := a.RegisterMem(region)
	if err != nil {
		f.Fatal(err)
	}
	base := r.Addr()
	var seed []byte
	seed = append(seed, frame(header{op: opWrite, region: r.ID(), req: 1, offset: base + 10}, []byte("hello"))...)
	seed = append(seed, frame(header{op: opCommit, req: 1, flags: flagAck | flagNotify}, []byte("n"))...)
	f.Add(seed)
	f.Add(frame(header{op: opWrite, region: r.ID(), req: 2, offset: base + 4090}, []byte("past the end")))
	f.Add(frame(header{op: opWrite, region: 77, req: 2, offset: base}, []byte("no region")))
	f.Add(frame(header{op: opReadReq, region: r.ID(), req: 3, offset: base, length: 4096}, nil))
	f.Add(frame(header{op: opReadReq, region: r.ID(), req: 3, offset: base - 1, length: 2}, nil))
	f.Add(frame(header{op: opReadResp, req: 9, aux: 3, length: 5}, nil))
	f.Add(frame(header{op: opAck, req: 9, flags: flagError}, []byte("x")))
	f.Add(frame(header{op: opPing}, nil))
	f.Fuzz(func(t *testing.T, in []byte) {
		for i := range guardL {
			guardL[i], guardR[i] = 0xAA, 0xAA
		}
		ours, theirs := net.Pipe()
		info := &agentInfo{Name: "fuzzer"}
		p := newPeer(a, theirs, bufio.NewReader(theirs), info)
		a.mu.Lock()
		a.conns[p] = true
		a.wg.Add(2)
		a.mu.Unlock()
		go p.readLoop()
		go p.respond()
		drained := make(chan struct{})
		go func() { io.Copy(io.Discard, ours); close(drained) }()
		ours.SetWriteDeadline(time.Now().Add(2 * time.Second))
		ours.Write(in)
		ours.Close()
		select {
		case <-p.closed:
		case <-time.After(5 * time.Second):
			t.Fatal("the progress engine did not end after the stream closed")
		}
		<-drained
		for i := range guardL {
			if guardL[i] != 0xAA || guardR[i] != 0xAA {
				t.Fatal("a peer wrote outside the registered region")
			}
		}
	})
}
