package comm_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/transport"
)

// Broadcasts, all-gathers, ring all-reduces and reduce-scatters over TCP move
// their large chunks between the callers' buffers and the sockets without
// slots (directexec.go): every
// rank must get the right bytes, in place and out of place, with blocks
// of many chunks, a short tail and a block too small to go direct; and
// the direct path must have run (chunks sent from the caller's memory, and
// received chunks that landed in place: with more chunks than slots, the
// later ones are posted before their headers can be parsed).
func TestDirectChunksOverTCP(t *testing.T) {
	const n = 3
	cs := loopJob(t, n)
	counts := []int{8*chunk + 5, comm.DirectMin/4 + 3, comm.DirectMin/4 - 1, 3*chunk + 7}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := directRounds(c, n, counts); err != nil {
				errs[c.Rank()] = err
				c.Abort(err) // so that the other ranks fail rather than wait
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for _, c := range cs {
		sent, landed := comm.DirectCounts(c)
		if sent == 0 || landed == 0 {
			t.Errorf("rank %d: %d chunks sent from its buffers, %d landed in them; want both above 0", c.Rank(), sent, landed)
		}
	}
}

const chunk = 512 << 10 / 4 // float32 elements per default slot

func directRounds(c *comm.Comm, n int, counts []int) error {
	ctx := context.Background()
	me := c.Rank()
	val := func(r, i int) float32 { return float32(r*1000003 + i) }
	sum := func(i int) float32 { // of element i over the ranks
		var s float32
		for r := range n {
			s += val(r, i)
		}
		return s
	}
	for _, count := range counts {
		for root := range n {
			for _, inPlace := range []bool{false, true} {
				out := make([]float32, count)
				send := out
				if !inPlace {
					send = make([]float32, count)
				}
				if me == root {
					for i := range send {
						send[i] = val(root, i)
					}
				}
				_, before := comm.DirectCounts(c)
				if err := comm.Broadcast(ctx, c, send, out, root); err != nil {
					return err
				}
				// Chunk k >= slots is posted when chunk k-slots is taken,
				// before its release lets chunk k's header be parsed.
				_, after := comm.DirectCounts(c)
				if full := count / chunk; me != root && full > comm.DefaultSlotCount && int(after-before) < full-comm.DefaultSlotCount {
					return fmt.Errorf("broadcast of %d chunks from %d: %d landed in place, want at least %d", full, root, after-before, full-comm.DefaultSlotCount)
				}
				for i, v := range out {
					if v != val(root, i) {
						return fmt.Errorf("broadcast of %d from %d (in place %v): element %d = %v, want %v", count, root, inPlace, i, v, val(root, i))
					}
				}
			}
		}
		for _, inPlace := range []bool{false, true} {
			out := make([]float32, count)
			send := out
			if !inPlace {
				send = make([]float32, count)
			}
			for i := range send {
				send[i] = val(me, i)
			}
			sent, landed := comm.DirectCounts(c)
			if err := comm.AllReduce(ctx, c, send, out, comm.Sum); err != nil {
				return err
			}
			for i, v := range out {
				if want := sum(i); v != want {
					return fmt.Errorf("all-reduce of %d (in place %v): element %d = %v, want %v", count, inPlace, i, v, want)
				}
			}
			// The ring all-reduce's large chunks go direct, in place too.
			sent2, landed2 := comm.DirectCounts(c)
			if direct := sent2 > sent && landed2 > landed; direct != (count/n >= comm.DirectMin/4) {
				return fmt.Errorf("all-reduce of %d (in place %v): direct path taken %v", count, inPlace, direct)
			}
		}
		for _, inPlace := range []bool{false, true} {
			in := make([]float32, n*count)
			for i := range in {
				in[i] = val(me, i)
			}
			out := make([]float32, count)
			if inPlace {
				out = in[me*count : (me+1)*count]
			}
			sent, _ := comm.DirectCounts(c)
			if err := comm.ReduceScatter(ctx, c, in, out, comm.Sum); err != nil {
				return err
			}
			for i, v := range out {
				if want := sum(me*count + i); v != want {
					return fmt.Errorf("reduce-scatter of %d (in place %v): element %d = %v, want %v", count, inPlace, i, v, want)
				}
			}
			if sent2, _ := comm.DirectCounts(c); (sent2 > sent) != (count >= comm.DirectMin/4) {
				return fmt.Errorf("reduce-scatter of %d (in place %v): sent from the caller's memory %v", count, inPlace, sent2 > sent)
			}
		}
		for _, inPlace := range []bool{false, true} {
			out := make([]float32, n*count)
			send := out[me*count : (me+1)*count]
			if !inPlace {
				send = make([]float32, count)
			}
			for i := range send {
				send[i] = val(me, i)
			}
			if err := comm.AllGather(ctx, c, send, out); err != nil {
				return err
			}
			for r := range n {
				for i := range count {
					if v := out[r*count+i]; v != val(r, i) {
						return fmt.Errorf("all-gather of %d (in place %v): block %d element %d = %v, want %v", count, inPlace, r, i, v, val(r, i))
					}
				}
			}
		}
	}
	return moveRounds(c, n, counts)
}

// moveRounds checks the collectives that only move data: all-to-all in
// place and out of place, gather and scatter from every root. Element i of
// the block rank r holds for rank p is code(r, p, i).
func moveRounds(c *comm.Comm, n int, counts []int) error {
	ctx := context.Background()
	me := c.Rank()
	code := func(r, p, i int) float32 { return float32(r*4000037 + p*1000003 + i%1000003) }
	for _, count := range counts {
		for _, inPlace := range []bool{false, true} {
			in := make([]float32, n*count)
			for p := range n {
				for i := range count {
					in[p*count+i] = code(me, p, i)
				}
			}
			out := in
			if !inPlace {
				out = make([]float32, n*count)
			}
			sent, landed := comm.DirectCounts(c)
			if err := comm.AllToAll(ctx, c, in, out); err != nil {
				return err
			}
			// Sent from memory whenever the chunks are large; landed in
			// place for sure only past the first SlotCount chunks of a
			// peer (earlier ones may be parsed before this call posts).
			sent2, landed2 := comm.DirectCounts(c)
			if (sent2 > sent) != (count >= comm.DirectMin/4) || count/chunk > comm.DefaultSlotCount && landed2 == landed {
				return fmt.Errorf("all-to-all of %d (in place %v): %d chunks sent from memory, %d landed", count, inPlace, sent2-sent, landed2-landed)
			}
			for r := range n {
				for i := range count {
					if v := out[r*count+i]; v != code(r, me, i) {
						return fmt.Errorf("all-to-all of %d (in place %v): block from %d element %d = %v, want %v", count, inPlace, r, i, v, code(r, me, i))
					}
				}
			}
		}
		for root := range n {
			mine := make([]float32, count)
			for i := range mine {
				mine[i] = code(me, root, i)
			}
			var all []float32
			if me == root {
				all = make([]float32, n*count)
			}
			if err := comm.Gather(ctx, c, mine, all, root); err != nil {
				return err
			}
			for r := 0; me == root && r < n; r++ {
				for i := range count {
					if v := all[r*count+i]; v != code(r, root, i) {
						return fmt.Errorf("gather of %d to %d: block of %d element %d = %v", count, root, r, i, v)
					}
				}
			}
			var src []float32
			if me == root {
				src = make([]float32, n*count)
				for p := range n {
					for i := range count {
						src[p*count+i] = code(root, p, i)
					}
				}
			}
			got := make([]float32, count)
			if err := comm.Scatter(ctx, c, src, got, root); err != nil {
				return err
			}
			for i, v := range got {
				if v != code(root, me, i) {
					return fmt.Errorf("scatter of %d from %d: element %d = %v, want %v", count, root, i, v, code(root, me, i))
				}
			}
		}
	}
	return nil
}

// A rank whose count differs fails the broadcast with ErrMismatch on every
// rank that receives from it, even where the receiver posted its buffer
// for the length it expected: a longer message lands in a slot instead
// and is refused.
func TestDirectChunksRefuseOtherLengths(t *testing.T) {
	const n = 2
	cs := loopJob(t, n)
	const count = 4 * comm.DirectMin / 4
	errs := make([]error, n)
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			k := count
			if c.Rank() == 0 {
				k = count + 1024 // the root sends longer chunks
			}
			buf := make([]float32, k)
			errs[c.Rank()] = comm.Broadcast(ctx, c, buf, buf, 0)
		}()
	}
	wg.Wait()
	if !errors.Is(errs[1], comm.ErrMismatch) {
		t.Fatalf("receiver: %v, want ErrMismatch", errs[1])
	}
}

