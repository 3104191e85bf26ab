package p2p

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gccl/gccl/bootstrap"
	"github.com/gccl/gccl/internal/testutil"
	"github.com/gccl/gccl/internal/uring"
)

// TestPartialCompletion splits a WRITE in four parts ("layers"): the target
// gets one notification per part, in order, each after that part's data.
func TestPartialCompletion(t *testing.T) {
	for _, bc := range backendConfigs {
		t.Run(bc.name, func(t *testing.T) {
			skipWithout(t, bc.want)
			a := newAgent(t, "a", bc.cfg)
			b := newAgent(t, "b", bc.cfg)
			const layer, layers = 256 << 10, 4
			tr := targetRegion(t, b, layer*layers, bc.heap)
			if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
				t.Fatal(err)
			}
			src := make([]byte, layer*layers)
			fill(src, 5)
			lr, _ := a.RegisterMem(src)
			var local, remote []Desc
			var parts []Part
			for l := 0; l < layers; l++ {
				for blk := 0; blk < 4; blk++ { // four contiguous blocks per layer: merged, but not across layers
					off := uint64(l*layer + blk*layer/4)
					local = append(local, lr.Desc(off, layer/4))
					remote = append(remote, tr.Desc(off, layer/4))
				}
				parts = append(parts, Part{End: len(local), Notif: []byte{'L', byte('0' + l)}})
			}
			var cbErr error
			var cbCount int
			var mu sync.Mutex
			req, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: local}, "b", DescList{Type: DRAM, Descs: remote},
				&RequestOptions{Parts: parts, OnComplete: func(r *Request, err error) { mu.Lock(); cbErr, cbCount = err, cbCount+1; mu.Unlock() }})
			if err != nil {
				t.Fatal(err)
			}
			if req.Pieces() != layers {
				t.Fatalf("%d pieces, want one per layer", req.Pieces())
			}
			req.Post()
			seen := 0
			for seen < layers {
				n, err := b.WaitNotifs(ctxT(t))
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range n["a"] {
					if string(m) != string([]byte{'L', byte('0' + seen)}) {
						t.Fatalf("notification %q, want layer %d", m, seen)
					}
					off := seen * layer
					if !bytes.Equal(tr.Bytes()[off:off+layer], src[off:off+layer]) {
						t.Fatalf("layer %d notified before its data", seen)
					}
					seen++
				}
			}
			if err := req.Wait(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if req.PartsDone() != layers || cbCount != 1 || cbErr != nil {
				t.Fatalf("parts done %d, callback ran %d times with %v", req.PartsDone(), cbCount, cbErr)
			}
			req.Release()
		})
	}
}

