package p2p

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"runtime/pprof"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gccl/gccl/internal/testutil"
)

// fakeTargetTCP is fakeTarget over a loopback TCP connection (a socket,
// so the tcp backend's direct writes, nonblocking small posts and spinning
// reads are in play) rather than net.Pipe.
func fakeTargetTCP(t *testing.T, a *Agent, size uint64) net.Conn {
	t.Helper()
	theirs, ours := testutil.TCPPair(t)
	p := newPeer(a, theirs, bufio.NewReader(theirs), &agentInfo{Name: "fake"})
	if p.tc.raw == nil {
		t.Fatal("a TCP connection without raw socket access")
	}
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

// bigWrite makes a one-piece WRITE of n bytes of buf to the fake target.
func bigWrite(t *testing.T, a *Agent, buf []byte, opts *RequestOptions) *Request {
	t.Helper()
	lr, err := a.RegisterMem(buf)
	if err != nil {
		t.Fatal(err)
	}
	n := uint64(len(buf))
	req, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, n)}},
		"fake", DescList{Type: DRAM, Descs: []Desc{{Addr: 1 << 40, Len: n}}}, opts)
	if err != nil || req.Backend() != BackendTCP {
		t.Fatalf("%v %v", req, err)
	}
	return req
}

// TestTCPDirectWriteStopsAtTimeout: a large WRITE goes to the socket
// straight from the post's memory; once the post has failed (timed out)
// nothing more is read from that memory: the rest of its frame is zeros,
// and its commit carries no notification.
func TestTCPDirectWriteStopsAtTimeout(t *testing.T) {
	// The fake target answers no pings: PeerTimeout must outlast the test.
	a := newAgent(t, "a", Config{ListenAddr: "-", RequestTimeout: time.Minute, PeerTimeout: time.Minute})
	const n = 32 << 20 // more than loopback's socket buffers hold
	c := fakeTargetTCP(t, a, n)
	buf := bytes.Repeat([]byte{0xaa}, n)
	req := bigWrite(t, a, buf, &RequestOptions{Notif: []byte("done")})
	req.Post()
	var hb [wireHeaderLen]byte
	if _, err := io.ReadFull(c, hb[:]); err != nil {
		t.Fatal(err)
	}
	first, err := parseHeader(hb[:])
	if err != nil || first.op != opWrite || first.length != n {
		t.Fatalf("%v %v", first, err)
	}
	time.Sleep(20 * time.Millisecond) // the socket's buffers fill; the writer waits for room
	req.finish(ErrTimeout)            // as the watchdog does
	if err := req.Wait(ctxT(t)); !errors.Is(err, ErrTimeout) {
		t.Fatal(err)
	}
	sent := req.tcpLanded[0].Load()
	if sent == 0 || sent >= n {
		t.Fatalf("%d of %d bytes went out before the post failed: the test did not cut the stream", sent, n)
	}
	for i := range buf { // the memory is the application's again
		buf[i] = 0x11
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(c, payload); err != nil {
		t.Fatal(err)
	}
	if i := bytes.IndexByte(payload, 0x11); i >= 0 {
		t.Fatalf("byte %d of the frame was read from memory reused after its request failed", i)
	}
	if i := bytes.IndexByte(payload, 0); i >= 0 && uint64(i) < sent {
		t.Fatalf("byte %d is zero, but %d bytes were sent live", i, sent)
	}
	if bytes.IndexByte(payload[sent:], 0xaa) >= 0 {
		t.Fatal("bytes past what the post sent live are not zeros")
	}
	if h := readFrame(t, c); h.op != opCommit || h.req != first.req || h.flags&flagNotify != 0 {
		t.Fatalf("after the failed post's frame: %v flags %#x, want its commit without a notification", h.op, h.flags)
	}
}

// TestTCPPeerLostMidStream: a peer that goes away while a large WRITE
// streams to it fails the post with ErrRemoteDisconnect naming the peer.
func TestTCPPeerLostMidStream(t *testing.T) {
	a := newAgent(t, "a", Config{ListenAddr: "-", RequestTimeout: time.Minute, PeerTimeout: time.Minute})
	const n = 32 << 20
	c := fakeTargetTCP(t, a, n)
	req := bigWrite(t, a, make([]byte, n), nil)
	req.Post()
	if _, err := io.ReadFull(c, make([]byte, wireHeaderLen+1<<20)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	err := req.Wait(ctxT(t))
	if !errors.Is(err, ErrRemoteDisconnect) || !strings.Contains(err.Error(), "fake") {
		t.Fatalf("peer lost mid-stream: %v, want ErrRemoteDisconnect naming fake", err)
	}
}

// TestTCPSmallPostsDoNotWait: small posts run inline, on Post's goroutine,
// but never wait for a peer that does not read: what the socket does not
// take is sent by the responder later, in order. Once the peer reads, it
// finds every post's frames, whole and in posting order, and its acks
// finish them all.
func TestTCPSmallPostsDoNotWait(t *testing.T) {
	a := newAgent(t, "a", Config{ListenAddr: "-", RequestTimeout: time.Minute, PeerTimeout: time.Minute})
	const piece, posts = directMin, 256 // 16 MiB: more than the socket buffers hold
	c := fakeTargetTCP(t, a, piece)
	buf := make([]byte, piece*posts)
	fill(buf, 3)
	lr, err := a.RegisterMem(buf)
	if err != nil {
		t.Fatal(err)
	}
	reqs := make([]*Request, posts)
	for i := range reqs {
		reqs[i], err = a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{lr.Desc(uint64(i*piece), piece)}},
			"fake", DescList{Type: DRAM, Descs: []Desc{{Addr: 1 << 40, Len: piece}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
	}
	posted := make(chan error, 1)
	go func() {
		for _, r := range reqs {
			if _, err := r.Post(); err != nil {
				posted <- err
				return
			}
		}
		posted <- nil
	}()
	select {
	case err := <-posted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second): // far below RequestTimeout: Post waited for the peer
		pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
		t.Fatal("Post of small requests waited for a peer that does not read")
	}
	payload := make([]byte, piece)
	var last uint64
	for i := range reqs {
		h := readFrame0(t, c, payload)
		if h.op != opWrite || h.length != piece || h.req <= last {
			t.Fatalf("post %d: %v req %d length %d after req %d", i, h.op, h.req, h.length, last)
		}
		if !bytes.Equal(payload, buf[i*piece:(i+1)*piece]) {
			t.Fatalf("post %d: its data arrived changed", i)
		}
		if cm := readFrame(t, c); cm.op != opCommit || cm.req != h.req {
			t.Fatalf("post %d: %v req %d after its data, want its commit", i, cm.op, cm.req)
		}
		last = h.req
		c.Write(frame(header{op: opAck, req: h.req}, nil))
	}
	for i, r := range reqs {
		if err := r.Wait(ctxT(t)); err != nil {
			t.Fatalf("post %d: %v", i, err)
		}
	}
}

// readFrame0 reads a frame's header and its payload into payload.
func readFrame0(t *testing.T, c net.Conn, payload []byte) header {
	t.Helper()
	var hb [wireHeaderLen]byte
	if _, err := io.ReadFull(c, hb[:]); err != nil {
		t.Fatal(err)
	}
	h, err := parseHeader(hb[:])
	if err != nil {
		t.Fatal(err)
	}
	if h.payloadLen() != uint64(len(payload)) {
		t.Fatalf("%v with %d payload bytes, want %d", h.op, h.payloadLen(), len(payload))
	}
	if _, err := io.ReadFull(c, payload); err != nil {
		t.Fatal(err)
	}
	return h
}

// TestTCPPairSmallAndLarge runs WRITEs and READs of every size class
// between two agents over tcp and checks the bytes: inline small posts,
// acks and small READ answers from the progress loop, direct large
// writes.
func TestTCPPairSmallAndLarge(t *testing.T) {
	a, b := pair(t, Config{DisableSHM: true, DisablePVM: true})
	const size = 8 << 20
	src, dst := make([]byte, size), make([]byte, size)
	lr, _ := a.RegisterMem(src)
	rr, _ := b.RegisterMem(dst)
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 4096, directMin - 1, directMin, directMin + 1, 1 << 20, size} {
		for _, op := range []Op{Write, Read} {
			fill(src[:n], byte(n))
			if op == Read {
				fill(dst[:n], byte(n)+1)
			}
			req, err := a.CreateRequest(op, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, uint64(n))}},
				b.Name(), DescList{Type: DRAM, Descs: []Desc{rr.Desc(0, uint64(n))}}, &RequestOptions{Notif: []byte("n")})
			if err != nil {
				t.Fatal(err)
			}
			if req.Backend() != BackendTCP {
				t.Fatalf("backend %v", req.Backend())
			}
			for range 3 {
				if _, err := req.Post(); err != nil {
					t.Fatal(err)
				}
				if err := req.Wait(ctxT(t)); err != nil {
					t.Fatalf("%v of %d bytes: %v", op, n, err)
				}
			}
			req.Release()
			if !bytes.Equal(src[:n], dst[:n]) {
				t.Fatalf("%v of %d bytes: data differs", op, n)
			}
		}
	}
}

