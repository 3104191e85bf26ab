package p2p

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

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

// TestLateReadAnswerAfterTimeout: a READ answer still arriving when its
// post times out must not land in the request's memory afterwards: the
// owner may release the request, deregister the region and reuse the
// memory (heap) or have it unmapped (Alloc) at once. The rest of the
// answer is drained and the connection goes on.
func TestLateReadAnswerAfterTimeout(t *testing.T) {
	for _, kind := range []string{"heap", "alloc"} {
		t.Run(kind, func(t *testing.T) {
			if kind == "alloc" {
				skipWithout(t, BackendSHM)
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
