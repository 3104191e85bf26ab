// Command collcheck is one rank of a multi-process correctness check: it
// joins the job from the environment (as launched by gccl-run), runs a
// representative slice of the collective matrix and checks every result
// exactly (and that float all-reduces leave every rank with the same
// bits), then prints "collcheck: rank R ok" and exits 0. Any wrong value or
// error prints it and exits 1. The tests in package tests launch it.
//
// Flags select a fault to inject, for the fault tests: -die-at N makes rank
// -victim exit abruptly (kill -9 style) after N collectives; -stall makes it
// stop instead. With -shrink, the survivors of a lost rank go on: they
// Shrink the communicator without the victim, run the check once more on
// it, and print "collcheck: rank R shrank to rank R' of N ok"; with -grow
// too they then Grow back to the job's size with a newcomer, a process
// started with GCCL_JOIN=1, and check again ("grew to rank R' of N ok";
// the newcomer prints "newcomer joined as rank R of N ok"). With -vcoll,
// it also checks the variable-size collectives (AllToAllV, AllGatherV).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/internal/commtest"
)

func main() {
	iters := flag.Int("iters", 1, "rounds of the whole check")
	large := flag.Int("large", 1<<20+3, "element count of the large all-reduce")
	dieAt := flag.Int("die-at", -1, "the victim SIGKILLs itself at this collective (-1: never)")
	stallAt := flag.Int("stall-at", -1, "the victim stops (SIGSTOP) at this collective (-1: never)")
	victim := flag.Int("victim", 1, "rank that dies or stalls")
	timeout := flag.Duration("timeout", time.Minute, "whole-run deadline")
	split := flag.Bool("split", false, "also check Split: even and odd ranks form two communicators")
	sym := flag.Bool("sym", false, "run the large all-reduces on buffers from Comm.Alloc (symmetric memory)")
	shrink := flag.Bool("shrink", false, "when a peer is lost, shrink the communicator without -victim and check it")
	vcoll := flag.Bool("vcoll", false, "also check AllToAllV and AllGatherV")
	grow := flag.Bool("grow", false, "with -shrink, grow the shrunk communicator back to the job's size with a newcomer (GCCL_JOIN=1) and check it")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	c, err := comm.Init(ctx, nil)
	if err != nil {
		fmt.Fprintf(os.Stderr, "collcheck: init: %v\n", err)
		os.Exit(1)
	}
	defer c.Close()
	if os.Getenv(comm.EnvJoin) == "1" {
		// A newcomer: Init joined the survivors' Grow; it runs the check
		// once with them.
		if err := (&checker{c: c, ctx: ctx, dieAt: -1, stallAt: -1, victim: -1}).round(*large); err != nil {
			fmt.Fprintf(os.Stderr, "collcheck: newcomer rank %d: %v\n", c.Rank(), err)
			os.Exit(1)
		}
		fmt.Printf("collcheck: newcomer joined as rank %d of %d ok\n", c.Rank(), c.Size())
		return
	}
	ck := &checker{c: c, ctx: ctx, dieAt: *dieAt, stallAt: *stallAt, victim: *victim}
	if *sym {
		if err := ck.allocSym(*large); err != nil {
			fmt.Fprintf(os.Stderr, "collcheck: rank %d: %v\n", c.Rank(), err)
			os.Exit(1)
		}
	}
	for it := 0; it < *iters; it++ {
		err := ck.round(*large)
		if err != nil && *shrink && errors.Is(err, comm.ErrPeerLost) {
			fmt.Printf("collcheck: rank %d: %v\n", c.Rank(), err)
			err = shrinkAndCheck(ctx, c, *victim, *large, *grow)
			if err == nil {
				return
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "collcheck: rank %d: %v\n", c.Rank(), err)
			os.Exit(1)
		}
	}
	if *vcoll {
		if err := checkV(ctx, c, *large); err != nil {
			fmt.Fprintf(os.Stderr, "collcheck: rank %d: vcoll: %v\n", c.Rank(), err)
			os.Exit(1)
		}
	}
	if *split {
		if err := checkSplit(ctx, c); err != nil {
			fmt.Fprintf(os.Stderr, "collcheck: rank %d: split: %v\n", c.Rank(), err)
			os.Exit(1)
		}
	}
	// How many collectives the rounds ran (not counting -vcoll and
	// -split's), for tests that check what gccl recorded against it.
	fmt.Printf("collcheck: rank %d of %d ok, %d collectives in %d rounds\n", c.Rank(), c.Size(), ck.n, *iters)
}