func TestSpinGaugeAdapts(t *testing.T) {
	if spinOff {
		t.Skip("GCCL_P2P_TCP_SPIN=0")
	}
	var g spinGauge
	if b := g.budget(); b != spinMaxNs {
		t.Fatalf("a new gauge's budget %d, want %d", b, spinMaxNs)
	}
	// Spins that do not pay halve the budget down to nothing.
	for b := g.budget(); b > 0; b = g.budget() {
		g.report(b, false)
		if nb := g.budget(); nb != 0 && nb != b/2 {
			t.Fatalf("after a lost spin of %d: %d", b, nb)
		}
	}
	// Then only every spinProbeEvery-th wait spins, briefly.
	probes := 0
	for range 4 * spinProbeEvery {
		if b := g.budget(); b > 0 {
			if b != spinMinNs {
				t.Fatalf("probe budget %d", b)
			}
			probes++
		}
	}
	if probes != 4 {
		t.Fatalf("%d probes in %d waits, want 4", probes, 4*spinProbeEvery)
	}
	// A probe that pays brings spinning back, doubling up to the maximum.
	g.report(spinMinNs, true)
	for b := g.budget(); b < spinMaxNs; b = g.budget() {
		g.report(b, true)
		if nb := g.budget(); nb != min(2*b, spinMaxNs) {
			t.Fatalf("after a won spin of %d: %d", b, nb)
		}
	}
}

