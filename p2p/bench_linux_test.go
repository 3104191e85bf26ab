package p2p

import (
	"testing"
	"time"
)

// benchPair is an initiator and a target in this process whose region is
// shared memory (the shm backend; the initiator's work is what it is
// between processes).
func benchPair(b *testing.B, size int) (*Agent, *Agent, *Region, *Region) {
	a := newAgent(b, "a", Config{})
	t := newAgent(b, "t", Config{})
	tr, err := t.Alloc(size)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := a.LoadRemote(ctxT(b), t.LocalMetadata()); err != nil {
		b.Fatal(err)
	}
	lr, err := a.RegisterMem(make([]byte, size))
	if err != nil {
		b.Fatal(err)
	}
	return a, t, lr, tr
}

// BenchmarkLatency4KiB is a 4 KiB WRITE into a peer's shared region: Post
// (done inline) plus Wait.
func BenchmarkLatency4KiB(b *testing.B) {
	a, _, lr, tr := benchPair(b, 4096)
	req, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, 4096)}}, "t", DescList{Type: DRAM, Descs: []Desc{tr.Desc(0, 4096)}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := ctxT(b)
	b.ReportAllocs()
	b.SetBytes(4096)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := req.Post(); err != nil {
			b.Fatal(err)
		}
		if err := req.Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPost100k posts a prepared request of 100,000 4 KiB descriptors
// that do not merge (the remote side is in reverse order); ns/op is Post
// alone, transfer-ms the time until the data is in place.
func BenchmarkPost100k(b *testing.B) {
	const n, blk = 100000, 4096
	a, _, lr, tr := benchPair(b, n*blk)
	local, remote := make([]Desc, n), make([]Desc, n)
	for i := range n {
		local[i] = lr.Desc(uint64(i*blk), blk)
		remote[i] = tr.Desc(uint64((n-1-i)*blk), blk)
	}
	ll, err := a.PrepareLocal(DescList{Type: DRAM, Descs: local})
	if err != nil {
		b.Fatal(err)
	}
	rl, err := a.PrepareRemote("t", DescList{Type: DRAM, Descs: remote})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	req, err := a.MakeRequest(Write, ll, nil, rl, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	makeTime := time.Since(start)
	if req.Pieces() != n {
		b.Fatalf("%d pieces", req.Pieces())
	}
	ctx := ctxT(b)
	var posting, total time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := req.Post(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := req.Wait(ctx); err != nil {
			b.Fatal(err)
		}
		posting += t1.Sub(t0)
		total += time.Since(t0)
	}
	b.StopTimer()
	b.ReportMetric(float64(makeTime.Microseconds())/1000, "make-ms")
	b.ReportMetric(float64(posting.Microseconds())/1000/float64(b.N), "post-ms")
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "transfer-ms")
}

// BenchmarkWrite64MiB2Proc WRITEs 64 MiB into a child process's shared
// region (the shm backend between two processes).
func BenchmarkWrite64MiB2Proc(b *testing.B) {
	benchTwoProc(b, 64<<20, Config{}, nil, BackendSHM)
}

// BenchmarkWrite64MiB2ProcTCP is the same over loopback tcp.
func BenchmarkWrite64MiB2ProcTCP(b *testing.B) {
	benchTwoProc(b, 64<<20, Config{DisableSHM: true, DisablePVM: true}, []string{"GCCL_SHM_DISABLE=1"}, BackendTCP)
}

// BenchmarkWrite64MiB2ProcPVM is the same into the child's heap with
// process_vm_writev.
func BenchmarkWrite64MiB2ProcPVM(b *testing.B) {
	skipWithoutPVM(b)
	benchTwoProc(b, 64<<20, Config{}, []string{"P2P_TEST_HEAP=1"}, BackendPVM)
}

func benchTwoProc(b *testing.B, size int, cfg Config, env []string, want Backend) {
	c := startChild(b, size, env...)
	a := newAgent(b, "parent", cfg)
	if _, err := a.LoadRemote(ctxT(b), c.md); err != nil {
		b.Fatal(err)
	}
	cr := childRegion(b, c.md)
	src := make([]byte, size)
	fill(src, 1)
	lr, _ := a.RegisterMem(src)
	req, err := a.CreateRequest(Write, DescList{Type: DRAM, Descs: []Desc{lr.Desc(0, uint64(size))}}, "child",
		DescList{Type: DRAM, Descs: []Desc{{Addr: cr.Base, Len: uint64(size)}}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	if req.Backend() != want {
		b.Fatalf("backend %v", req.Backend())
	}
	ctx := ctxT(b)
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req.Post()
		if err := req.Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	req.Release()
	exitChild(b, a, c)
}

// BenchmarkCopyCeiling is what the shm backend can reach at best on this
// machine: one 64 MiB copy from the heap into a shared mapping, on one
// goroutine and through the copy pool.
func BenchmarkCopyCeiling(b *testing.B) {
	a := newAgent(b, "a", Config{ListenAddr: "-"})
	dst, err := a.Alloc(64 << 20)
	if err != nil {
		b.Fatal(err)
	}
	src := make([]byte, 64<<20)
	fill(src, 1)
	b.Run("threads=1", func(b *testing.B) {
		b.SetBytes(64 << 20)
		for i := 0; i < b.N; i++ {
			copy(dst.Bytes(), src)
		}
	})
	b.Run("pool", func(b *testing.B) {
		b.SetBytes(64 << 20)
		for i := 0; i < b.N; i++ {
			a.copy.copyAll([][]byte{dst.Bytes()}, [][]byte{src}, 64<<20, nil)
		}
	})
}