// The direct path allocates nothing once warm: its per-peer lists live in
// the executor and are reused.
func TestDirectChunksAllocateNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	const n, count = 2, 6*chunk + 3
	cs := loopJob(t, n)
	in, out := make([][]float32, n), make([][]float32, n)
	for r := range n {
		in[r], out[r] = make([]float32, count), make([]float32, n*count)
	}
	for name, op := range map[string]func(c *comm.Comm) error{
		"Broadcast": func(c *comm.Comm) error { return comm.Broadcast(bg, c, in[c.Rank()], out[c.Rank()][:count], 1) },
		"AllGather": func(c *comm.Comm) error { return comm.AllGather(bg, c, in[c.Rank()], out[c.Rank()]) },
	} {
		t.Run(name, func(t *testing.T) {
			run, stop := lockstep(t, cs, op)
			defer stop()
			run()
			before := [n]uint64{}
			for r, c := range cs {
				before[r], _ = comm.DirectCounts(c)
			}
			if a := testing.AllocsPerRun(20, run); a != 0 {
				t.Fatalf("%v allocations per call", a)
			}
			for r, c := range cs {
				if sent, _ := comm.DirectCounts(c); sent == before[r] && (name == "AllGather" || r == 1) {
					t.Fatalf("rank %d sent nothing from its buffers", r)
				}
			}
		})
	}
}

// loopJob starts n ranks of a job whose pairs all go over TCP on loopback
// (registry_test.go's LOOP transport), and closes them when the test ends.
func loopJob(t *testing.T, n int) []*comm.Comm {
	t.Helper()
	unregister := transport.Register(loopTransport{}, 0)
	cs, stop := initJobOver(t, n)
	t.Cleanup(func() {
		for _, c := range cs {
			if err := c.Close(); err != nil {
				t.Errorf("rank %d: Close: %v", c.Rank(), err)
			}
		}
		stop()
		unregister()
	})
	return cs
}