type checker struct {
	c              *comm.Comm
	ctx            context.Context
	n              int
	dieAt, stallAt int
	victim         int
	symIn, symOut  []int64 // in symmetric memory, for the large all-reduces
}

// allocSym allocates the large all-reduce's buffers with Comm.Alloc and
// reports whether peers map them.
func (k *checker) allocSym(large int) error {
	in, err := k.c.Alloc(k.ctx, comm.Int64, large)
	if err != nil {
		return err
	}
	out, err := k.c.Alloc(k.ctx, comm.Int64, large)
	if err != nil {
		return err
	}
	k.symIn, _ = comm.SymSlice[int64](in)
	k.symOut, _ = comm.SymSlice[int64](out)
	fmt.Printf("collcheck: rank %d: symmetric buffers mapped by every peer: %v\n", k.c.Rank(), in.Mapped() && out.Mapped())
	return nil
}

// tick counts collectives and injects the requested fault.
func (k *checker) tick() {
	if k.c.Rank() == k.victim {
		if k.n == k.dieAt {
			killSelf()
		}
		if k.n == k.stallAt {
			stopSelf()
		}
	}
	k.n++
}

func val(rank, i int) int64 { return int64((rank+1)*1000003 + i*7) }

func (k *checker) round(large int) error {
	c, ctx := k.c, k.ctx
	n, r := c.Size(), c.Rank()
	for _, count := range []int{0, 1, 7, 4097, large} {
		// AllReduce (int64 sum: exact), in place and out of place.
		in, out := make([]int64, count), make([]int64, count)
		if count == large && k.symIn != nil {
			in, out = k.symIn, k.symOut
		}
		for i := range in {
			in[i] = val(r, i)
		}
		k.tick()
		if err := comm.AllReduce(ctx, c, in, out, comm.Sum); err != nil {
			return err
		}
		for i := range out {
			var want int64
			for p := 0; p < n; p++ {
				want += val(p, i)
			}
			if out[i] != want {
				return fmt.Errorf("AllReduce count %d element %d = %d, want %d", count, i, out[i], want)
			}
		}
		k.tick()
		if err := comm.AllReduce(ctx, c, in, in, comm.Max); err != nil {
			return err
		}
		for i := range in {
			if want := val(n-1, i); in[i] != want {
				return fmt.Errorf("in-place AllReduce max count %d element %d = %d, want %d", count, i, in[i], want)
			}
		}
		if count > 4097 {
			continue
		}
		// AllGather of float32, ReduceScatter of int32, Broadcast and
		// Reduce from the last rank, AllToAll of uint8.
		mine := make([]float32, count)
		for i := range mine {
			mine[i] = float32(val(r, i) % 1000)
		}
		all := make([]float32, n*count)
		k.tick()
		if err := comm.AllGather(ctx, c, mine, all); err != nil {
			return err
		}
		for p := 0; p < n; p++ {
			for i := 0; i < count; i++ {
				if want := float32(val(p, i) % 1000); all[p*count+i] != want {
					return fmt.Errorf("AllGather block %d element %d = %v, want %v", p, i, all[p*count+i], want)
				}
			}
		}
		rsIn := make([]int32, n*count)
		for i := range rsIn {
			rsIn[i] = int32(r + i)
		}
		rsOut := make([]int32, count)
		k.tick()
		if err := comm.ReduceScatter(ctx, c, rsIn, rsOut, comm.Sum); err != nil {
			return err
		}
		for i := range rsOut {
			var want int32
			for p := 0; p < n; p++ {
				want += int32(p + r*count + i)
			}
			if rsOut[i] != want {
				return fmt.Errorf("ReduceScatter element %d = %d, want %d", i, rsOut[i], want)
			}
		}
		root := n - 1
		b := make([]int64, count)
		if r == root {
			for i := range b {
				b[i] = val(root, i)
			}
		}
		k.tick()
		if err := comm.Broadcast(ctx, c, b, b, root); err != nil {
			return err
		}
		for i := range b {
			if b[i] != val(root, i) {
				return fmt.Errorf("Broadcast element %d = %d", i, b[i])
			}
		}
		red := make([]int64, count)
		k.tick()
		if err := comm.Reduce(ctx, c, b, red, comm.Sum, root); err != nil {
			return err
		}
		if r == root {
			for i := range red {
				if red[i] != int64(n)*val(root, i) {
					return fmt.Errorf("Reduce element %d = %d", i, red[i])
				}
			}
		}
		a2a := make([]uint8, n*count)
		for i := range a2a {
			a2a[i] = uint8(r*31 + i)
		}
		k.tick()
		if err := comm.AllToAll(ctx, c, a2a, a2a); err != nil {
			return err
		}
		for p := 0; p < n; p++ {
			for i := 0; i < count; i++ {
				if want := uint8(p*31 + r*count + i); a2a[p*count+i] != want {
					return fmt.Errorf("AllToAll block %d element %d = %d, want %d", p, i, a2a[p*count+i], want)
				}
			}
		}
	}
	for _, count := range []int{1, 7, 4097} {
		if err := k.agree(count); err != nil {
			return err
		}
	}
	if err := k.largeBroadcasts(); err != nil {
		return err
	}
	k.tick()
	return c.Barrier(ctx)
}

