package comm_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/gccl/gccl/comm"
)

// mustGatherOnSlots runs gatherAndBroadcast and fails unless every call
// worked and none read peers' memory (why: what the ranks should have
// agreed).
func mustGatherOnSlots(t *testing.T, cs []*comm.Comm, blk, root int, inPlace bool, salt int, why string) {
	t.Helper()
	for r, err := range gatherAndBroadcast(t, cs, blk, root, inPlace, salt) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r, k := range cmaCounts(cs) {
		if k != 0 {
			t.Fatalf("rank %d ran %d calls reading peers' memory: %s", r, k, why)
		}
	}
}

// cmaCounts reports each rank's count of single-copy calls.
func cmaCounts(cs []*comm.Comm) []uint64 {
	n := make([]uint64, len(cs))
	for i, c := range cs {
		n[i] = comm.CMAOps(c)
	}
	return n
}

// gatherAndBroadcast runs an all-gather of blk uint32s per rank and a
// broadcast of n*blk from root on every rank, in or out of place, and
// checks every element.
func gatherAndBroadcast(t *testing.T, cs []*comm.Comm, blk, root int, inPlace bool, salt int) []error {
	n := len(cs)
	val := func(r, i int) uint32 { return uint32(r*7919 + i*31 + salt) }
	return onAll(t, cs, func(c *comm.Comm) error {
		r := c.Rank()
		out := make([]uint32, n*blk)
		for i := range out {
			out[i] = 0xdead
		}
		in := make([]uint32, blk)
		if inPlace {
			in = out[r*blk : (r+1)*blk]
		}
		for i := range in {
			in[i] = val(r, i)
		}
		if err := comm.AllGather(context.Background(), c, in, out); err != nil {
			return err
		}
		for i, v := range out {
			if want := val(i/blk, i%blk); v != want {
				return fmt.Errorf("all-gather of %d per rank: element %d = %#x, want %#x", blk, i, v, want)
			}
		}
		bin := make([]uint32, n*blk)
		bout := make([]uint32, n*blk)
		if inPlace {
			bin = bout
		}
		if r == root {
			for i := range bin {
				bin[i] = val(root+100, i)
			}
		}
		if err := comm.Broadcast(context.Background(), c, bin, bout, root); err != nil {
			return err
		}
		for i, v := range bout {
			if want := val(root+100, i); v != want {
				return fmt.Errorf("broadcast of %d from %d: element %d = %#x, want %#x", n*blk, root, i, v, want)
			}
		}
		return nil
	})
}

// TestCMACollectives: processes of one host (here ranks over shared
// memory in one process) run large all-gathers and broadcasts by reading
// each other's buffers, in and out of place, from every root, at sizes
// around the threshold; smaller ones take the slots.
func TestCMACollectives(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			cs, stop := initJobOver(t, n)
			defer stop()
			defer closeAll(cs)
			min0, minAG := comm.CMAMinBytes(cs[0]), comm.CMAMinGatherBytes(cs[0])
			minBlk := min0 / 4 / n // uint32s per rank at the broadcast's threshold
			for _, tc := range []struct {
				blk  int
				cma  bool
				name string
			}{
				{minAG/4/n - 8, false, "below both"},
				{minAG/4/n + 1, true, "at the all-gather's, odd"},
				{minBlk - 8, true, "below the broadcast's"},
				{minBlk + 1, true, "at, odd"},
				{1<<20/4/n + 3, true, "1 MiB"},
				{9<<20/4/n + 5, true, "9 MiB, non-temporal"},
			} {
				for _, inPlace := range []bool{false, true} {
					for root := range n {
						before := cmaCounts(cs)
						splitsBefore := comm.CMASplits(cs[root])
						for r, err := range gatherAndBroadcast(t, cs, tc.blk, root, inPlace, root+tc.blk) {
							if err != nil {
								t.Fatalf("%s, in place %v, rank %d: %v", tc.name, inPlace, r, err)
							}
						}
						for r, k := range cmaCounts(cs) {
							want := uint64(0) // one per collective above its threshold
							if tc.cma && n*tc.blk*4 >= minAG {
								want++
							}
							if tc.cma && n*tc.blk*4 >= min0 {
								want++
							}
							if k-before[r] != want {
								t.Fatalf("%s, in place %v: rank %d ran %d calls reading peers' memory, want %d", tc.name, inPlace, r, k-before[r], want)
							}
						}
						// Two processes split a large broadcast: the root
						// writes part of the reader's output.
						split := uint64(0)
						if n == 2 && tc.cma && n*tc.blk*4 >= max(min0, comm.CMASplitMinBytes) {
							split = 1
						}
						if got := comm.CMASplits(cs[root]) - splitsBefore; got != split {
							t.Fatalf("%s, in place %v: root %d split %d broadcasts, want %d", tc.name, inPlace, root, got, split)
						}
					}
				}
			}
		})
	}
}

