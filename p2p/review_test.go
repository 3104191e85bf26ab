package p2p

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// TestRegisterFileCacheHitKeepsNoFD: a cached RegisterFile must not keep
// the descriptor it opened (the region uses the first registration's).
func TestRegisterFileCacheHitKeepsNoFD(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("counts /proc/self/fd")
	}
	fds := func() int { e, _ := os.ReadDir("/proc/self/fd"); return len(e) }
	a := newAgent(t, "a", Config{ListenAddr: "-"})
	path := filepath.Join(t.TempDir(), "f")
	r1, err := a.RegisterFile(path, FileOptions{Length: 8192, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	f0 := fds()
	for range 5 {
		r, err := a.RegisterFile(path, FileOptions{Length: 8192})
		if err != nil || r != r1 {
			t.Fatalf("cached registration: %v, %v", r, err)
		}
	}
	if f := fds(); f != f0 {
		t.Fatalf("5 cached RegisterFile calls left %d more file descriptors open", f-f0)
	}
	for range 6 {
		if err := a.DeregisterMem(r1); err != nil {
			t.Fatal(err)
		}
	}
}

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

// TestTCPWriteAfterIdle: a large tcp WRITE after the connection was quiet
// for longer than RequestTimeout (keepalives every PeerTimeout/4) must not
// fail on a write deadline left over from the last flush.
func TestTCPWriteAfterIdle(t *testing.T) {
	// The timeout leaves a loaded machine time to move 4 MiB; the idle
	// time below only has to exceed it.
	const timeout = time.Second
	cfg := Config{DisableSHM: true, DisablePVM: true, RequestTimeout: timeout, PeerTimeout: 10 * time.Second}
	a, b := pair(t, cfg)
	const size = 4 << 20
	tr, _ := b.RegisterMem(make([]byte, size))
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	src := make([]byte, size)
	fill(src, 3)
	lr, _ := a.RegisterMem(src)
	req, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, size)}}, "b", DescList{Type: DRAM, Descs: []Desc{tr.Desc(0, size)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer req.Release()
	for i := range 2 {
		if _, err := req.Post(); err != nil {
			t.Fatalf("post %d: %v", i, err)
		}
		if err := req.Wait(ctxT(t)); err != nil {
			t.Fatalf("post %d: %v", i, err)
		}
		time.Sleep(timeout * 3 / 2)
	}
	if !bytes.Equal(tr.Bytes(), src) {
		t.Fatal("data differs")
	}
}

// fakePeer connects a progress engine of a to a pipe the test writes.
func fakePeer(t *testing.T, a *Agent) (*peer, net.Conn) {
	ours, theirs := net.Pipe()
	p := newPeer(a, theirs, bufio.NewReader(theirs), &agentInfo{Name: "fake"})
	a.mu.Lock()
	a.conns[p] = true
	a.wg.Add(2)
	a.mu.Unlock()
	go p.readLoop()
	go p.respond()
	go io.Copy(io.Discard, ours)
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

var _ = errors.Is

// TestRemoteFileErrorKeepsConnection: a peer's READ past the end of a FILE
// region's file, or a WRITE the file refuses, fails that request only; the
// connection and the peer stay.
func TestRemoteFileErrorKeepsConnection(t *testing.T) {
	a := newAgent(t, "a", Config{})
	b := newAgent(t, "b", Config{})
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	fr, err := b.RegisterFile(short, FileOptions{Length: 8192}) // the file holds 4096
	if err != nil {
		t.Fatal(err)
	}
	ro, err := os.Open(short)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	rr, err := b.RegisterFileFD(ro, FileOptions{Offset: 0, Length: 4095}) // read-only descriptor
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	lr, _ := a.RegisterMem(make([]byte, 8192))
	run := func(op Op, remote Desc) error {
		req, err := a.CreateRequest(op, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, remote.Len)}}, "b", DescList{Type: FILE, Descs: []Desc{remote}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer req.Release()
		req.Post()
		return req.Wait(ctxT(t))
	}
	if err := run(Read, fr.Desc(0, 8192)); err == nil {
		t.Fatal("a READ past the end of the file succeeded")
	}
	if err := run(Write, rr.Desc(0, 4095)); err == nil {
		t.Fatal("a WRITE to a read-only file succeeded")
	}
	if err := run(Read, fr.Desc(0, 4096)); err != nil {
		t.Fatalf("a good READ after the failed ones: %v", err)
	}
	if err := run(Write, fr.Desc(0, 4096)); err != nil {
		t.Fatalf("a good WRITE after the failed ones: %v", err)
	}
}

// TestWireAckPayload: an ack carries a payload only as an error text; the
// progress engine reads none otherwise, so the header must be refused
// rather than leave the stream out of step.
func TestWireAckPayload(t *testing.T) {
	var b [wireHeaderLen]byte
	putHeader(b[:], header{op: opAck, req: 1, length: 5})
	if _, err := parseHeader(b[:]); err == nil {
		t.Fatal("accepted an ack with a payload but no error flag")
	}
	putHeader(b[:], header{op: opAck, req: 1, flags: flagError, length: 5})
	if _, err := parseHeader(b[:]); err != nil {
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

// TestTargetRefusalIsOutOfBounds: a descriptor the target refuses (tcp)
// fails with ErrOutOfBounds, as documented, for WRITE and READ.
func TestTargetRefusalIsOutOfBounds(t *testing.T) {
	cfg := Config{DisableSHM: true, DisablePVM: true}
	a := newAgent(t, "a", cfg)
	b := newAgent(t, "b", cfg)
	gone, _ := b.RegisterMem(make([]byte, 4096))
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	lr, _ := a.RegisterMem(make([]byte, 4096))
	var reqs []*Request
	for _, op := range []Op{Write, Read} {
		req, err := a.CreateRequest(op, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, 4096)}}, "b", DescList{Type: DRAM, Descs: []Desc{gone.Desc(0, 4096)}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer req.Release()
		reqs = append(reqs, req)
	}
	if err := b.DeregisterMem(gone); err != nil {
		t.Fatal(err)
	}
	for _, req := range reqs {
		req.Post()
		if err := req.Wait(ctxT(t)); !errors.Is(err, ErrOutOfBounds) {
			t.Errorf("%v refused by the target: %v", req.op, err)
		}
	}
}

// TestPostAfterClose: a request posted after its agent closed fails with
// ErrClosed, whatever its backend.
func TestPostAfterClose(t *testing.T) {
	for _, bc := range backendConfigs {
		t.Run(bc.name, func(t *testing.T) {
			if runtime.GOOS != "linux" && bc.want != BackendTCP {
				t.Skip("linux only")
			}
			a, b := pair(t, bc.cfg)
			tr := targetRegion(t, b, 4096, bc.heap)
			if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
				t.Fatal(err)
			}
			req := request4K(t, a, Write, "b", tr.Desc(0, 4096))
			a.Close()
			if _, err := req.Post(); !errors.Is(err, ErrClosed) {
				t.Fatalf("Post after Close: %v", err)
			}
			if err := req.Wait(ctxT(t)); !errors.Is(err, ErrClosed) {
				t.Fatalf("Wait after a Post after Close: %v", err)
			}
		})
	}
}

// TestRepostWhileFramesGoOut: a tcp request that times out while its
// frames are still being written, and is posted again at once, must not
// have the old post's later frames (its commit) carry the new post's ID:
// the target would acknowledge the new post before its data arrived.
func TestRepostWhileFramesGoOut(t *testing.T) {
	a := newAgent(t, "a", Config{ListenAddr: "-", RequestTimeout: 5 * time.Second})
	const seg = 512 << 10
	ours := fakeTarget(t, a, 4*seg)

	lr, _ := a.RegisterMem(make([]byte, 4*seg))
	// Two pieces that do not merge, then the commit.
	req, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, seg), lr.Desc(2*seg, seg)}},
		"fake", DescList{Type: DRAM, Descs: []Desc{{Addr: 1 << 40, Len: seg}, {Addr: 1<<40 + 2*seg, Len: seg}}}, nil)
	if err != nil || req.Backend() != BackendTCP || req.Pieces() != 2 {
		t.Fatalf("%v %v", req, err)
	}
	readFrame := func() header { return readFrame(t, ours) }
	if _, err := req.Post(); err != nil {
		t.Fatal(err)
	}
	first := readFrame() // the second piece is now being written
	time.Sleep(20 * time.Millisecond)
	req.finish(ErrTimeout) // as the watchdog does
	req.Wait(ctxT(t))
	if _, err := req.Post(); err != nil {
		t.Fatal(err)
	}
	second, commit := readFrame(), readFrame()
	if second.req != first.req || commit.op != opCommit || commit.req != first.req {
		t.Fatalf("frames of one post: %v req %d, %v req %d, %v req %d", first.op, first.req, second.op, second.req, commit.op, commit.req)
	}
	req.finish(ErrTimeout)
	req.Wait(ctxT(t))
	req.Release()
}