// largeBroadcastCounts are int64 counts of broadcasts that take the
// single-copy path between processes of one host (64 KiB and up; two
// processes split them between root and reader), neither a page multiple.
var largeBroadcastCounts = []int{8<<10 + 3, 128<<10 + 5}

// largeBroadcasts broadcasts largeBroadcastCounts from every root, out of
// place and in place, and checks every element.
func (k *checker) largeBroadcasts() error {
	c, ctx := k.c, k.ctx
	n, r := c.Size(), c.Rank()
	for _, count := range largeBroadcastCounts {
		for root := range n {
			for _, inPlace := range []bool{false, true} {
				in, out := make([]int64, count), make([]int64, count)
				if inPlace {
					in = out
				}
				if r == root {
					for i := range in {
						in[i] = val(root, i) ^ int64(count)
					}
				}
				k.tick()
				if err := comm.Broadcast(ctx, c, in, out, root); err != nil {
					return err
				}
				for i := range out {
					if want := val(root, i) ^ int64(count); out[i] != want {
						return fmt.Errorf("Broadcast of %d from %d (in place %v) element %d = %d, want %d", count, root, inPlace, i, out[i], want)
					}
				}
			}
		}
	}
	return nil
}

// agree checks that every rank ends float32 all-reduces with the same
// bits, on inputs where the order and places of the operands show.
func (k *checker) agree(count int) error {
	c, ctx := k.c, k.ctx
	in, out := make([]byte, 4*count), make([]byte, 4*count)
	commtest.FillAgree(comm.Float32, in, c.Rank())
	for _, op := range []comm.Op{comm.Sum, comm.Min, comm.Max} {
		k.tick()
		if err := c.AllReduce(ctx, comm.HostBytesOf(comm.Float32, in), comm.HostBytesOf(comm.Float32, out), op); err != nil {
			return err
		}
		k.tick()
		if err := commtest.SameOnEveryRank(ctx, c, out); err != nil {
			return fmt.Errorf("float32 AllReduce %v of %d elements: %w", op, count, err)
		}
	}
	return nil
}

// shrinkAndCheck makes the communicator of the survivors, once the
// rendezvous has declared victim lost, and runs the whole check on it.
func shrinkAndCheck(ctx context.Context, c *comm.Comm, victim, large int, grow bool) error {
	lost := c.LostRanks()
	for wait := time.Now(); len(lost) == 0 && time.Since(wait) < 10*time.Second; lost = c.LostRanks() {
		time.Sleep(10 * time.Millisecond)
	}
	if len(lost) != 1 || lost[0] != victim {
		return fmt.Errorf("LostRanks = %v, want [%d]", lost, victim)
	}
	nc, err := c.Shrink(ctx, lost)
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := (&checker{c: nc, ctx: ctx, dieAt: -1, stallAt: -1, victim: -1}).round(large); err != nil {
		return fmt.Errorf("after shrinking: %w", err)
	}
	fmt.Printf("collcheck: rank %d shrank to rank %d of %d ok\n", c.Rank(), nc.Rank(), nc.Size())
	if !grow {
		return nil
	}
	// Back to the job's size: the newcomers take the last ranks.
	gc, err := nc.Grow(ctx, c.Size())
	if err != nil {
		return fmt.Errorf("grow: %w", err)
	}
	defer gc.Close()
	if err := (&checker{c: gc, ctx: ctx, dieAt: -1, stallAt: -1, victim: -1}).round(large); err != nil {
		return fmt.Errorf("after growing: %w", err)
	}
	fmt.Printf("collcheck: rank %d grew to rank %d of %d ok\n", c.Rank(), gc.Rank(), gc.Size())
	return nil
}

