package p2p

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/gccl/gccl/internal/logx"
	"github.com/gccl/gccl/internal/shmem"
	"github.com/gccl/gccl/internal/testutil"
)

func newAgent(t testing.TB, name string, cfg Config) *Agent {
	t.Helper()
	if cfg.ListenAddr == "" {
		cfg.ListenAddr = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	a, err := New(name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// testLogger discards the agents' records; GCCL_TEST_LOG=1 shows them.
func testLogger() *slog.Logger {
	if os.Getenv("GCCL_TEST_LOG") != "" {
		return logx.Default()
	}
	return slog.New(slog.DiscardHandler)
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>8)
	}
}

// pair makes two agents in this process that know each other.
func pair(t testing.TB, cfg Config) (*Agent, *Agent) {
	a := newAgent(t, "a", cfg)
	b := newAgent(t, "b", cfg)
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, err := b.remote("a"); return err == nil })
	return a, b
}

func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, "condition not met", cond)
}

var backendConfigs = []struct {
	name string
	cfg  Config
	want Backend
	heap bool
}{
	{"shm", Config{}, BackendSHM, false},
	{"pvm", Config{DisableSHM: true}, BackendPVM, true},
	{"tcp", Config{DisableSHM: true, DisablePVM: true}, BackendTCP, false},
	{"tcp-heap", Config{DisablePVM: true}, BackendTCP, true},
}

// skipWithoutPVM skips a test that needs the pvm backend where this
// process may not use process_vm_readv even on itself: another system than
// Linux, a seccomp filter (Docker's default profile without
// CAP_SYS_PTRACE) or an emulator that lacks the call (qemu-user). The agent
// then picks another backend, as it should; the test that wants pvm has
// nothing to check.
func skipWithoutPVM(t testing.TB) {
	t.Helper()
	err := probePVMHere()
	if err != nil && !errors.Is(err, ErrNotSupported) {
		err = fmt.Errorf("%w: process_vm_readv is not usable here: %v", ErrNotSupported, err)
	}
	testutil.SkipIfNotSupported(t, err)
}

// probePVMHere probes process_vm_readv on this process.
func probePVMHere() error {
	token := []byte("gccl pvm probe")
	return probePVM(os.Getpid(), uint64(uintptr(unsafe.Pointer(&token[0]))), token)
}

// skipWithout skips a test that runs on backend b where this system lacks
// it (ErrNotSupported): shared memory (probed by making a region) and
// process_vm_readv off Linux. Where process_vm_readv is only refused, the
// agent falls back to tcp and the test runs on that.
func skipWithout(t testing.TB, b Backend) {
	t.Helper()
	var err error
	switch b {
	case BackendSHM:
		var r *shmem.Region
		if r, err = shmem.AllocIn(t.TempDir(), "p2ptest", 0, 4096); err == nil {
			r.Close()
		}
	case BackendPVM:
		if err = probePVMHere(); !errors.Is(err, ErrNotSupported) {
			err = nil
		}
	}
	testutil.SkipIfNotSupported(t, err)
}

// one is a descriptor list of type typ.
func one(typ MemType, d ...Desc) DescList { return DescList{Type: typ, Descs: d} }