func closeAll(cs []*comm.Comm) {
	for _, c := range cs {
		c.Close()
	}
}

// TestCMARefusedFallsBack: a rank that may not read its peers' memory
// (EPERM) makes every rank run that call through the slots, right, and
// the communicator never tries again.
func TestCMARefusedFallsBack(t *testing.T) {
	const n = 3
	cs, stop := initJobOver(t, n)
	defer stop()
	defer closeAll(cs)
	min0 := comm.CMAMinBytes(cs[0])
	comm.SetCMAFault(cs[1], fmt.Errorf("process_vm_readv: %w", syscall.EPERM))
	blk := min0 / 4
	for round := range 2 {
		mustGatherOnSlots(t, cs, blk, 0, round == 1, round, "rank 1 could not read")
	}
	comm.SetCMAFault(cs[1], nil)
	mustGatherOnSlots(t, cs, blk, 2, false, 9, "the ranks had agreed not to, for good")
}

// TestCMAReadFailsEveryRank: a read that fails for another reason than a
// refusal (the peer's memory unmapped under it) fails the call on every
// rank, the reader's error naming the peer; nobody hangs.
func TestCMAReadFailsEveryRank(t *testing.T) {
	const n = 2
	cs, stop := initJobOver(t, n)
	defer stop()
	defer closeAll(cs)
	min0 := comm.CMAMinBytes(cs[0])
	comm.SetCMAFault(cs[0], fmt.Errorf("process_vm_readv: %w", syscall.EFAULT))
	errs := onAll(t, cs, func(c *comm.Comm) error {
		in := make([]float32, min0/4)
		return comm.AllGather(context.Background(), c, in, make([]float32, n*len(in)))
	})
	var oe *comm.OpError
	if !errors.As(errs[0], &oe) || oe.Peer != 1 || !errors.Is(errs[0], syscall.EFAULT) {
		t.Fatalf("rank 0: %v; want an OpError naming peer 1 with EFAULT", errs[0])
	}
	// Rank 1 learns of it from rank 0's departure, or, when rank 0's abort
	// (it fails its Comm as it returns) overtakes that, from the abort,
	// which carries rank 0's error.
	if e := errs[1]; e == nil || !strings.Contains(e.Error(), "rank 0 could not do its share") &&
		!(strings.Contains(e.Error(), "abort from rank 0") && strings.Contains(e.Error(), "bad address")) {
		t.Fatalf("rank 1: %v; want rank 0's failure", errs[1])
	}
}