// checkSplit splits the job by rank parity (keys reversing the order), checks
// an all-reduce in each half and that the halves' ranks follow the keys.
func checkSplit(ctx context.Context, c *comm.Comm) error {
	r := c.Rank()
	sub, err := c.Split(ctx, r%2, -r)
	if err != nil {
		return err
	}
	defer sub.Close()
	x := []int64{int64(r)}
	if err := comm.AllReduce(ctx, sub, x, x, comm.Sum); err != nil {
		return err
	}
	var want int64
	for p := r % 2; p < c.Size(); p += 2 {
		want += int64(p)
	}
	if x[0] != want {
		return fmt.Errorf("sum over ranks of parity %d = %d, want %d", r%2, x[0], want)
	}
	ranks := make([]int64, sub.Size())
	if err := comm.AllGather(ctx, sub, []int64{int64(r)}, ranks); err != nil {
		return err
	}
	for i := 1; i < len(ranks); i++ {
		if ranks[i] > ranks[i-1] {
			return fmt.Errorf("sub-communicator ranks %v do not follow the keys", ranks)
		}
	}
	return c.Barrier(ctx)
}

// checkV checks AllToAllV (int64, out of place and in place) and AllGatherV
// (uint8, out of place and in place) with counts that differ per pair of
// ranks, zeros included, and one block of large elements (several slots).
func checkV(ctx context.Context, c *comm.Comm, large int) error {
	n, r := c.Size(), c.Rank()
	for k := range 3 {
		// cnt is what rank s sends rank d; symmetric in the in-place round.
		cnt := func(s, d int) int {
			if k == 2 {
				s, d = min(s, d), max(s, d)
			}
			if s == 0 && d == n-1 {
				return large
			}
			return (s*3 + d*5 + k) % 7 // zero for some pairs
		}
		v := func(s, d, i int) int64 { return int64(s)<<40 | int64(d)<<32 | int64(i) }
		sc, rc := make([]int, n), make([]int, n)
		var st, rt int
		for p := range n {
			sc[p], rc[p] = cnt(r, p), cnt(p, r)
			st, rt = st+sc[p], rt+rc[p]
		}
		send, recv := make([]int64, st), make([]int64, rt)
		off := 0
		for p := range n {
			for i := range sc[p] {
				send[off+i] = v(r, p, i)
			}
			off += sc[p]
		}
		if k == 2 {
			recv = send
		}
		if err := comm.AllToAllV(ctx, c, send, sc, recv, rc); err != nil {
			return err
		}
		off = 0
		for p := range n {
			for i := range rc[p] {
				if got, want := recv[off+i], v(p, r, i); got != want {
					return fmt.Errorf("AllToAllV round %d block from %d element %d = %#x, want %#x", k, p, i, got, want)
				}
			}
			off += rc[p]
		}
		// AllGatherV: rank p contributes cnt(p, n-1) bytes (rank 0 large).
		counts := make([]int, n)
		total, disp := 0, 0
		for p := range n {
			counts[p] = cnt(p, n-1)
			if p == r {
				disp = total
			}
			total += counts[p]
		}
		all := make([]uint8, total)
		mine := make([]uint8, counts[r])
		if k == 2 {
			mine = all[disp : disp+counts[r]]
		}
		for i := range mine {
			mine[i] = uint8(r*31 + i)
		}
		if err := comm.AllGatherV(ctx, c, mine, all, counts); err != nil {
			return err
		}
		off = 0
		for p := range n {
			for i := range counts[p] {
				if got, want := all[off+i], uint8(p*31+i); got != want {
					return fmt.Errorf("AllGatherV round %d block of %d element %d = %d, want %d", k, p, i, got, want)
				}
			}
			off += counts[p]
		}
	}
	return c.Barrier(ctx)
}
