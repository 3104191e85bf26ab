package comm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/internal/commtest"
)

// allocAll runs Alloc on every rank of cs and returns the buffers.
func allocAll(t testing.TB, cs []*comm.Comm, dt comm.DataType, count int) []*comm.SymBuffer {
	t.Helper()
	bufs := make([]*comm.SymBuffer, len(cs))
	mustAll(t, onAll(t, cs, func(c *comm.Comm) (err error) {
		bufs[c.Rank()], err = c.Alloc(bg, dt, count)
		return err
	}))
	return bufs
}

// TestSymmetricAllReduce checks the symmetric-memory all-reduce against the
// matrix's reference, for every type and op, in and out of place, at
// unaligned offsets inside the allocations, and that it was the path taken.
func TestSymmetricAllReduce(t *testing.T) {
	ranks := []int{2, 3, 4, 5}
	if testing.Short() || raceEnabled {
		ranks = []int{2, 3}
	}
	for _, n := range ranks {
		cs := world(t, n, nil)
		for _, tc := range symCases(n) {
			dt, cnt := tc.dt, tc.cnt
			esz := dt.Size()
			const skew = 3
			bufs := allocAll(t, cs, dt, 2*cnt+2*skew)
			for _, op := range matrixOps() {
				ins := make([][]byte, n)
				for p := range ins {
					ins[p] = make([]byte, cnt*esz)
					fill(dt, op, n, p, ins[p])
				}
				ref := expect(dt, op, ins)
				for _, inPlace := range []bool{false, true} {
					name := fmt.Sprintf("n=%d/%v/%v/inplace=%v", n, dt, op, inPlace)
					before := make([]uint64, n)
					for r, c := range cs {
						before[r] = comm.SymOps(c)
					}
					errs := onAll(t, cs, func(c *comm.Comm) error {
						r := c.Rank()
						mem := bufs[r].HostBytes()
						// Rank-dependent offsets: peers find each other's
						// buffers from the arrival records, not by assuming
						// the same layout.
						in := mem[(r%2)*esz:][:cnt*esz]
						out := in
						if !inPlace {
							out = mem[(cnt+skew+r%3)*esz:][:cnt*esz]
						}
						copy(in, ins[r])
						if err := c.AllReduce(bg, comm.HostBytesOf(dt, in), comm.HostBytesOf(dt, out), op); err != nil {
							return err
						}
						if err := ref.checkRange(out, cnt, 0); err != nil {
							return err
						}
						if !inPlace && !bytes.Equal(in, ins[r]) {
							return fmt.Errorf("send buffer modified")
						}
						return nil
					})
					for r, err := range errs {
						if err != nil {
							t.Fatalf("%s: rank %d: %v", name, r, err)
						}
						if got := comm.SymOps(cs[r]) - before[r]; got != 1 {
							t.Fatalf("%s: rank %d ran %d symmetric all-reduces, want 1", name, r, got)
						}
					}
				}
			}
			for _, b := range bufs {
				if err := b.Free(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

type symCase struct {
	dt  comm.DataType
	cnt int
}

// symCases are odd element counts above the symmetric path's threshold for
// every type, and above the non-temporal threshold for two.
func symCases(n int) []symCase {
	var cs []symCase
	for _, dt := range comm.DataTypes {
		cs = append(cs, symCase{dt, (comm.SymMinBytes/dt.Size() + 1000) | 1})
	}
	large := []comm.DataType{comm.Float32, comm.Int64}
	if testing.Short() || raceEnabled {
		large = nil // 8 MiB references are slow there; the full run covers them
	}
	if n <= 3 {
		for _, dt := range large {
			cs = append(cs, symCase{dt, (comm.SymNTMinBytes/dt.Size() + 1000) | 1})
		}
	}
	return cs
}

// TestSymmetricAllReduceIdenticalOnEveryRank: each slice is reduced once and
// copied, so every rank gets the same bits even where float rounding depends
// on the order.
func TestSymmetricAllReduceIdenticalOnEveryRank(t *testing.T) {
	const n = 3
	cs := world(t, n, nil)
	cnt := comm.SymMinBytes
	bufs := allocAll(t, cs, comm.Float32, cnt)
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		s, err := comm.SymSlice[float32](bufs[c.Rank()])
		if err != nil {
			return err
		}
		for i := range s {
			s[i] = float32(hash(c.Rank(), i, 1)%1000) * 1.37e-3
		}
		return comm.AllReduce(bg, c, s, s, comm.Sum)
	}))
	for r := 1; r < n; r++ {
		if !bytes.Equal(bufs[r].HostBytes(), bufs[0].HostBytes()) {
			t.Fatalf("rank %d's result differs from rank 0's", r)
		}
	}
}

// TestSymmetricSmallUsesTransport: below the threshold the two message
// rounds cost more than they save, so the ordinary path runs.
func TestSymmetricSmallUsesTransport(t *testing.T) {
	cs := world(t, 2, nil)
	bufs := allocAll(t, cs, comm.Int32, 1000)
	mustAll(t, onAll(t, cs, func(c *comm.Comm) error {
		s, _ := comm.SymSlice[int32](bufs[c.Rank()])
		for i := range s {
			s[i] = int32(i * (c.Rank() + 1))
		}
		if err := comm.AllReduce(bg, c, s, s, comm.Sum); err != nil {
			return err
		}
		for i, v := range s {
			if v != int32(3*i) {
				return fmt.Errorf("element %d = %d, want %d", i, v, 3*i)
			}
		}
		if k := comm.SymOps(c); k != 0 {
			return fmt.Errorf("%d symmetric all-reduces for 4000 bytes", k)
		}
		return nil
	}))
}

// TestSymmetricMixedWithHeapFailsCleanly: one rank on symmetric memory, its
// peer on the heap; both must fail with ErrMismatch, not hang or compute.
func TestSymmetricMixedWithHeapFailsCleanly(t *testing.T) {
	cs := world(t, 2, nil)
	cnt := comm.SymMinBytes
	bufs := allocAll(t, cs, comm.Float32, cnt)
	errs := onAll(t, cs, func(c *comm.Comm) error {
		if c.Rank() == 0 {
			s, _ := comm.SymSlice[float32](bufs[0])
			return comm.AllReduce(bg, c, s, s, comm.Sum)
		}
		heap := make([]float32, cnt)
		return comm.AllReduce(bg, c, heap, heap, comm.Sum)
	})
	wantMismatch(t, errs)
}

// wantMismatch checks that a mismatch failed every rank: the rank that sees
// it with ErrMismatch, the others with ErrMismatch or ErrPeerLost.
func wantMismatch(t *testing.T, errs []error) { commtest.WantMismatch(t, errs) }

// TestSymmetricMismatchedCounts: the arrival records carry the count.
func TestSymmetricMismatchedCounts(t *testing.T) {
	cs := world(t, 2, nil)
	cnt := 2 * comm.SymMinBytes
	bufs := allocAll(t, cs, comm.Float32, cnt)
	errs := onAll(t, cs, func(c *comm.Comm) error {
		s, _ := comm.SymSlice[float32](bufs[c.Rank()])
		return comm.AllReduce(bg, c, s[:cnt-c.Rank()], s[:cnt-c.Rank()], comm.Sum)
	})
	wantMismatch(t, errs)
}

func TestAllocArguments(t *testing.T) {
	t.Run("zero", func(t *testing.T) {
		cs := world(t, 2, nil)
		errs := onAll(t, cs, func(c *comm.Comm) error {
			_, err := c.Alloc(bg, comm.Float32, 0)
			return err
		})
		for r, err := range errs {
			if !errors.Is(err, comm.ErrInvalidArgument) {
				t.Errorf("rank %d: %v, want ErrInvalidArgument", r, err)
			}
		}
	})
	t.Run("one rank bad", func(t *testing.T) {
		// Every rank learns that the Alloc failed, not only the bad one.
		cs := world(t, 3, nil)
		errs := onAll(t, cs, func(c *comm.Comm) error {
			cnt := 100
			if c.Rank() == 1 {
				cnt = -1
			}
			_, err := c.Alloc(bg, comm.Float32, cnt)
			return err
		})
		for r, err := range errs {
			var oe *comm.OpError
			if r != 1 && (!errors.As(err, &oe) || oe.Peer != 1) {
				t.Errorf("rank %d: %v, want an error naming peer 1", r, err)
			}
		}
		if !errors.Is(errs[1], comm.ErrInvalidArgument) {
			t.Errorf("rank 1: %v, want ErrInvalidArgument", errs[1])
		}
	})
	t.Run("different counts", func(t *testing.T) {
		cs := world(t, 2, nil)
		errs := onAll(t, cs, func(c *comm.Comm) error {
			_, err := c.Alloc(bg, comm.Float32, 100+c.Rank())
			return err
		})
		for r, err := range errs {
			if !errors.Is(err, comm.ErrMismatch) {
				t.Errorf("rank %d: %v, want ErrMismatch", r, err)
			}
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		cs := world(t, 2, nil)
		ctx, cancel := context.WithCancel(bg)
		cancel()
		if _, err := cs[0].Alloc(ctx, comm.Float32, 10); !errors.Is(err, context.Canceled) {
			t.Errorf("Alloc with a cancelled context: %v", err)
		}
	})
	t.Run("type", func(t *testing.T) {
		cs := world(t, 1, nil)
		b, err := cs[0].Alloc(bg, comm.Float32, 10)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := comm.SymSlice[int32](b); !errors.Is(err, comm.ErrInvalidArgument) {
			t.Errorf("SymSlice with the wrong type: %v", err)
		}
		b.Free()
		if b.HostBytes() != nil {
			t.Error("HostBytes after Free is not nil")
		}
		if err := cs[0].AllReduce(bg, b, b, comm.Sum); !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), "after Free") {
			t.Errorf("AllReduce on a freed SymBuffer: %v", err)
		}
		if _, err := comm.SymSlice[float32](b); err == nil {
			t.Error("SymSlice after Free succeeded")
		}
	})
}

// TestSymmetricCollectives checks reduce-scatter, all-gather and broadcast
// on symmetric memory against the matrix's references, in and out of
// place, at rank-dependent offsets, and that they took the symmetric path.
func TestSymmetricCollectives(t *testing.T) {
	ranks := []int{2, 3, 4}
	types := []comm.DataType{comm.Float32, comm.BFloat16, comm.Int64, comm.Float8E5M2}
	if testing.Short() || raceEnabled {
		ranks, types = []int{2, 3}, types[:2]
	}
	for _, n := range ranks {
		cs := world(t, n, nil)
		for _, dt := range types {
			esz := dt.Size()
			cnt := (comm.SymMinBytes/esz/n + 333) | 1 // per-rank block
			bufs := allocAll(t, cs, dt, 3*n*cnt+8)
			for _, coll := range []string{"ReduceScatter", "AllGather", "Broadcast"} {
				ops := []comm.Op{{}}
				if coll == "ReduceScatter" {
					ops = matrixOps()
				}
				for _, op := range ops {
					inLen := inputLen(coll, n, cnt)
					if coll == "Broadcast" {
						inLen = n * cnt
					}
					ins := make([][]byte, n)
					for p := range ins {
						ins[p] = make([]byte, inLen*esz)
						fill(dt, op, n, p, ins[p])
					}
					var ref *expected
					if coll == "ReduceScatter" {
						ref = expect(dt, op, ins)
					}
					for _, inPlace := range []bool{false, true} {
						name := fmt.Sprintf("n=%d/%s/%v/%v/inplace=%v", n, coll, dt, op, inPlace)
						errs := onAll(t, cs, func(c *comm.Comm) error {
							before := comm.SymOps(c)
							r := c.Rank()
							mem := bufs[r].HostBytes()[(r%3)*esz:]
							root := n - 1
							var in, out []byte
							switch coll {
							case "ReduceScatter":
								in = mem[:n*cnt*esz]
								out = mem[(n*cnt+1)*esz:][:cnt*esz]
								if inPlace {
									out = in[r*cnt*esz:][:cnt*esz]
								}
							case "AllGather":
								out = mem[:n*cnt*esz]
								in = mem[(n*cnt+1)*esz:][:cnt*esz]
								if inPlace {
									in = out[r*cnt*esz:][:cnt*esz]
								}
							case "Broadcast":
								in = mem[:n*cnt*esz]
								out = mem[(n*cnt+1)*esz:][:n*cnt*esz]
								if inPlace {
									out = in
								}
							}
							copy(in, ins[r])
							var err error
							switch coll {
							case "ReduceScatter":
								err = c.ReduceScatter(bg, comm.HostBytesOf(dt, in), comm.HostBytesOf(dt, out), op)
							case "AllGather":
								err = c.AllGather(bg, comm.HostBytesOf(dt, in), comm.HostBytesOf(dt, out))
							case "Broadcast":
								err = c.Broadcast(bg, comm.HostBytesOf(dt, in), comm.HostBytesOf(dt, out), root)
							}
							if err != nil {
								return err
							}
							switch coll {
							case "ReduceScatter":
								if err := ref.checkRange(out, cnt, r*cnt); err != nil {
									return err
								}
							case "AllGather":
								for p := range n {
									if !bytes.Equal(out[p*cnt*esz:(p+1)*cnt*esz], ins[p]) {
										return fmt.Errorf("block %d wrong", p)
									}
								}
							case "Broadcast":
								if !bytes.Equal(out, ins[root]) {
									return fmt.Errorf("output differs from the root's input")
								}
							}
							if k := comm.SymOps(c) - before; k != 1 {
								return fmt.Errorf("%d symmetric operations, want 1", k)
							}
							return nil
						})
						for r, err := range errs {
							if err != nil {
								t.Fatalf("%s: rank %d: %v", name, r, err)
							}
						}
					}
				}
			}
			for _, b := range bufs {
				b.Free()
			}
		}
	}
}

// TestSymmetricUnmappedPeerFailsEveryRank: a rank that cannot resolve a
// peer's buffer (an Alloc it freed) does no share of the work but still
// departs, saying it failed, so every rank fails the call, each naming the
// rank that could not do its share, and none returns while a peer may
// still write its buffers.
func TestSymmetricUnmappedPeerFailsEveryRank(t *testing.T) {
	const n = 3
	cs := world(t, n, nil)
	cnt := 2 * comm.SymMinBytes
	first := allocAll(t, cs, comm.Float32, cnt)
	second := allocAll(t, cs, comm.Float32, cnt)
	errs := onAll(t, cs, func(c *comm.Comm) error {
		b := first[c.Rank()]
		if c.Rank() == 2 {
			if err := b.Free(); err != nil {
				return err
			}
			b = second[2]
		}
		s, _ := comm.SymSlice[float32](b)
		return comm.AllReduce(bg, c, s, s, comm.Sum)
	})
	for r, err := range errs {
		var oe *comm.OpError
		if !errors.As(err, &oe) {
			t.Fatalf("rank %d: %v, want an *OpError", r, err)
		}
		if r == 2 {
			if !errors.Is(err, comm.ErrMismatch) {
				t.Errorf("rank 2: %v, want ErrMismatch (it freed the peers' Alloc)", err)
			}
			continue
		}
		if oe.Peer != 2 || !strings.Contains(err.Error(), "could not do its share") {
			t.Errorf("rank %d: %v, want rank 2 named as unable to do its share", r, err)
		}
	}
}