// TestOutOfBoundsRefusedByTarget: the initiator still holds a list prepared
// against a region the target has deregistered since; the target refuses
// the transfer (tcp) on its side. Descriptors outside the metadata are
// refused when preparing.
func TestOutOfBoundsRefusedByTarget(t *testing.T) {
	cfg := Config{DisableSHM: true, DisablePVM: true}
	a := newAgent(t, "a", cfg)
	b := newAgent(t, "b", cfg)
	keep, _ := b.RegisterMem(make([]byte, 8192))
	gone, _ := b.RegisterMem(make([]byte, 8192))
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	src := make([]byte, 8192)
	lr, _ := a.RegisterMem(src)
	if _, err := a.PrepareRemote("b", DescList{Type: DRAM, Descs: []Desc{keep.Desc(4096, 8192)}}); !errors.Is(err, ErrOutOfBounds) {
		t.Fatalf("descriptor past the end: %v", err)
	}
	var lists []*PreparedList
	for range 2 {
		rl, err := a.PrepareRemote("b", DescList{Type: DRAM, Descs: []Desc{gone.Desc(0, 4096)}})
		if err != nil {
			t.Fatal(err)
		}
		lists = append(lists, rl)
	}
	if err := b.DeregisterMem(gone); err != nil {
		t.Fatal(err)
	}
	ll, _ := a.PrepareLocal(DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, 4096)}})
	for i, op := range []Op{Write, Read} {
		req, err := a.MakeRequest(op, ll, nil, lists[i], nil, &RequestOptions{Notif: []byte("must not arrive")})
		if err != nil {
			t.Fatal(err)
		}
		req.Post()
		err = req.Wait(ctxT(t))
		if err == nil || !strings.Contains(err.Error(), "outside the registered regions") {
			t.Fatalf("%v of a deregistered region: %v", op, err)
		}
		req.Release()
		lists[i].Release()
	}
	ll.Release()
	if n := b.GetNotifs(); n != nil {
		t.Fatalf("refused transfer notified: %q", n)
	}
	// The connection survives a refusal.
	req, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, 8192)}}, "b", DescList{Type: DRAM, Descs: []Desc{keep.Desc(0, 8192)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Post()
	if err := req.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// TestDeregisteredSharedRegion: the target deregisters a shared region
// behind a prepared list; once its invalidation arrived, shm requests on it
// are refused (and nothing is unmapped under them).
func TestDeregisteredSharedRegion(t *testing.T) {
	a := newAgent(t, "a", Config{})
	b := newAgent(t, "b", Config{})
	tr, err := b.Alloc(8192)
	testutil.SkipIfNotSupported(t, err) // shared memory off Linux
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	lr, _ := a.RegisterMem(make([]byte, 8192))
	req, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, 8192)}}, "b", DescList{Type: DRAM, Descs: []Desc{tr.Desc(0, 8192)}}, nil)
	if err != nil || req.Backend() != BackendSHM {
		t.Fatalf("%v %v", req.Backend(), err)
	}
	if _, err := req.Post(); err != nil {
		t.Fatal(err)
	}
	if err := b.DeregisterMem(tr); err != nil {
		t.Fatal(err)
	}
	ra, _ := a.remote("b")
	waitFor(t, func() bool { _, ok := ra.droppedAny([]uint32{tr.ID()}); return ok })
	if _, err := req.Post(); !errors.Is(err, ErrOutOfBounds) {
		t.Fatalf("Post into a deregistered shared region: %v", err)
	}
	req.Release()
}

// TestFileBackend runs on both file engines: io_uring (where the kernel
// allows it) and the goroutine pool it falls back to (forced here).
func TestFileBackend(t *testing.T) {
	for _, forceGoroutines := range []bool{false, true} {
		engine := map[bool]string{false: "io_uring", true: "goroutines"}[forceGoroutines]
		t.Run(engine, func(t *testing.T) { testFileBackend(t, forceGoroutines) })
	}
}