// TestStaleBlobKeepsRegionDropped: a blob of the peer that is newer than
// the loaded one but older than a deregistration the peer announced must
// not bring the deregistered region back (pvm would write into memory the
// peer let go).
func TestStaleBlobKeepsRegionDropped(t *testing.T) {
	cfg := Config{DisableSHM: true, DisablePVM: true}
	a := newAgent(t, "a", cfg)
	b := newAgent(t, "b", cfg)
	b.RegisterMem(make([]byte, 4096))
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { b.mu.RLock(); defer b.mu.RUnlock(); return len(b.conns) > 0 }) // b's end of the connection is up
	r1, _ := b.RegisterMem(make([]byte, 4096))
	stale := b.LocalMetadata() // published, say, to a store
	if err := b.DeregisterMem(r1); err != nil {
		t.Fatal(err)
	}
	ra, _ := a.remote("b")
	waitFor(t, func() bool { _, ok := ra.droppedAny([]uint32{r1.ID()}); return ok })
	if _, err := a.LoadRemote(ctxT(t), stale); err != nil {
		t.Fatal(err)
	}
	if _, err := a.PrepareRemote("b", DescList{Type: DRAM, Descs: []Desc{r1.Desc(0, 4096)}}); !errors.Is(err, ErrOutOfBounds) {
		t.Fatalf("prepare against a region the peer deregistered: %v", err)
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

// fakeTarget makes a loaded, connected peer "fake" on another host with one
// DRAM region of size bytes at 1<<40, whose side of the connection the
// test reads and writes.
func fakeTarget(t *testing.T, a *Agent, size uint64) net.Conn {
	ours, theirs := net.Pipe()
	t.Cleanup(func() { ours.Close() })
	p := newPeer(a, theirs, bufio.NewReader(theirs), &agentInfo{Name: "fake"})
	info := &agentInfo{Name: "fake", Host: "elsewhere", Regions: []regionInfo{{ID: 1, Type: DRAM, Base: 1 << 40, Len: size}}}
	ra := newRemoteAgent(a, info, nil)
	a.mu.Lock()
	a.conns[p] = true
	a.peers["fake"] = p
	a.remotes["fake"] = ra
	a.wg.Add(2)
	a.mu.Unlock()
	go p.readLoop()
	go p.respond()
	return ours
}

func readFrame(t *testing.T, c net.Conn) header {
	t.Helper()
	var hb [wireHeaderLen]byte
	if _, err := io.ReadFull(c, hb[:]); err != nil {
		t.Fatal(err)
	}
	h, err := parseHeader(hb[:])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(io.Discard, c, int64(h.payloadLen())); err != nil {
		t.Fatal(err)
	}
	return h
}

// TestLateReadResponse: the answer to a READ that timed out, arriving while
// the request is posted again, must not complete the new post.
func TestLateReadResponse(t *testing.T) {
	a := newAgent(t, "a", Config{ListenAddr: "-", RequestTimeout: 5 * time.Second})
	c := fakeTarget(t, a, 4096)
	req := request4K(t, a, Read, "fake", Desc{Addr: 1 << 40, Len: 4096})
	req.Post()
	old := readFrame(t, c)
	// The answer starts; its data is slow to come.
	c.Write(frame(header{op: opReadResp, req: old.req, aux: old.aux, length: 4096}, nil))
	c.Write(make([]byte, 100))
	time.Sleep(20 * time.Millisecond)
	req.finish(ErrTimeout) // as the watchdog does
	req.Wait(ctxT(t))
	req.Post()
	if h := readFrame(t, c); h.req == old.req {
		t.Fatal("the new post reused the old ID")
	}
	c.Write(make([]byte, 4096-100)) // the rest of the old answer
	c.Write(frame(header{op: opPing}, nil))
	time.Sleep(20 * time.Millisecond)
	if st, err := req.Status(); st != StatusInProgress {
		t.Fatalf("the old post's answer finished the new post: %v, %v", st, err)
	}
	req.finish(ErrTimeout)
	req.Wait(ctxT(t))
	req.Release()
}

// TestReloadTakesMappingsFromUnusedOld: while a newer blob is loaded, the
// old remote's mappings move to the new one (or are unmapped, for segments
// the new blob lacks). From that moment the old remote must refuse new
// transfers: one that started on it would copy into memory that is unmapped
// or no longer its own.
func TestReloadTakesMappingsFromUnusedOld(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared memory is Linux only")
	}
	a := newAgent(t, "a", Config{})
	b := newAgent(t, "b", Config{})
	r1, _ := b.Alloc(1 << 20)
	b.Alloc(1 << 20)
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	lr, _ := a.RegisterMem(make([]byte, 4096))
	req, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, 4096)}}, "b", DescList{Type: DRAM, Descs: []Desc{r1.Desc(0, 4096)}}, nil)
	if err != nil || req.Backend() != BackendSHM {
		t.Fatalf("%v %v", req, err)
	}
	defer req.Release()
	old, _ := a.remote("b")
	// A newer blob without r1, as loadInfo builds it before the swap.
	info := *old.info
	info.Gen++
	info.Regions = nil
	for _, r := range old.info.Regions {
		if r.ID != r1.ID() {
			info.Regions = append(info.Regions, r)
		}
	}
	ra := newRemoteAgent(a, &info, old)
	defer ra.invalidate()
	// A Post on the old remote in this window.
	if _, err := req.Post(); !errors.Is(err, ErrRemoteDisconnect) {
		t.Fatalf("Post on a remote whose mappings were taken: %v", err)
	}
}

