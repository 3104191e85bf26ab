package comm_test

import (
	"fmt"
	"testing"

	"github.com/gccl/gccl/comm"
)

// lockstep runs op on ranks 1..n-1 in goroutines each time the returned
// function runs it on rank 0, so that testing.AllocsPerRun (which counts
// every goroutine's allocations) measures whole collectives.
func lockstep(t testing.TB, cs []*comm.Comm, op func(c *comm.Comm) error) (run func(), stop func()) {
	n := len(cs)
	start := make([]chan struct{}, n)
	done := make(chan error, n)
	for r := 1; r < n; r++ {
		start[r] = make(chan struct{})
		go func() {
			for range start[r] {
				done <- op(cs[r])
			}
		}()
	}
	run = func() {
		for r := 1; r < n; r++ {
			start[r] <- struct{}{}
		}
		if err := op(cs[0]); err != nil {
			t.Fatal(err)
		}
		for r := 1; r < n; r++ {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
	}
	stop = func() {
		for r := 1; r < n; r++ {
			close(start[r])
		}
	}
	return run, stop
}

func TestSteadyStateAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	const n, count = 4, 50000 // several chunks per block
	cs := world(t, n, nil)
	type bufs struct{ in, out, big, small []float32 }
	b := make([]bufs, n)
	for r := range b {
		b[r] = bufs{make([]float32, count), make([]float32, count), make([]float32, n*count), make([]float32, count)}
	}
	sym := allocAll(t, cs, comm.Float32, 2*count)
	symIn, symOut := make([][]float32, n), make([][]float32, n)
	for r := range sym {
		s, err := comm.SymSlice[float32](sym[r])
		if err != nil {
			t.Fatal(err)
		}
		symIn[r], symOut[r] = s[:count], s[count:]
	}
	hostIn, hostOut := make([]*comm.HostBuffer, n), make([]*comm.HostBuffer, n)
	for r := range b {
		hostIn[r], hostOut[r] = comm.Host(b[r].in), comm.Host(b[r].out)
	}
	ops := map[string]func(c *comm.Comm) error{
		"AllReduce": func(c *comm.Comm) error {
			return comm.AllReduce(bg, c, b[c.Rank()].in, b[c.Rank()].out, comm.Sum)
		},
		"AllReduce/Buffer": func(c *comm.Comm) error {
			return c.AllReduce(bg, hostIn[c.Rank()], hostOut[c.Rank()], comm.Sum)
		},
		"AllReduce/small": func(c *comm.Comm) error { // the one-exchange plan
			return comm.AllReduce(bg, c, b[c.Rank()].in[:7], b[c.Rank()].out[:7], comm.Max)
		},
		"AllReduce/small/inplace": func(c *comm.Comm) error {
			return comm.AllReduce(bg, c, b[c.Rank()].out[:300], b[c.Rank()].out[:300], comm.Sum)
		},
		"AllReduce/avg/small": func(c *comm.Comm) error {
			return comm.AllReduce(bg, c, b[c.Rank()].in[:7], b[c.Rank()].out[:7], comm.Avg)
		},
		"AllReduce/symmetric": func(c *comm.Comm) error {
			return comm.AllReduce(bg, c, symIn[c.Rank()], symOut[c.Rank()], comm.Avg)
		},
		"ReduceScatter": func(c *comm.Comm) error {
			return comm.ReduceScatter(bg, c, b[c.Rank()].big, b[c.Rank()].small, comm.Max)
		},
		"AllGather": func(c *comm.Comm) error {
			return comm.AllGather(bg, c, b[c.Rank()].small, b[c.Rank()].big)
		},
		"AllGather/small": func(c *comm.Comm) error { // the direct plan
			return comm.AllGather(bg, c, b[c.Rank()].small[:7], b[c.Rank()].big[:7*n])
		},
		"Broadcast": func(c *comm.Comm) error {
			return comm.Broadcast(bg, c, b[c.Rank()].in, b[c.Rank()].out, 1)
		},
		"Reduce": func(c *comm.Comm) error {
			return comm.Reduce(bg, c, b[c.Rank()].in, b[c.Rank()].out, comm.PreMulSum(2), 2)
		},
		"AllToAll/inplace": func(c *comm.Comm) error {
			return comm.AllToAll(bg, c, b[c.Rank()].big, b[c.Rank()].big)
		},
		"Gather": func(c *comm.Comm) error {
			return comm.Gather(bg, c, b[c.Rank()].small, b[c.Rank()].big, 0)
		},
		"Scatter": func(c *comm.Comm) error {
			return comm.Scatter(bg, c, b[c.Rank()].big, b[c.Rank()].small, 3)
		},
		"Barrier": func(c *comm.Comm) error { return c.Barrier(bg) },
		"Group": func(c *comm.Comm) error {
			r := c.Rank()
			return c.Group(bg, comm.SendTo((r+1)%n, b[r].in), comm.RecvFrom((r+n-1)%n, b[r].out))
		},
	}
	for name, op := range ops {
		t.Run(name, func(t *testing.T) {
			run, stop := lockstep(t, cs, op)
			defer stop()
			run() // warm up: connections, plans, scratch
			if a := testing.AllocsPerRun(20, run); a != 0 {
				t.Fatalf("%v allocations per call", a)
			}
		})
	}
}