func testFileBackend(t *testing.T, forceGoroutines bool) {
	dir := t.TempDir()
	for _, direct := range []bool{false, true} {
		for _, unaligned := range []bool{false, true} {
			name := map[bool]string{false: "buffered", true: "direct"}[direct] + map[bool]string{false: "-aligned", true: "-unaligned"}[unaligned]
			t.Run(name, func(t *testing.T) {
				a := newAgent(t, "a", Config{ListenAddr: "-", FileBlockSize: 64 << 10, FileQueueDepth: 3, DisableIOURing: forceGoroutines})
				if wantGoroutines := forceGoroutines || uring.Available() != nil; wantGoroutines != (a.files.ring == nil) ||
					wantGoroutines != strings.HasPrefix(a.files.engine, "goroutines") {
					t.Fatalf("file engine %q (io_uring: %v)", a.files.engine, uring.Available())
				}
				path := filepath.Join(dir, name)
				const size = 1<<20 + 8192
				fr, err := a.RegisterFile(path, FileOptions{Length: size, Create: true, Direct: direct})
				testutil.SkipIfNotSupported(t, err) // O_DIRECT off Linux
				buf := alignedBuffer(size + 1)
				if unaligned {
					buf = buf[1:] // memory off alignment: bounce buffers
				} else {
					buf = buf[:size]
				}
				fill(buf, 17)
				lr, _ := a.RegisterMem(buf)
				descs := func(r *Region, shift uint64) []Desc {
					if unaligned { // odd offsets and lengths: the page-cache path
						return []Desc{r.Desc(3+shift, 5000), r.Desc(5003+shift, 300000), r.Desc(600001+shift, size-600001-shift)}
					}
					return []Desc{r.Desc(0, 4096), r.Desc(8192, 512<<10), r.Desc(8192+512<<10, size-8192-512<<10)}
				}
				wr, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: descs(lr, 0)}, "a", DescList{Type: FILE, Descs: descs(fr, 0)},
					&RequestOptions{Notif: []byte("saved")})
				if err != nil {
					t.Fatal(err)
				}
				if wr.Backend() != BackendFile {
					t.Fatalf("backend %v", wr.Backend())
				}
				wr.Post()
				if err := wr.Wait(ctxT(t)); err != nil {
					t.Fatal(err)
				}
				onDisk, _ := os.ReadFile(path)
				for _, d := range descs(lr, 0) {
					off := d.Addr - lr.Addr()
					if !bytes.Equal(onDisk[off:off+d.Len], buf[off:off+d.Len]) {
						t.Fatalf("file bytes at %d differ", off)
					}
				}
				if n := a.GetNotifs(); len(n["a"]) != 1 {
					t.Fatalf("notifications %q", n)
				}
				want := append([]byte(nil), buf...)
				clear(buf)
				rd, err := a.CreateRequest(Read, DescList{Type: DRAM, Descs: descs(lr, 0)}, "a", DescList{Type: FILE, Descs: descs(fr, 0)}, nil)
				if err != nil {
					t.Fatal(err)
				}
				rd.Post()
				if err := rd.Wait(ctxT(t)); err != nil {
					t.Fatal(err)
				}
				for _, d := range descs(lr, 0) {
					off := d.Addr - lr.Addr()
					if !bytes.Equal(buf[off:off+d.Len], want[off:off+d.Len]) {
						t.Fatalf("read back bytes at %d differ", off)
					}
				}
				// Reading past the file's registered range is refused at prepare.
				if _, err := a.PrepareRemote("a", DescList{Type: FILE, Descs: []Desc{fr.Desc(size-10, 20)}}); !errors.Is(err, ErrOutOfBounds) {
					t.Fatalf("past the end: %v", err)
				}
				wr.Release()
				rd.Release()
				if err := a.DeregisterMem(fr); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestRemoteFile writes to and reads from a peer's file: the peer's
// progress engine does the file I/O.
func TestRemoteFile(t *testing.T) {
	a := newAgent(t, "a", Config{})
	b := newAgent(t, "b", Config{})
	fr, err := b.RegisterFile(filepath.Join(t.TempDir(), "kv"), FileOptions{Length: 3 << 20, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	src := make([]byte, 3<<20)
	fill(src, 23)
	lr, _ := a.RegisterMem(src)
	wr, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, 3<<20)}}, "b", DescList{Type: FILE, Descs: []Desc{fr.Desc(0, 3<<20)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	wr.Post()
	if err := wr.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	want := append([]byte(nil), src...)
	clear(src)
	rd, _ := a.CreateRequest(Read, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, 3<<20)}}, "b", DescList{Type: FILE, Descs: []Desc{fr.Desc(0, 3<<20)}}, nil)
	rd.Post()
	if err := rd.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(src, want) {
		t.Fatal("remote file round trip differs")
	}
}

// TestConnectDirect exchanges metadata over a socket, with no store.
func TestConnectDirect(t *testing.T) {
	a := newAgent(t, "a", Config{})
	b := newAgent(t, "b", Config{})
	name, err := a.Connect(ctxT(t), b.Addr())
	if err != nil || name != "b" {
		t.Fatalf("Connect: %q, %v", name, err)
	}
	waitFor(t, func() bool { _, err := b.remote("a"); return err == nil })
	strict := newAgent(t, "strict", Config{RequireToken: true})
	if _, err := a.Connect(ctxT(t), strict.Addr()); err == nil {
		t.Fatal("a token-less connection to a RequireToken agent was accepted")
	}
	// With the metadata loaded, the token is presented and accepted.
	if _, err := a.LoadRemote(ctxT(t), strict.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
}

// TestBootstrapExchange exchanges metadata through the gccl bootstrap store.
func TestBootstrapExchange(t *testing.T) {
	secret := bootstrap.NewSecret()
	srv, err := bootstrap.NewServer("127.0.0.1:0", secret, 2)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	defer srv.Stop()
	clients := make([]*bootstrap.Client, 2)
	agents := []*Agent{newAgent(t, "prefill", Config{}), newAgent(t, "decode", Config{})}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := range 2 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := bootstrap.Join(ctx, bootstrap.Config{Rank: r, Size: 2, Addr: srv.Addr(), Secret: secret, Timeout: 10 * time.Second})
			if err != nil {
				errs[r] = err
				return
			}
			clients[r] = c
			if err := agents[r].PublishMetadata(ctx, c); err != nil {
				errs[r] = err
				return
			}
			errs[r] = agents[r].FetchRemote(ctx, c, agents[1-r].Name())
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	wg = sync.WaitGroup{}
	for _, c := range clients {
		wg.Go(func() { c.Close() })
	}
	wg.Wait()
	for _, a := range agents {
		if _, err := a.remote(map[string]string{"prefill": "decode", "decode": "prefill"}[a.Name()]); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCloseLeavesNothing checks that agents that connected, transferred and
// closed leave no goroutine or file descriptor behind.
func TestCloseLeavesNothing(t *testing.T) {
	fds := func() int { e, _ := os.ReadDir("/proc/self/fd"); return len(e) }
	time.Sleep(20 * time.Millisecond)
	g0, f0 := runtime.NumGoroutine(), fds()
	for range 3 {
		a, _ := New("a", Config{ListenAddr: "127.0.0.1:0", DisableSHM: true, DisablePVM: true, Logger: testLogger()})
		b, _ := New("b", Config{ListenAddr: "127.0.0.1:0", Logger: testLogger()})
		buf := make([]byte, 1<<20)
		tr, _ := b.RegisterMem(buf)
		if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
			t.Fatal(err)
		}
		lr, _ := a.RegisterMem(make([]byte, 1<<20))
		req, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, 1<<20)}}, "b", DescList{Type: DRAM, Descs: []Desc{tr.Desc(0, 1<<20)}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Post()
		req.Wait(ctxT(t))
		if fr, err := a.RegisterFile(filepath.Join(t.TempDir(), "f"), FileOptions{Length: 8192, Create: true}); err == nil {
			r2, _ := a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, 8192)}}, "a", DescList{Type: FILE, Descs: []Desc{fr.Desc(0, 8192)}}, nil)
			r2.Post()
			r2.Wait(ctxT(t))
		}
		a.Close()
		b.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > g0 || fds() > f0 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("goroutines %d -> %d, fds %d -> %d\n%s", g0, runtime.NumGoroutine(), f0, fds(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRequestTimeoutWithoutTCP: a local, shm, pvm or file request that
// cannot finish in RequestTimeout fails with ErrTimeout, as tcp ones do,
// not long after (its copy or I/O stops between blocks), having moved
// only part of the data, and its memory is left alone once it reported.
func TestRequestTimeoutWithoutTCP(t *testing.T) {
	const n = 64 << 20 // ~10 ms to copy here, 50 ms or more to write to a file in 4 KiB blocks
	cfg := Config{RequestTimeout: time.Millisecond, FileBlockSize: 4096, FileQueueDepth: 1}
	for _, tc := range []struct {
		name string
		cfg  func(Config) Config
		heap bool
		want Backend
	}{
		{"local", nil, false, BackendLocal},
		{"shm", nil, false, BackendSHM},
		{"pvm", func(c Config) Config { c.DisableSHM = true; return c }, true, BackendPVM},
		{"file", nil, false, BackendFile},
	} {
		t.Run(tc.name, func(t *testing.T) {
			skipWithout(t, tc.want)
			c := cfg
			if tc.cfg != nil {
				c = tc.cfg(c)
			}
			var a *Agent
			var remote DescList
			var dst func() []byte // the target's bytes now
			peer := "a"
			switch tc.want {
			case BackendLocal:
				a = newAgent(t, "a", c)
				r, _ := a.RegisterMem(make([]byte, n))
				remote, dst = one(DRAM, r.Desc(0, n)), r.Bytes
			case BackendFile:
				a = newAgent(t, "a", c)
				path := filepath.Join(t.TempDir(), "f")
				fr, err := a.RegisterFile(path, FileOptions{Length: n, Create: true})
				if err != nil {
					t.Fatal(err)
				}
				remote = one(FILE, fr.Desc(0, n))
				dst = func() []byte { b, _ := os.ReadFile(path); return b }
			default:
				var b *Agent
				a, b = pair(t, c)
				r := targetRegion(t, b, n, tc.heap)
				if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
					t.Fatal(err)
				}
				remote, dst, peer = one(DRAM, r.Desc(0, n)), r.Bytes, "b"
			}
			src := bytes.Repeat([]byte{1}, n)
			lr, _ := a.RegisterMem(src)
			req, err := a.CreateRequest(Write, one(DRAM, lr.Desc(0, n)), peer, remote, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer req.Release()
			if req.Backend() != tc.want {
				t.Skipf("backend %v here (%s)", req.Backend(), req.why)
			}
			start := time.Now()
			req.Post()
			if err := req.Wait(ctxT(t)); !errors.Is(err, ErrTimeout) {
				t.Fatalf("%v after %v, want ErrTimeout", err, time.Since(start))
			}
			if st, _ := req.Status(); st != StatusFailed {
				t.Fatalf("status %v after the timeout", st)
			}
			got := dst()
			if got[n-1] != 0 {
				t.Fatal("the whole transfer was done, yet it timed out")
			}
			// Nothing of the memory moves once the failure is reported.
			before := bytes.Count(got, []byte{1})
			clear(src)
			src[0], src[n-1] = 2, 2
			time.Sleep(20 * time.Millisecond)
			if after := dst(); bytes.Count(after, []byte{1}) != before || bytes.IndexByte(after, 2) >= 0 {
				t.Fatal("the target's bytes changed after the request reported its timeout")
			}
		})
	}
}

// TestOverlappingDescriptorsRefused: a request between ranges of this
// agent whose source overlaps its destination (a memmove) has no defined
// result when copied in parallel shares (or by CUDA): MakeRequest refuses
// it with ErrInvalidArgument, small or large, in one piece or across
// pieces; adjacent ranges of one region copy correctly.
func TestOverlappingDescriptorsRefused(t *testing.T) {
	a := newAgent(t, "a", Config{ListenAddr: "-", CopyThreads: 2})
	const mb = 1 << 20
	buf := make([]byte, 8*mb)
	r, _ := a.RegisterMem(buf)
	for _, tc := range []struct {
		name          string
		local, remote []Desc
	}{
		{"large", []Desc{r.Desc(mb, 4*mb)}, []Desc{r.Desc(0, 4*mb)}},
		{"small", []Desc{r.Desc(0, 4096)}, []Desc{r.Desc(1, 4096)}},
		// The second piece's source is the first one's destination.
		{"across pieces", []Desc{r.Desc(0, 4096), r.Desc(8192, 4096)}, []Desc{r.Desc(8192, 4096), r.Desc(16384, 4096)}},
	} {
		for _, op := range []Op{Write, Read} {
			if _, err := a.CreateRequest(op, one(DRAM, tc.local...), "a", one(DRAM, tc.remote...), nil); !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("%s %v: %v, want ErrInvalidArgument", tc.name, op, err)
			}
		}
	}
	fill(buf[:4*mb], 9)
	want := append([]byte(nil), buf[:4*mb]...)
	req, err := a.CreateRequest(Write, one(DRAM, r.Desc(0, 4*mb)), "a", one(DRAM, r.Desc(4*mb, 4*mb)), nil)
	if err != nil {
		t.Fatalf("adjacent ranges: %v", err)
	}
	defer req.Release()
	req.Post()
	if err := req.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf[4*mb:], want) || !bytes.Equal(buf[:4*mb], want) {
		t.Fatal("a copy between adjacent ranges of one region differs")
	}
}