// TestCMASplitBroadcastFaults: the root of a split broadcast that may not
// write the reader's memory makes both ranks run the call through the
// slots, right; one whose write fails otherwise fails the call on both
// ranks, the root's error naming the reader.
func TestCMASplitBroadcastFaults(t *testing.T) {
	const n = 2
	blk := comm.CMASplitMinBytes / 4 / n
	t.Run("refused", func(t *testing.T) {
		cs, stop := initJobOver(t, n)
		defer stop()
		defer closeAll(cs)
		comm.SetCMAFault(cs[1], fmt.Errorf("process_vm_writev: %w", syscall.EPERM))
		for r, err := range onAll(t, cs, func(c *comm.Comm) error {
			in, out := make([]uint32, n*blk), make([]uint32, n*blk)
			for i := range in {
				in[i] = uint32(i*3 + 1)
			}
			if err := comm.Broadcast(context.Background(), c, in, out, 1); err != nil {
				return err
			}
			for i, v := range out {
				if v != uint32(i*3+1) {
					return fmt.Errorf("element %d = %d, want %d", i, v, i*3+1)
				}
			}
			return nil
		}) {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
		if k := cmaCounts(cs); k[0] != 0 || k[1] != 0 || comm.CMASplits(cs[1]) != 0 {
			t.Fatalf("ran %v calls reading peers' memory; want the slots after the root's refusal", k)
		}
		comm.SetCMAFault(cs[1], nil)
		mustGatherOnSlots(t, cs, blk, 0, false, 5, "the root could not write")
	})
	t.Run("fails", func(t *testing.T) {
		cs, stop := initJobOver(t, n)
		defer stop()
		defer closeAll(cs)
		comm.SetCMAFault(cs[0], fmt.Errorf("process_vm_writev: %w", syscall.EFAULT))
		errs := onAll(t, cs, func(c *comm.Comm) error {
			b := make([]uint32, n*blk)
			return comm.Broadcast(context.Background(), c, b, b, 0)
		})
		var oe *comm.OpError
		if !errors.As(errs[0], &oe) || oe.Peer != 1 || !errors.Is(errs[0], syscall.EFAULT) {
			t.Fatalf("root: %v; want an OpError naming peer 1 with EFAULT", errs[0])
		}
		if errs[1] == nil {
			t.Fatal("the reader returned no error after the root's write failed")
		}
	})
}

// TestCMAMismatchedSizes: ranks that pass different sizes fail on every
// rank, the ranks that see it with ErrMismatch, a rank whose peer's abort
// comes first with ErrPeerLost (commtest.WantMismatch), whether both sizes
// take the single-copy path or only one does.
func TestCMAMismatchedSizes(t *testing.T) {
	for _, half := range []bool{false, true} {
		cs, stop := initJobOver(t, 2)
		min0 := comm.CMAMinBytes(cs[0])
		small := min0/2 + 64 // both sizes read peers' memory
		if half {
			small = comm.CMAMinGatherBytes(cs[0]) / 4 // only rank 0's does
		}
		errs := onAll(t, cs, func(c *comm.Comm) error {
			blk := min0
			if c.Rank() == 1 {
				blk = small
			}
			return comm.AllGather(context.Background(), c, make([]byte, blk), make([]byte, 2*blk))
		})
		t.Logf("rank 1 with %d bytes", small)
		wantMismatch(t, errs)
		closeAll(cs)
		stop()
	}
}

// TestCMADisabled: GCCL_CMA_DISABLE=1 keeps every call on the slots.
func TestCMADisabled(t *testing.T) {
	t.Setenv("GCCL_CMA_DISABLE", "1")
	cs, stop := initJobOver(t, 2)
	defer stop()
	defer closeAll(cs)
	mustGatherOnSlots(t, cs, comm.CMAMinBytes(cs[0])/4, 1, false, 3, "GCCL_CMA_DISABLE=1")
}

// TestCMASteadyStateAllocations: a blocking single-copy all-gather
// allocates nothing once warm.
func TestCMASteadyStateAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	const n = 2
	cs, stop := initJobOver(t, n)
	defer stop()
	defer closeAll(cs)
	min0 := comm.CMAMinBytes(cs[0])
	blk := min0
	ins := [n][]byte{make([]byte, blk), make([]byte, blk)}
	outs := [n][]byte{make([]byte, n*blk), make([]byte, n*blk)}
	bufs := [n][2]comm.Buffer{}
	for r := range n {
		bufs[r] = [2]comm.Buffer{comm.HostBytesOf(comm.Uint8, ins[r]), comm.HostBytesOf(comm.Uint8, outs[r])}
	}
	ctx := context.Background()
	errc := make(chan error, 1)
	const runs = 50
	go func() {
		for range runs + 1 {
			if err := cs[1].AllGather(ctx, bufs[1][0], bufs[1][1]); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	allocs := testing.AllocsPerRun(runs, func() {
		if err := cs[0].AllGather(ctx, bufs[0][0], bufs[0][1]); err != nil {
			t.Fatal(err)
		}
	})
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if comm.CMAOps(cs[0]) != runs+1 {
		t.Fatalf("%d single-copy calls, want %d", comm.CMAOps(cs[0]), runs+1)
	}
	if allocs != 0 {
		t.Fatalf("%v allocations per single-copy all-gather", allocs)
	}
}