// TestRepostRightAfterStatusDone: a request posted again as soon as Status
// says done must not have its new post's done channel closed by the
// goroutine that finished the previous post (Wait would return at once,
// and the post's own finish would close the channel twice). Run with -race.
func TestRepostRightAfterStatusDone(t *testing.T) {
	a, b := pair(t, Config{InlineLimit: -1})
	tr := targetRegion(t, b, 4096, false)
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	req := request4K(t, a, Write, "b", tr.Desc(0, 4096))
	defer req.Release()
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		if _, err := req.Post(); err != nil {
			t.Fatal(err)
		}
		for {
			st, err := req.Status()
			if st == StatusFailed {
				t.Fatal(err)
			}
			if st == StatusDone {
				break
			}
		}
	}
	req.Wait(ctxT(t))
}

// TestLateReadAnswerAfterTimeout: a READ answer still arriving when its
// post times out must not land in the request's memory afterwards: the
// owner may release the request, deregister the region and reuse the
// memory (heap) or have it unmapped (Alloc) at once. The rest of the
// answer is drained and the connection goes on.
func TestLateReadAnswerAfterTimeout(t *testing.T) {
	for _, kind := range []string{"heap", "alloc"} {
		t.Run(kind, func(t *testing.T) {
			if kind == "alloc" && runtime.GOOS != "linux" {
				t.Skip("shared memory is Linux only")
			}
			a := newAgent(t, "a", Config{ListenAddr: "-", RequestTimeout: 50 * time.Millisecond, PeerTimeout: time.Minute})
			const n = 1 << 20
			c := fakeTarget(t, a, n)
			buf := make([]byte, n)
			lr, err := a.RegisterMem(buf)
			if kind == "alloc" {
				lr, err = a.Alloc(n)
			}
			if err != nil {
				t.Fatal(err)
			}
			req, err := a.CreateRequest(Read, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, n)}}, "fake", DescList{Type: DRAM, Descs: []Desc{{Addr: 1 << 40, Len: n}}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Post()
			h := readFrame(t, c)
			pongs := drainFrames(c) // DeregisterMem sends an invalidate
			// The answer starts, then stalls past RequestTimeout.
			c.Write(frame(header{op: opReadResp, req: h.req, aux: h.aux, length: n}, nil))
			c.Write(bytes.Repeat([]byte{0xee}, 100))
			if err := req.Wait(ctxT(t)); !errors.Is(err, ErrTimeout) {
				t.Fatalf("want ErrTimeout, got %v", err)
			}
			if err := req.Release(); err != nil {
				t.Fatal(err)
			}
			if err := a.DeregisterMem(lr); err != nil {
				t.Fatalf("deregister after the request failed: %v", err)
			}
			if kind == "heap" {
				for i := range buf { // the memory is the application's again
					buf[i] = 0x11
				}
			}
			c.Write(bytes.Repeat([]byte{0xee}, n-100)) // the rest of the answer
			c.Write(frame(header{op: opPing}, nil))
			select {
			case <-pongs: // the reader is past the answer
			case <-time.After(10 * time.Second):
				t.Fatal("no pong after the late answer")
			}
			if i := bytes.IndexByte(buf, 0xee); kind == "heap" && i >= 0 {
				t.Fatalf("the answer landed in memory deregistered after its request failed (byte %d)", i)
			}
		})
	}
}