// TestTCPSmallPostWriterBusy: a small post finds the connection's writer
// held (by the responder waiting for a peer that does not read, say): Post
// does not wait for it (it may run on the progress loop, from a completion
// callback), and the post goes out once the writer is free.
func TestTCPSmallPostWriterBusy(t *testing.T) {
	a := newAgent(t, "a", Config{ListenAddr: "-"})
	c := fakeTargetTCP(t, a, 4096)
	req := request4K(t, a, Write, "fake", Desc{Addr: 1 << 40, Len: 4096})
	a.mu.RLock()
	p := a.peers["fake"]
	a.mu.RUnlock()
	p.wmu.Lock()
	posted := make(chan error, 1)
	go func() { _, err := req.Post(); posted <- err }()
	select {
	case err := <-posted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		p.wmu.Unlock()
		t.Fatal("Post of a small request waited for a busy writer")
	}
	p.wmu.Unlock()
	h := readFrame(t, c)
	if cm := readFrame(t, c); h.op != opWrite || cm.op != opCommit || cm.req != h.req {
		t.Fatalf("frames %v, %v", h.op, cm.op)
	}
	c.Write(frame(header{op: opAck, req: h.req}, nil))
	if err := req.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// TestTCPRoundTripAllocs: a small tcp WRITE or READ, posted again and
// waited for, allocates nothing but its done channel, on either side
// (AllocsPerRun counts every goroutine of the process: both agents').
func TestTCPRoundTripAllocs(t *testing.T) {
	a, b := pair(t, Config{DisableSHM: true, DisablePVM: true})
	src, dst := make([]byte, 4096), make([]byte, 4096)
	lr, _ := a.RegisterMem(src)
	rr, _ := b.RegisterMem(dst)
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	for _, op := range []Op{Write, Read} {
		req, err := a.CreateRequest(op, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, 4096)}},
			b.Name(), DescList{Type: DRAM, Descs: []Desc{rr.Desc(0, 4096)}}, nil)
		if err != nil || req.Backend() != BackendTCP {
			t.Fatalf("%v %v", req, err)
		}
		ctx := ctxT(t)
		run := func() {
			if _, err := req.Post(); err != nil {
				t.Fatal(err)
			}
			if err := req.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
		run()
		if allocs := testing.AllocsPerRun(200, run); allocs > 1 {
			t.Errorf("%v: %.1f allocations per round trip, want at most 1 (the done channel)", op, allocs)
		}
		req.Release()
	}
}