// TestPVMAndFileStopBetweenBlocks: pvm copies and file I/O past their
// post's deadline stop between blocks: pvm after its first system call of
// copyMin bytes, the file pool before any block.
func TestPVMAndFileStopBetweenBlocks(t *testing.T) {
	var late stopper
	late.deadline.Store(monoNow() - 1)
	if runtime.GOOS == "linux" {
		const n = 3 << 20
		src, dst := bytes.Repeat([]byte{1}, n), make([]byte, n)
		if err := pvmBlocks(os.Getpid(), true, [][]byte{src}, []uint64{AddrOf(dst)}, &late); err != nil {
			t.Skipf("process_vm_writev to this process: %v", err)
		}
		if c := bytes.Count(dst, []byte{1}); c != copyMin {
			t.Fatalf("pvm past the deadline copied %d bytes, want its first block (%d)", c, copyMin)
		}
	}
	for _, useURing := range []bool{false, true} {
		fp := newFilePool(2, 4096, useURing)
		defer fp.close()
		path := filepath.Join(t.TempDir(), "f")
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		h := &fileHandle{f: f, owns: true}
		defer h.close()
		mem := bytes.Repeat([]byte{1}, 1<<20)
		if err := fp.run(h, true, [][]byte{mem}, []int64{0}, &late); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(path); bytes.IndexByte(got, 1) >= 0 {
			t.Fatalf("the file pool (%s) wrote past the deadline", fp.engine)
		}
		if err := fp.run(h, true, [][]byte{mem}, []int64{0}, nil); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(path); !bytes.Equal(got, mem) {
			t.Fatalf("the file pool (%s) without a deadline did not write it all", fp.engine)
		}
	}
}