// drainFrames reads the agent's frames from c in the background and
// signals each pong.
func drainFrames(c net.Conn) <-chan struct{} {
	pongs := make(chan struct{}, 16)
	go func() {
		var hb [wireHeaderLen]byte
		for {
			if _, err := io.ReadFull(c, hb[:]); err != nil {
				return
			}
			h, err := parseHeader(hb[:])
			if err != nil {
				return
			}
			if _, err := io.CopyN(io.Discard, c, int64(h.payloadLen())); err != nil {
				return
			}
			if h.op == opPong {
				pongs <- struct{}{}
			}
		}
	}()
	return pongs
}

// TestWriteAfterTimeoutLeavesMemory: a tcp WRITE whose post fails (times
// out) while its frames are still going out must not read its memory
// afterwards, when the owner may already reuse it: the frame under way
// ends in zeros, the later pieces are not sent, and the commit asks for no
// notification (the target must not take the reused bytes for the data).
func TestWriteAfterTimeoutLeavesMemory(t *testing.T) {
	a := newAgent(t, "a", Config{ListenAddr: "-", RequestTimeout: 5 * time.Second})
	const seg = 512 << 10
	c := fakeTarget(t, a, 4*seg)
	buf := bytes.Repeat([]byte{0xaa}, 4*seg)
	lr, _ := a.RegisterMem(buf)
	// Two pieces that do not merge, then the commit.
	req, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, seg), lr.Desc(2*seg, seg)}},
		"fake", DescList{Type: DRAM, Descs: []Desc{{Addr: 1 << 40, Len: seg}, {Addr: 1<<40 + 2*seg, Len: seg}}},
		&RequestOptions{Notif: []byte("done")})
	if err != nil || req.Backend() != BackendTCP || req.Pieces() != 2 {
		t.Fatalf("%v %v", req, err)
	}
	req.Post()
	var hb [wireHeaderLen]byte
	if _, err := io.ReadFull(c, hb[:]); err != nil { // the first piece's data is going out
		t.Fatal(err)
	}
	first, err := parseHeader(hb[:])
	if err != nil || first.op != opWrite {
		t.Fatalf("%v %v", first.op, err)
	}
	req.finish(ErrTimeout) // as the watchdog does
	if err := req.Wait(ctxT(t)); !errors.Is(err, ErrTimeout) {
		t.Fatal(err)
	}
	if err := req.Release(); err != nil {
		t.Fatal(err)
	}
	for i := range buf { // the memory is the application's again
		buf[i] = 0x11
	}
	payload := make([]byte, first.length)
	if _, err := io.ReadFull(c, payload); err != nil {
		t.Fatal(err)
	}
	if i := bytes.IndexByte(payload, 0x11); i >= 0 {
		t.Fatalf("byte %d of the frame was read from memory reused after its request failed", i)
	}
	if h := readFrame(t, c); h.op != opCommit || h.req != first.req || h.flags&flagNotify != 0 {
		t.Fatalf("after the failed post's frame: %v req %d flags %#x, want its commit without a notification", h.op, h.req, h.flags)
	}
}

// TestCloseFailsWriteInFlight: Close fails a tcp WRITE whose frames are
// still going out with ErrClosed, as documented, although the goodbye's
// short write deadline breaks the connection's writer first.
func TestCloseFailsWriteInFlight(t *testing.T) {
	a := newAgent(t, "a", Config{ListenAddr: "-"})
	const n = 1 << 20
	c := fakeTarget(t, a, n)
	lr, _ := a.RegisterMem(make([]byte, n))
	req, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, n)}}, "fake", DescList{Type: DRAM, Descs: []Desc{{Addr: 1 << 40, Len: n}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Post()
	var hb [wireHeaderLen]byte
	if _, err := io.ReadFull(c, hb[:]); err != nil { // the data is going out; nobody reads it
		t.Fatal(err)
	}
	a.Close()
	if err := req.Wait(ctxT(t)); !errors.Is(err, ErrClosed) {
		t.Fatalf("a WRITE in flight at Close: %v, want ErrClosed", err)
	}
}