// TestTCPKeepsBytesAfterHello: frames the peer sent right behind its hello,
// already in the handshake's buffer, are served once the connection's
// progress loop reads through its own socket reader.
func TestTCPKeepsBytesAfterHello(t *testing.T) {
	a := newAgent(t, "a", Config{ListenAddr: "-"})
	theirs, ours := testutil.TCPPair(t)
	ours.Write(append(frame(header{op: opPing, aux: 7}, nil), frame(header{op: opPing, aux: 8}, nil)...))
	br := bufio.NewReader(theirs)
	if _, err := br.Peek(2 * wireHeaderLen); err != nil { // both pings wait in the handshake's buffer
		t.Fatal(err)
	}
	p := newPeer(a, theirs, br, &agentInfo{Name: "fake"})
	a.mu.Lock()
	a.conns[p] = true
	a.peers["fake"] = p
	a.wg.Add(2)
	a.mu.Unlock()
	go p.readLoop()
	go p.respond()
	ours.Write(frame(header{op: opPing, aux: 9}, nil)) // and one through the socket reader
	for _, want := range []uint64{7, 8, 9} {
		if h := readFrame(t, ours); h.op != opPong || h.aux != want {
			t.Fatalf("%v %d, want the pong of ping %d", h.op, h.aux, want)
		}
	}
}

// TestTCPRepliesInOrderWhenSocketFull: READ answers and acks that the
// progress loop sends itself while the socket has room, and that the
// responder sends once it has not, reach the peer in the order of the
// requests, whole, however many the peer leaves unread.
func TestTCPRepliesInOrderWhenSocketFull(t *testing.T) {
	a := newAgent(t, "a", Config{ListenAddr: "-", RequestTimeout: time.Minute, PeerTimeout: time.Minute})
	c := fakeTargetTCP(t, a, 4096)
	mem := make([]byte, directMin)
	fill(mem, 9)
	r, err := a.RegisterMem(mem)
	if err != nil {
		t.Fatal(err)
	}
	const reads = 400 // 25 MiB of answers: more than the socket buffers hold
	var out []byte
	for i := range reads {
		out = append(out, frame(header{op: opReadReq, region: r.ID(), req: 1, aux: uint64(i), offset: r.Addr(), length: directMin}, nil)...)
		if i == reads/2 { // a WRITE in the middle: its ack comes between the answers
			out = append(out, frame(header{op: opWrite, region: r.ID(), req: 2, offset: r.Addr(), length: 0}, nil)...)
			out = append(out, frame(header{op: opCommit, req: 2, flags: flagAck}, nil)...)
		}
	}
	if _, err := c.Write(out); err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, directMin)
	for i := range reads {
		h := readFrame0(t, c, payload)
		if h.op != opReadResp || h.aux != uint64(i) {
			t.Fatalf("reply %d: %v aux %d", i, h.op, h.aux)
		}
		if !bytes.Equal(payload, mem) {
			t.Fatalf("answer %d differs", i)
		}
		if i == reads/2 {
			if h := readFrame(t, c); h.op != opAck || h.req != 2 {
				t.Fatalf("after answer %d: %v req %d, want the WRITE's ack", i, h.op, h.req)
			}
		}
	}
}

// TestTCPPayloadSpinRead: with spinRead set (the target reading a WRITE's
// payload), Read polls for the next bytes a while, then sleeps in the
// poller as before: data sent in pieces, with gaps inside and beyond the
// poll window, arrives whole and in order, and the end of the stream is
// reported.
func TestTCPPayloadSpinRead(t *testing.T) {
	sender, conn := testutil.TCPPair(t)
	defer sender.Close()
	tc := newTCPConn(conn)
	if tc.raw == nil {
		t.Fatal("a TCP connection without raw socket access")
	}
	tc.spinRead = true

	const size = 3 << 20
	want := make([]byte, size)
	fill(want, 7)
	for i := range want {
		want[i] += byte(i / 4093)
	}
	gaps := []time.Duration{0, 10 * time.Microsecond, 5 * payloadSpinNs, 0, 20 * time.Millisecond}
	sent := make(chan error, 1)
	go func() {
		piece := size / len(gaps)
		for i, gap := range gaps {
			time.Sleep(gap)
			end := (i + 1) * piece
			if i == len(gaps)-1 {
				end = size
			}
			if _, err := sender.Write(want[i*piece : end]); err != nil {
				sent <- err
				return
			}
		}
		sent <- sender.(*net.TCPConn).CloseWrite()
	}()
	got := make([]byte, size)
	if _, err := io.ReadFull(tc, got); err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the payload read by polling differs from what was sent")
	}
	if n, err := tc.Read(got[:1]); n != 0 || err != io.EOF {
		t.Fatalf("Read after the sender closed: %d, %v; want 0, EOF", n, err)
	}
}

