package shm

import (
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gccl/gccl/transport"
)

// The benchmarks run between this process and a child (see TestMain), the
// way two ranks on one host run.

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// BenchmarkPingPong measures a round trip: a message to the child and its
// echo back. one-way-ns is half of it.
func BenchmarkPingPong(b *testing.B) {
	c := startChild(b, Config{})
	if err := c.command(cmdEcho, 0, 0); err != nil { // enter echo mode with a first message
		b.Fatal(err)
	}
	if _, _, err := c.recvInto(nil); err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{8, 4 << 10, 64 << 10} {
		b.Run(sizeName(n), func(b *testing.B) {
			msg := make([]byte, n)
			buf := make([]byte, c.ep.SlotSize())
			tag := transport.MakeTag(cmdEcho, 1)
			rtt := make([]time.Duration, b.N)
			b.SetBytes(int64(n))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				if err := send(c.ep, 1, msg, tag); err != nil {
					b.Fatal(err)
				}
				if _, _, err := c.recvInto(buf); err != nil {
					b.Fatal(err)
				}
				rtt[i] = time.Since(t0)
			}
			b.StopTimer()
			// The median resists the preemptions of a busy machine.
			slices.Sort(rtt)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2, "one-way-ns")
			b.ReportMetric(float64(rtt[len(rtt)/2].Nanoseconds())/2, "p50-one-way-ns")
		})
	}
}

// BenchmarkStream measures one-way bandwidth for several slot geometries:
// the child copies a 16 MiB source into slots, this process copies the slots
// out into a 16 MiB destination (a Recv into a user buffer).
func BenchmarkStream(b *testing.B) {
	for _, g := range []struct{ size, count int }{
		{16 << 10, 8}, {64 << 10, 8}, {128 << 10, 4}, {128 << 10, 8}, {256 << 10, 4}, {512 << 10, 4}, {1 << 20, 4},
	} {
		b.Run(fmt.Sprintf("%sx%d", sizeName(g.size), g.count), func(b *testing.B) {
			c := startChild(b, Config{SlotSize: g.size, SlotCount: g.count})
			const span = 16 << 20
			dst := make([]byte, span)
			total := uint64(b.N) * uint64(g.size)
			b.SetBytes(int64(g.size))
			b.ResetTimer()
			if err := c.command(cmdSend, total, span); err != nil {
				b.Fatal(err)
			}
			off := 0
			for got := uint64(0); got < total; {
				if off+g.size > span {
					off = 0
				}
				n, _, err := c.recvInto(dst[off : off+g.size])
				if err != nil {
					b.Fatal(err)
				}
				got += uint64(n)
				off += n
			}
		})
	}
}

// BenchmarkCopyPath compares ways of getting a buffer that the peer has just
// written into this process's memory:
//
//	ring     the peer copies it into slots, we copy slots out (two copies,
//	         pipelined on two cores)
//	vmreadv  process_vm_readv from the peer's private buffer (one copy, by
//	         the kernel, plus a system call)
//	region   the peer's buffer is a Region we map: one plain copy
//
// Each operation first has the child rewrite its buffer (one store per cache
// line, as a producer that just computed it), so no variant reads stale
// cached data; that round trip is part of every variant.
func BenchmarkCopyPath(b *testing.B) {
	sizes := []int{4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20}
	c := startChild(b, Config{})
	const maxSize = 64 << 20
	dst := make([]byte, maxSize)
	// The child's private buffer, for ring and vmreadv.
	if err := c.command(cmdAddr, maxSize, 0); err != nil {
		b.Fatal(err)
	}
	var p [16]byte
	if _, _, err := c.recvInto(p[:]); err != nil {
		b.Fatal(err)
	}
	remote := uintptr(binary.LittleEndian.Uint64(p[:]))
	// The child's region, for region.
	if err := c.command(cmdRegion, maxSize, 0); err != nil {
		b.Fatal(err)
	}
	name := make([]byte, c.ep.SlotSize())
	n, _, err := c.recvInto(name)
	if err != nil {
		b.Fatal(err)
	}
	reg, err := MapRegion(string(name[:n]), maxSize)
	if err != nil {
		b.Fatal(err)
	}
	defer reg.Close()
	dirty := func(target uint64, size int) {
		if err := c.command(cmdDirty, target, uint64(size)); err != nil {
			b.Fatal(err)
		}
		if _, _, err := c.recvInto(p[:]); err != nil {
			b.Fatal(err)
		}
	}
	pid := c.cmd.Process.Pid
	for _, size := range sizes {
		b.Run("ring/"+sizeName(size), func(b *testing.B) {
			b.SetBytes(int64(size))
			slot := c.ep.SlotSize()
			for i := 0; i < b.N; i++ {
				if err := c.command(cmdDirtySend, uint64(size), 0); err != nil {
					b.Fatal(err)
				}
				for off := 0; off < size; {
					n, _, err := c.recvInto(dst[off:min(off+slot, size)])
					if err != nil {
						b.Fatal(err)
					}
					off += n
				}
			}
		})
		b.Run("vmreadv/"+sizeName(size), func(b *testing.B) {
			b.SetBytes(int64(size))
			for i := 0; i < b.N; i++ {
				dirty(0, size)
				for off := 0; off < size; {
					local := []unix.Iovec{{Base: &dst[off]}}
					local[0].SetLen(size - off)
					n, err := unix.ProcessVMReadv(pid, local, []unix.RemoteIovec{{Base: remote + uintptr(off), Len: size - off}}, 0)
					if err != nil {
						b.Skipf("process_vm_readv: %v (needs ptrace access to the peer)", err)
					}
					off += n
				}
			}
		})
		b.Run("region/"+sizeName(size), func(b *testing.B) {
			b.SetBytes(int64(size))
			src := reg.Bytes()[:size]
			for i := 0; i < b.N; i++ {
				dirty(1, size)
				copy(dst[:size], src)
			}
		})
	}
}