// BenchmarkAllReduce runs every rank in its own goroutine for b.N
// back-to-back all-reduces, as a training loop would: no per-iteration
// synchronisation beyond the collective itself.
func BenchmarkAllReduce(b *testing.B) { benchmarkAllReduce(b, false) }

// BenchmarkAllReduceSymmetric is BenchmarkAllReduce on buffers from Alloc.
func BenchmarkAllReduceSymmetric(b *testing.B) { benchmarkAllReduce(b, true) }

func benchmarkAllReduce(b *testing.B, sym bool) {
	for _, n := range []int{2, 4} {
		for _, size := range []int{8, 4 << 10, 64 << 10, 1 << 20, 16 << 20} {
			b.Run(fmt.Sprintf("n=%d/bytes=%d", n, size), func(b *testing.B) {
				cs := world(b, n, nil)
				bufs := make([][]float32, n)
				for r := range bufs {
					bufs[r] = make([]float32, size/4)
				}
				if sym {
					for r, sb := range allocAll(b, cs, comm.Float32, size/4) {
						bufs[r], _ = comm.SymSlice[float32](sb)
					}
				}
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				mustAll(b, onAll(b, cs, func(c *comm.Comm) error {
					x := bufs[c.Rank()]
					for i := 0; i < b.N; i++ {
						if err := comm.AllReduce(bg, c, x, x, comm.Sum); err != nil {
							return err
						}
					}
					return nil
				}))
			})
		}
	}
}

// BenchmarkAllReduceAsyncWait issues each 8-byte all-reduce async and
// waits for it at once (an overlap window of nothing): against
// BenchmarkAllReduce/n=2/bytes=8 it is the cost of the async path.
func BenchmarkAllReduceAsyncWait(b *testing.B) {
	const n = 2
	cs := world(b, n, nil)
	bufs := make([][]float32, n)
	for r := range bufs {
		bufs[r] = make([]float32, 2)
	}
	b.ReportAllocs()
	b.ResetTimer()
	mustAll(b, onAll(b, cs, func(c *comm.Comm) error {
		x := bufs[c.Rank()]
		for i := 0; i < b.N; i++ {
			if err := comm.AllReduceAsync(c, x, x, comm.Sum).Wait(bg); err != nil {
				return err
			}
		}
		return nil
	}))
}

// BenchmarkAsyncLoop issues 8-byte all-reduces async on a Comm of one rank
// and waits only for the last, as gccl-perf -z 0 does: the issuing
// goroutine and the progress goroutine run side by side, and the time per
// operation is the slower of the two. Against BenchmarkCallFloor it is
// what the async queue costs.
func BenchmarkAsyncLoop(b *testing.B) {
	c := world(b, 1, nil)[0]
	x := make([]float32, 2)
	b.ReportAllocs()
	var last *comm.Request
	for b.Loop() {
		last = comm.AllReduceAsync(c, x, x, comm.Sum)
	}
	if err := last.Wait(bg); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkCallFloor is what a blocking call costs a rank besides its
// messages: an 8-byte all-reduce on a Comm of one rank still numbers,
// validates, classifies, plans, runs and records the call. generic is the
// typed-slice form, buffers the Buffer form.
func BenchmarkCallFloor(b *testing.B) {
	c := world(b, 1, nil)[0]
	x := make([]float32, 2)
	hx := comm.Host(x)
	b.Run("generic", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := comm.AllReduce(bg, c, x, x, comm.Sum); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("buffers", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := c.AllReduce(bg, hx, hx, comm.Sum); err != nil {
				b.Fatal(err)
			}
		}
	})
}