func TestOverlapSpans(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ls, rs []span
		want   bool
	}{
		{"disjoint", []span{{0, 10}, {20, 30}}, []span{{10, 20}, {30, 40}}, false},
		{"one byte", []span{{0, 10}}, []span{{9, 20}}, true},
		{"inside", []span{{0, 100}}, []span{{40, 50}}, true},
		{"nested locals", []span{{0, 5}, {1, 100}}, []span{{50, 60}}, true},
		{"long local passed over", []span{{0, 10}, {200, 300}}, []span{{10, 20}, {20, 200}, {300, 400}}, false},
		{"unsorted", []span{{300, 400}, {0, 10}}, []span{{50, 60}, {350, 351}}, true},
		{"empty", nil, []span{{0, 10}}, false},
	} {
		l, r, ok := overlapSpans(tc.ls, tc.rs)
		if ok != tc.want || ok && (max(l.lo, r.lo) >= min(l.hi, r.hi)) {
			t.Errorf("%s: %v %v %v, want overlap %v", tc.name, l, r, ok, tc.want)
		}
	}
}

// TestPostAfterClose: a request posted after its agent closed fails with
// ErrClosed, whatever its backend.
func TestPostAfterClose(t *testing.T) {
	for _, bc := range backendConfigs {
		t.Run(bc.name, func(t *testing.T) {
			skipWithout(t, bc.want)
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
