package p2p

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
)

func newAgent(t testing.TB, name string, cfg Config) *Agent {
	t.Helper()
	if cfg.ListenAddr == "" {
		cfg.ListenAddr = "127.0.0.1:0"
	}
	a, err := New(name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
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
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(time.Millisecond)
	}
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
			if runtime.GOOS != "linux" && bc.want != BackendTCP {
				t.Skip("linux only")
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