// request4K makes a request of op between a fresh 4 KiB heap region of a
// and dst on peer, the shape most of these tests need.
func request4K(t testing.TB, a *Agent, op Op, peer string, dst Desc) *Request {
	t.Helper()
	lr, err := a.RegisterMem(make([]byte, 4096))
	if err != nil {
		t.Fatal(err)
	}
	req, err := a.CreateRequest(op, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, 4096)}}, peer, DescList{Type: DRAM, Descs: []Desc{dst}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func targetRegion(t testing.TB, b *Agent, size int, heap bool) *Region {
	t.Helper()
	if heap || runtime.GOOS != "linux" {
		r, err := b.RegisterMem(make([]byte, size))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r, err := b.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestReadWriteInProcess(t *testing.T) {
	for _, bc := range backendConfigs {
		t.Run(bc.name, func(t *testing.T) {
			skipWithout(t, bc.want)
			if bc.want == BackendPVM {
				skipWithoutPVM(t)
			}
			a := newAgent(t, "a", bc.cfg)
			b := newAgent(t, "b", bc.cfg)
			const size = 3<<20 + 123
			tr := targetRegion(t, b, size, bc.heap)
			if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
				t.Fatal(err)
			}
			src := make([]byte, size)
			fill(src, 1)
			lr, err := a.RegisterMem(src)
			if err != nil {
				t.Fatal(err)
			}
			// Three descriptors, two of them contiguous on both sides.
			local := DescList{Type: DRAM, Descs: []Desc{
				{Addr: lr.Addr(), Len: 4096}, {Addr: lr.Addr() + 4096, Len: 8192}, {Addr: lr.Addr() + 1<<20, Len: size - 1<<20},
			}}
			remote := DescList{Type: DRAM, Descs: []Desc{
				tr.Desc(0, 4096), tr.Desc(4096, 8192), tr.Desc(1<<20, size-1<<20),
			}}
			req, err := a.CreateRequest(Write, local, "b", remote, &RequestOptions{Notif: []byte("done")})
			if err != nil {
				t.Fatal(err)
			}
			if req.Backend() != bc.want || req.Pieces() != 2 {
				t.Fatalf("backend %v with %d pieces, want %v with 2", req.Backend(), req.Pieces(), bc.want)
			}
			if _, err := req.Post(); err != nil {
				t.Fatal(err)
			}
			if err := req.Wait(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			got := tr.Bytes()
			if !bytes.Equal(got[:12288], src[:12288]) || !bytes.Equal(got[1<<20:], src[1<<20:]) {
				t.Fatal("written data differs")
			}
			n, err := b.WaitNotifs(ctxT(t))
			if err != nil || len(n["a"]) != 1 || string(n["a"][0]) != "done" {
				t.Fatalf("notifications %q, %v", n, err)
			}
			// Read it back into a zeroed buffer.
			clear(src)
			if _, err := req.Post(); err != nil {
				t.Fatal(err)
			}
			req.Wait(ctxT(t))
			rd, err := a.CreateRequest(Read, local, "b", remote, nil)
			if err != nil {
				t.Fatal(err)
			}
			fill(got, 9)
			if _, err := rd.Post(); err != nil {
				t.Fatal(err)
			}
			if err := rd.Wait(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[:12288], src[:12288]) || !bytes.Equal(got[1<<20:], src[1<<20:]) {
				t.Fatal("read data differs")
			}
			if err := a.DeregisterMem(lr); !errors.Is(err, ErrRegionBusy) {
				t.Fatalf("deregistering a region in use: %v", err)
			}
			rd.Release()
			req.Release()
			if err := a.DeregisterMem(lr); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRequestInProgress: a request in progress can be neither posted again
// nor released; OnComplete runs before Wait returns.
func TestRequestInProgress(t *testing.T) {
	a := newAgent(t, "a", Config{InlineLimit: -1})
	b := newAgent(t, "b", Config{})
	tr, _ := b.RegisterMem(make([]byte, 4096))
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	lr, _ := a.RegisterMem(make([]byte, 4096))
	hold, held := make(chan struct{}), make(chan struct{})
	req, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, 4096)}}, "b", DescList{Type: DRAM, Descs: []Desc{tr.Desc(0, 4096)}},
		&RequestOptions{OnComplete: func(*Request, error) { close(held); <-hold }})
	if err != nil {
		t.Fatal(err)
	}
	if err := req.Wait(ctxT(t)); err == nil {
		t.Fatal("Wait before Post succeeded")
	}
	if st, err := req.Post(); st != StatusInProgress || err != nil {
		t.Fatalf("Post with inlining off: %v, %v", st, err)
	}
	<-held
	if _, err := req.Post(); !errors.Is(err, ErrRequestActive) {
		t.Fatalf("second Post: %v", err)
	}
	if err := req.Release(); !errors.Is(err, ErrRequestActive) {
		t.Fatalf("Release in progress: %v", err)
	}
	if st, _ := req.Status(); st != StatusInProgress {
		t.Fatalf("status %v while the callback runs", st)
	}
	close(hold)
	if err := req.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := req.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := req.Post(); err == nil {
		t.Fatal("Post after Release")
	}
}

// TestConcurrentPostAndWait: goroutines sharing one request, each posting
// it (one wins, the others get ErrRequestActive while it is in progress)
// and waiting on it, while another polls Status: every Wait reports a
// post that succeeded, and nothing races (run with -race).
func TestConcurrentPostAndWait(t *testing.T) {
	a, b := pair(t, Config{InlineLimit: -1})
	tr := targetRegion(t, b, 4096, false)
	if _, err := a.LoadRemote(ctxT(t), b.LocalMetadata()); err != nil {
		t.Fatal(err)
	}
	req := request4K(t, a, Write, "b", tr.Desc(0, 4096))
	end := time.Now().Add(300 * time.Millisecond)
	var posts atomic.Int64
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for time.Now().Before(end) {
				_, err := req.Post()
				if errors.Is(err, ErrRequestActive) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				posts.Add(1)
				if err := req.Wait(ctxT(t)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for time.Now().Before(end) {
			// Count the posts before looking: a Status read before the
			// first post reports "not posted", and a post may succeed
			// in between.
			n := posts.Load()
			if st, err := req.Status(); st == StatusFailed && n > 0 {
				t.Errorf("status of a request whose posts all succeed: %v", err)
				return
			}
			runtime.Gosched()
		}
	})
	wg.Wait()
	if posts.Load() == 0 {
		t.Fatal("no post succeeded")
	}
	if err := req.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := req.Release(); err != nil {
		t.Fatal(err)
	}
}