// narrowSendBuffer shrinks a's send buffer towards fakeTargetTCP's peer to
// 64 KiB (no autotuning), so that a 1 MiB write cannot fit, and returns
// that peer.
func narrowSendBuffer(t *testing.T, a *Agent) *peer {
	t.Helper()
	a.mu.RLock()
	p := a.peers["fake"]
	a.mu.RUnlock()
	// The connection may be out of the netpoller (fdConn): set the option
	// on its descriptor.
	raw, err := p.conn.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 64<<10)
	}); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	return p
}

// TestTCPInlineWriteKeepsWhatTheSocketRefuses: a WRITE of up to inlineMax
// of host memory is written by Post itself, straight from its memory, and
// never waits for the peer: with the socket's buffers small and the peer
// not reading, Post returns at once with the rest of the data kept for the
// responder, which sends it, in order, once the peer reads.
func TestTCPInlineWriteKeepsWhatTheSocketRefuses(t *testing.T) {
	a := newAgent(t, "a", Config{ListenAddr: "-", RequestTimeout: time.Minute, PeerTimeout: time.Minute})
	const size = inlineMax
	c := fakeTargetTCP(t, a, size)
	p := narrowSendBuffer(t, a)
	if err := c.(*net.TCPConn).SetReadBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, size)
	fill(buf, 5)
	req := bigWrite(t, a, buf, &RequestOptions{Notif: []byte("kept")})
	posted := make(chan error, 1)
	go func() {
		_, err := req.Post()
		posted <- err
	}()
	select {
	case err := <-posted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second): // far below RequestTimeout
		pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
		t.Fatal("an inline WRITE's Post waited for a peer that does not read")
	}
	if !req.postedInline.Load() {
		t.Fatal("a 1 MiB WRITE of host memory to an idle connection was not posted inline")
	}
	if p.tc.backlog.Load() == 0 {
		t.Fatal("the socket took 1 MiB through 64 KiB buffers: nothing was kept, the test shows nothing")
	}
	// The data arrives whole and in order (the responder sends what was
	// kept), then the commit with the notification.
	payload := make([]byte, size)
	h := readFrame0(t, c, payload)
	if h.op != opWrite || h.length != size {
		t.Fatalf("%v of %d bytes, want the WRITE", h.op, h.length)
	}
	if !bytes.Equal(payload, buf) {
		t.Fatal("the data arrived changed")
	}
	note := make([]byte, len("kept"))
	cm := readFrame0(t, c, note)
	if cm.op != opCommit || cm.req != h.req || cm.flags&flagNotify == 0 || string(note) != "kept" {
		t.Fatalf("%v req %d flags %#x payload %q after the data, want its commit with the notification", cm.op, cm.req, cm.flags, note)
	}
	c.Write(frame(header{op: opAck, req: h.req}, nil))
	if err := req.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// TestTCPInlineWritePeerLost: an inline WRITE whose rest was kept for the
// responder fails with ErrRemoteDisconnect naming the peer when the peer
// goes away before reading it, and Wait returns (no waiter spins on).
func TestTCPInlineWritePeerLost(t *testing.T) {
	a := newAgent(t, "a", Config{ListenAddr: "-", RequestTimeout: time.Minute, PeerTimeout: time.Minute})
	c := fakeTargetTCP(t, a, inlineMax)
	p := narrowSendBuffer(t, a)
	req := bigWrite(t, a, make([]byte, inlineMax), nil)
	if _, err := req.Post(); err != nil {
		t.Fatal(err)
	}
	if !req.postedInline.Load() || p.tc.backlog.Load() == 0 {
		t.Fatalf("posted inline %v, %d bytes kept: the test shows nothing", req.postedInline.Load(), p.tc.backlog.Load())
	}
	c.Close()
	err := req.Wait(ctxT(t))
	if !errors.Is(err, ErrRemoteDisconnect) || !strings.Contains(err.Error(), "fake") {
		t.Fatalf("peer lost with an inline WRITE's rest kept: %v, want ErrRemoteDisconnect naming fake", err)
	}
}