// BenchmarkAllReduce2 runs a two-rank float32 sum all-reduce over the rings
// with the executor's fused steps (see allReduce2): an estimate of what comm
// will measure over shared memory, for the default geometry and others
// (GCCL_SHM_BENCH_ALL_GEOMETRIES=1).
func BenchmarkAllReduce2(b *testing.B) {
	geos := []Config{{}}
	if os.Getenv("GCCL_SHM_BENCH_ALL_GEOMETRIES") != "" {
		geos = []Config{{SlotSize: 32 << 10, SlotCount: 8}, {SlotSize: 64 << 10, SlotCount: 4}, {SlotSize: 64 << 10, SlotCount: 8},
			{SlotSize: 128 << 10, SlotCount: 4}, {SlotSize: 128 << 10, SlotCount: 8}, {SlotSize: 256 << 10, SlotCount: 4}}
	}
	for _, g := range geos {
		c := startChild(b, g)
		for _, size := range []int{8, 4 << 10, 64 << 10, 1 << 20, 16 << 20} {
			name := sizeName(size)
			if len(geos) > 1 {
				name = fmt.Sprintf("%sx%d/%s", sizeName(c.ep.SlotSize()), c.mb.cfg.SlotCount, name)
			}
			b.Run(name, func(b *testing.B) {
				in, out := make([]byte, size), make([]byte, size)
				b.SetBytes(int64(size))
				if err := c.command(cmdAllReduce, uint64(size), uint64(b.N)); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := allReduce2(c.ep, 0, in, out); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		c.stop()
	}
}

// BenchmarkAllReduce2Regions is BenchmarkAllReduce2 on symmetric memory
// (allReduce2Regions): what comm could do for buffers from Comm.Alloc.
func BenchmarkAllReduce2Regions(b *testing.B) {
	c := startChild(b, Config{})
	for _, size := range []int{64 << 10, 1 << 20, 16 << 20} {
		b.Run(sizeName(size), func(b *testing.B) {
			if err := c.command(cmdAllReduceRegions, uint64(size), uint64(b.N)); err != nil {
				b.Fatal(err)
			}
			var mine, theirs [2]*Region
			buf := make([]byte, c.ep.SlotSize())
			for i := range theirs {
				n, _, err := c.recvInto(buf)
				if err != nil {
					b.Fatal(err)
				}
				if theirs[i], err = MapRegion(string(buf[:n]), size); err != nil {
					b.Fatal(err)
				}
				defer theirs[i].Close()
			}
			for i := range mine {
				var err error
				if mine[i], err = AllocIn(c.dir, "bench", 0, size); err != nil {
					b.Fatal(err)
				}
				defer mine[i].Close()
				if err := send(c.ep, 1, []byte(mine[i].Name()), 0); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := allReduce2Regions(c.ep, 0, mine, theirs); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			// The child's last copy reads our out: let it finish (it
			// answers the echo after).
			if err := c.command(cmdEcho, 0, 0); err != nil {
				b.Fatal(err)
			}
			if _, _, err := c.recvInto(buf); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkAllReduce2OneStep is BenchmarkAllReduce2 for small buffers with
// one exchange (allReduce2OneStep), the latency floor a tuner can reach.
func BenchmarkAllReduce2OneStep(b *testing.B) {
	c := startChild(b, Config{})
	for _, size := range []int{8, 4 << 10, 64 << 10} {
		b.Run(sizeName(size), func(b *testing.B) {
			in, out := make([]byte, size), make([]byte, size)
			b.SetBytes(int64(size))
			if err := c.command(cmdAllReduceOneStep, uint64(size), uint64(b.N)); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := allReduce2OneStep(c.ep, 0, in, out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkHotPath is the cost of one message through the four calls, on one
// goroutine (the ring's cache lines stay in this core): the instructions of
// the fast path, without any cross-core transfer.
func BenchmarkHotPath(b *testing.B) {
	eps := world(b, 2, Config{SlotSize: 64, SlotCount: 4})
	s, _ := eps[0].Sender(1)
	r, _ := eps[1].Receiver(0)
	for i := 0; i < b.N; i++ {
		m, _, _ := s.TryReserve(8)
		m[0] = byte(i)
		s.Commit(1)
		r.TryNext()
		r.Release()
	}
}

// BenchmarkCacheLineFloor is the machine's floor for a one-way hand-off
// between two cores: two threads pass a counter through one cache line each
// way (ns/op is a round trip, one-way-ns half of it). PingPong's 8-byte
// one-way latency is compared with it.
func BenchmarkCacheLineFloor(b *testing.B) {
	if runtime.GOMAXPROCS(0) < 2 {
		b.Skip("needs two cores")
	}
	type line struct {
		v atomic.Uint64
		_ [120]byte
	}
	var ping, pong line
	n := uint64(b.N)
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for i := uint64(1); i <= n; i++ {
			for ping.v.Load() != i {
			}
			pong.v.Store(i)
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ResetTimer()
	for i := uint64(1); i <= n; i++ {
		ping.v.Store(i)
		for pong.v.Load() != i {
		}
	}
	b.StopTimer()
	<-done
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2, "one-way-ns")
}
