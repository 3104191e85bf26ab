// Command devcheck is one rank of a multi-process check of collectives on
// GPU memory: it joins the job from the environment (as launched by
// gccl-run), opens GPU (local rank mod the device count), and runs
// all-reduce (every type and op, in and out of place), reduce-scatter,
// all-gather, broadcast, reduce, all-to-all, gather, scatter and a ring of
// send/recv on device buffers
// filled with fresh random data, checking every result against a float64
// (or exact integer) reference computed from every rank's inputs, and that
// every rank's all-reduce result has the same bits. It prints
// "devcheck: rank R of N ok" and whether the collectives ran on the devices
// (CUDA IPC and gccl's kernels) or through host staging, and exits 0; a
// wrong value or an error exits 1. Without a CUDA driver it says so and
// exits 2.
//
// The tests in package tests run it against the fake CUDA driver; on a GPU
// machine: go build -o /tmp/devcheck ./tests/devcheck && gccl-run -np 2
// /tmp/devcheck.
//
// With -bench it also measures, in the same run, a device-to-device copy of
// -bench-bytes within this rank's GPU and the device all-reduce of as many
// bytes of float32 across the job, and prints both bandwidths and their
// ratio (the all-reduce's bus bandwidth, 2(n-1)/n times the bytes over the
// time, as nccl-tests reports it).
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/gpu"
	"github.com/gccl/gccl/internal/commtest"
)

func main() {
	count := flag.Int("count", 4099, "elements per rank (not a multiple of 16, so slices end unaligned)")
	timeout := flag.Duration("timeout", 2*time.Minute, "whole-run deadline")
	bench := flag.Bool("bench", false, "also measure device all-reduce against a device-to-device copy")
	benchBytes := flag.Int("bench-bytes", 256<<20, "bytes of the -bench all-reduce and copy")
	iters := flag.Int("bench-iters", 20, "timed iterations of -bench")
	onStream := flag.Bool("stream", false, "run every call async on buffers bound to a CUDA stream, and read its results through that stream only")
	window := flag.Bool("window", false, "with -stream: every buffer a view of one device window all ranks registered (calls run stream-ordered)")
	latency := flag.Bool("latency", false, "also time small all-reduces and all-gathers on a stream: buffers held per call against a registered window (stream-ordered)")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var onDevice, direct, flagged atomic.Bool
	logger := slog.New(&watch{seen: &onDevice, direct: &direct, flagged: &flagged, next: slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})})
	c, err := comm.Init(ctx, &comm.Config{Logger: logger})
	if err != nil {
		fail("init: %v", err)
	}
	defer c.Close()
	local, _ := strconv.Atoi(os.Getenv("GCCL_LOCAL_RANK"))
	dev, err := openDevice(local)
	if errors.Is(err, gpu.ErrNotSupported) {
		fmt.Printf("devcheck: rank %d: no GPU: %v\n", c.Rank(), err)
		os.Exit(2)
	}
	if err != nil {
		fail("rank %d: %v", c.Rank(), err)
	}
	defer dev.Close()
	k := &checker{c: c, ctx: ctx, dev: dev, n: *count}
	if *onStream {
		if k.stream, err = dev.NewStream(); err != nil {
			fail("rank %d: %v", c.Rank(), err)
		}
		defer k.stream.Close()
	}
	if *window {
		if k.stream == nil {
			fail("-window needs -stream")
		}
		if err := k.registerArena(); err != nil {
			fail("rank %d: %v", c.Rank(), err)
		}
		defer k.arena.Free()
		defer k.win.Deregister()
	}
	if err := k.all(); err != nil {
		fail("rank %d: %v", c.Rank(), err)
	}
	fmt.Printf("devcheck: rank %d of %d ok (device %d, %s): %d checks; on the devices: %v; send/recv direct: %v; on a stream: %v; stream-ordered: %v\n",
		c.Rank(), c.Size(), dev.Ordinal(), dev.PCIBusID(), k.checks, onDevice.Load(), direct.Load(), *onStream, flagged.Load())
	if *bench {
		if err := k.bench(*benchBytes, *iters); err != nil {
			fail("rank %d: bench: %v", c.Rank(), err)
		}
	}
	if *latency {
		if err := k.latency(*iters); err != nil {
			fail("rank %d: latency: %v", c.Rank(), err)
		}
	}
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "devcheck: "+format+"\n", a...)
	os.Exit(1)
}

func openDevice(local int) (*gpu.Device, error) {
	d, err := gpu.Open(0)
	if err != nil || local == 0 {
		return d, err
	}
	// Spread local ranks over the devices (one GPU: all on device 0).
	n, err := gpu.DeviceCount()
	if err != nil || n <= 1 {
		return d, err
	}
	d.Close()
	return gpu.Open(local % n)
}

// watch notes comm's log lines saying collectives run on the devices and
// Send/Recv copies between device buffers directly.
type watch struct {
	seen, direct, flagged *atomic.Bool
	next                  slog.Handler
}

func (w *watch) Enabled(ctx context.Context, l slog.Level) bool { return true }
func (w *watch) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "collectives run on the devices") {
		w.seen.Store(true)
	}
	if strings.Contains(r.Message, "Send/Recv copies straight") {
		w.direct.Store(true)
	}
	if strings.Contains(r.Message, "collectives queued on the stream") {
		w.flagged.Store(true)
	}
	if w.next.Enabled(ctx, r.Level) {
		return w.next.Handle(ctx, r)
	}
	return nil
}
func (w *watch) WithAttrs(a []slog.Attr) slog.Handler {
	return &watch{w.seen, w.direct, w.flagged, w.next.WithAttrs(a)}
}
func (w *watch) WithGroup(g string) slog.Handler {
	return &watch{w.seen, w.direct, w.flagged, w.next.WithGroup(g)}
}

type checker struct {
	c      *comm.Comm
	ctx    context.Context
	dev    *gpu.Device
	n      int
	round  uint64
	checks int
	stream *gpu.Stream // -stream
	// -window: the registered arena, and the next of its two halves that
	// upload hands out (every rank uploads in the same order, so a call's
	// buffers are at the same offsets of the window on every rank).
	arena *gpu.Buffer
	win   *comm.DeviceWindow
	half  int
}

// registerArena allocates the window every check's buffers are views of:
// two halves, each as large as the largest buffer of a check.
func (k *checker) registerArena() error {
	half := (k.n*k.c.Size()*8 + 255) &^ 255
	a, err := k.dev.Alloc(comm.Uint8, 2*half)
	if err != nil {
		return err
	}
	w, err := k.c.RegisterDevice(k.ctx, a)
	if err != nil {
		a.Free()
		return fmt.Errorf("RegisterDevice: %w", err)
	}
	k.arena, k.win = a, w
	return nil
}

// do runs one call on send and recv and returns recv's contents after it.
// Without -stream it runs the blocking form. With -stream, the buffers are
// bound to the checker's stream and the async form is issued; the stream
// then copies recv into a snapshot at once, and do waits for the stream
// before the Request and returns the snapshot: it is right only if the
// stream waited for the call.
func (k *checker) do(send, recv *gpu.Buffer, blocking func(s, r comm.Buffer) error, async func(s, r comm.Buffer) *comm.Request) ([]byte, error) {
	if k.stream == nil {
		if err := blocking(send, recv); err != nil {
			return nil, err
		}
		return download(recv)
	}
	sb, err := send.OnStream(k.stream)
	if err != nil {
		return nil, err
	}
	rb := sb
	if recv != send {
		if rb, err = recv.OnStream(k.stream); err != nil {
			return nil, err
		}
	}
	snap, err := k.dev.Alloc(recv.DataType(), recv.Len())
	if err != nil {
		return nil, err
	}
	defer snap.Free()
	req := async(sb, rb)
	err = k.stream.Copy(snap, recv)
	if serr := k.stream.Synchronize(); err == nil {
		err = serr
	}
	if werr := req.Wait(k.ctx); err == nil {
		err = werr
	}
	if err != nil {
		return nil, err
	}
	return download(snap)
}

// inputs returns every rank's input of count elements for one check, from
// a seed all ranks share: rank r's values are in[r].
func (k *checker) inputs(dt comm.DataType, op comm.Op, count int) [][]float64 {
	k.round++
	in := make([][]float64, k.c.Size())
	for r := range in {
		rng := rand.New(rand.NewPCG(k.round, uint64(r)))
		in[r] = make([]float64, count)
		for i := range in[r] {
			in[r][i] = value(rng, dt, op)
		}
	}
	return in
}

// value draws one element: integers over their whole range (sums and
// products wrap), floats small enough that every op stays finite in the
// narrow formats.
func value(rng *rand.Rand, dt comm.DataType, op comm.Op) float64 {
	switch dt {
	case comm.Int8, comm.Uint8, comm.Int32, comm.Uint32, comm.Int64, comm.Uint64:
		return float64(int64(rng.Uint64()>>11) - 1<<52) // exact in a float64
	case comm.Float8E4M3, comm.Float8E5M2:
		return float64(rng.IntN(17)-8) / 4
	}
	return rng.Float64()*4 - 2
}

// encode stores values as dt.
func encode(dt comm.DataType, v []float64) []byte {
	b := make([]byte, len(v)*dt.Size())
	for i, x := range v {
		commtest.Put(dt, b, i, x)
	}
	return b
}

// element returns element i of b as raw bits (integers) or its value
// (floats).
func element(dt comm.DataType, b []byte, i int) (raw uint64, f float64) {
	if dt.IsFloat() {
		return 0, commtest.Get(dt, b, i)
	}
	return commtest.Raw(dt, b, i), 0
}

// precision returns dt's unit roundoff and the spacing of its values below
// its normal range (0 for float64: far below any value here).
func precision(dt comm.DataType) (eps, subnormal float64) {
	switch dt {
	case comm.Float16:
		return 0x1p-11, 0x1p-24
	case comm.BFloat16:
		return 0x1p-8, 0x1p-133
	case comm.Float32:
		return 0x1p-24, 0x1p-149
	case comm.Float64:
		return 0x1p-53, 0
	case comm.Float8E4M3:
		return 0x1p-4, 0x1p-9
	case comm.Float8E5M2:
		return 0x1p-3, 0x1p-16
	}
	return 0, 0
}

func signed(dt comm.DataType) bool {
	return dt == comm.Int8 || dt == comm.Int32 || dt == comm.Int64
}

// width masks raw integer bits to dt's width, sign-extending signed types.
func width(dt comm.DataType, v uint64) uint64 {
	bitsN := uint(dt.Size() * 8)
	if bitsN == 64 {
		return v
	}
	v &= 1<<bitsN - 1
	if signed(dt) && v>>(bitsN-1) != 0 {
		v |= ^uint64(0) << bitsN
	}
	return v
}

// want computes element i of the reduction of every rank's (encoded, then
// decoded) input: exact integer bits, or a float64 value with the error
// bound the narrow formats allow.
func want(dt comm.DataType, op comm.Op, ins [][]byte, i int) (raw uint64, f, tol float64) {
	n := len(ins)
	if !dt.IsFloat() {
		acc := uint64(0)
		s := uint64(int64(op.Scalar))
		for r := range ins {
			x, _ := element(dt, ins[r], i)
			switch {
			case r == 0 && op.Kind != comm.OpPreMulSum:
				acc = x
			case op.Kind == comm.OpSum || op.Kind == comm.OpAvg:
				acc += x
			case op.Kind == comm.OpProd:
				acc *= x
			case op.Kind == comm.OpMin, op.Kind == comm.OpMax:
				less := x < acc
				if signed(dt) {
					less = int64(x) < int64(acc)
				}
				if less == (op.Kind == comm.OpMin) {
					acc = x
				}
			case op.Kind == comm.OpPreMulSum:
				acc += x * s
			}
			acc = width(dt, acc)
		}
		if op.Kind == comm.OpAvg {
			if signed(dt) {
				acc = uint64(int64(acc) / int64(n))
			} else {
				acc /= uint64(n)
			}
			acc = width(dt, acc)
		}
		return acc, 0, 0
	}
	var acc, mag float64
	for r := range ins {
		_, x := element(dt, ins[r], i)
		switch op.Kind {
		case comm.OpSum:
			acc, mag = acc+x, mag+math.Abs(x)
		case comm.OpAvg:
			acc, mag = acc+x/float64(n), mag+math.Abs(x/float64(n))
		case comm.OpPreMulSum:
			acc, mag = acc+x*op.Scalar, mag+math.Abs(x*op.Scalar)
		case comm.OpProd:
			if r == 0 {
				acc = x
			} else {
				acc *= x
			}
			mag = math.Abs(acc)
		case comm.OpMin:
			if r == 0 || x < acc {
				acc = x
			}
		case comm.OpMax:
			if r == 0 || x > acc {
				acc = x
			}
		}
	}
	// Results below the normal range round to a fixed spacing, not a
	// relative one: each step may be off by half of it, and a product's
	// later factors (|x| < 2) scale an earlier step's error up.
	steps := float64(n)
	if op.Kind == comm.OpProd {
		steps = math.Ldexp(1, n)
	}
	eps, subnormal := precision(dt)
	return 0, acc, float64(2*n+2)*eps*mag + steps*subnormal + 1e-300
}

// compare checks out (count elements of dt) against the reduction of ins.
func compare(what string, dt comm.DataType, op comm.Op, out []byte, ins [][]byte, count int) error {
	for i := 0; i < count; i++ {
		wr, wf, tol := want(dt, op, ins, i)
		gr, gf := element(dt, out, i)
		if dt.IsFloat() {
			if !(math.Abs(gf-wf) <= tol) {
				return fmt.Errorf("%s %v %v: element %d is %g, want %g (±%g)", what, dt, op, i, gf, wf, tol)
			}
		} else if gr != wr {
			return fmt.Errorf("%s %v %v: element %d is %#x, want %#x", what, dt, op, i, gr, wr)
		}
	}
	return nil
}

// upload allocates a device buffer holding b.
func (k *checker) upload(dt comm.DataType, b []byte) (*gpu.Buffer, error) {
	var d *gpu.Buffer
	var err error
	if k.arena != nil {
		half := k.arena.Len() / 2
		d, err = k.arena.View(k.half*half, dt, len(b)/dt.Size())
		k.half = 1 - k.half
	} else {
		d, err = k.dev.Alloc(dt, len(b)/dt.Size())
	}
	if err != nil {
		return nil, err
	}
	if err := d.CopyFromHost(b); err != nil {
		d.Free()
		return nil, err
	}
	return d, nil
}

// exchange runs one call (do) on a send buffer holding in and a receive
// buffer holding recvInit, and returns the receive buffer's contents after.
func (k *checker) exchange(dt comm.DataType, in, recvInit []byte, blocking func(s, r comm.Buffer) error, async func(s, r comm.Buffer) *comm.Request) ([]byte, error) {
	send, err := k.upload(dt, in)
	if err != nil {
		return nil, err
	}
	defer send.Free()
	recv, err := k.upload(dt, recvInit)
	if err != nil {
		return nil, err
	}
	defer recv.Free()
	return k.do(send, recv, blocking, async)
}

func download(d *gpu.Buffer) ([]byte, error) {
	b := make([]byte, d.Len()*d.DataType().Size())
	return b, d.CopyToHost(b)
}

func (k *checker) all() error {
	ops := append(append([]comm.Op(nil), comm.Ops...), comm.PreMulSum(3))
	for _, dt := range comm.DataTypes {
		for _, op := range ops {
			for _, inPlace := range []bool{false, true} {
				if err := k.allReduce(dt, op, inPlace); err != nil {
					return err
				}
			}
		}
		for _, f := range []func(comm.DataType) error{k.reduceScatter, k.allGather, k.broadcast, k.reduce, k.allToAll, k.gather, k.scatter, k.sendRecv} {
			if err := f(dt); err != nil {
				return err
			}
		}
	}
	return nil
}

// encoded returns every rank's input as dt's bytes.
func (k *checker) encoded(dt comm.DataType, op comm.Op, count int) [][]byte {
	in := k.inputs(dt, op, count)
	b := make([][]byte, len(in))
	for r := range in {
		b[r] = encode(dt, in[r])
	}
	return b
}

func (k *checker) allReduce(dt comm.DataType, op comm.Op, inPlace bool) error {
	ins := k.encoded(dt, op, k.n)
	send, err := k.upload(dt, ins[k.c.Rank()])
	if err != nil {
		return err
	}
	defer send.Free()
	recv := send
	if !inPlace {
		if recv, err = k.upload(dt, make([]byte, len(ins[0]))); err != nil {
			return err
		}
		defer recv.Free()
	}
	out, err := k.do(send, recv,
		func(s, r comm.Buffer) error { return k.c.AllReduce(k.ctx, s, r, op) },
		func(s, r comm.Buffer) *comm.Request { return k.c.AllReduceAsync(s, r, op) })
	if err != nil {
		return fmt.Errorf("AllReduce %v %v: %w", dt, op, err)
	}
	k.checks++
	what := "AllReduce"
	if inPlace {
		what += " in place"
	}
	if err := compare(what, dt, op, out, ins, k.n); err != nil {
		return err
	}
	if err := commtest.SameOnEveryRank(k.ctx, k.c, out); err != nil {
		return fmt.Errorf("%s %v %v: %w", what, dt, op, err)
	}
	return nil
}

func (k *checker) reduceScatter(dt comm.DataType) error {
	n, r := k.c.Size(), k.c.Rank()
	ins := k.encoded(dt, comm.Sum, k.n*n)
	out, err := k.exchange(dt, ins[r], make([]byte, k.n*dt.Size()),
		func(s, r comm.Buffer) error { return k.c.ReduceScatter(k.ctx, s, r, comm.Sum) },
		func(s, r comm.Buffer) *comm.Request { return k.c.ReduceScatterAsync(s, r, comm.Sum) })
	if err != nil {
		return fmt.Errorf("ReduceScatter %v: %w", dt, err)
	}
	esz := dt.Size()
	blocks := make([][]byte, n)
	for p := range ins {
		blocks[p] = ins[p][r*k.n*esz : (r+1)*k.n*esz]
	}
	k.checks++
	return compare("ReduceScatter", dt, comm.Sum, out, blocks, k.n)
}

func (k *checker) allGather(dt comm.DataType) error {
	n, r := k.c.Size(), k.c.Rank()
	ins := k.encoded(dt, comm.Sum, k.n)
	out, err := k.exchange(dt, ins[r], make([]byte, n*len(ins[r])),
		func(s, r comm.Buffer) error { return k.c.AllGather(k.ctx, s, r) },
		func(s, r comm.Buffer) *comm.Request { return k.c.AllGatherAsync(s, r) })
	if err != nil {
		return fmt.Errorf("AllGather %v: %w", dt, err)
	}
	k.checks++
	if want := strings.Join(stringsOf(ins), ""); string(out) != want {
		return fmt.Errorf("AllGather %v: the gathered bytes differ from the ranks' inputs", dt)
	}
	return nil
}

func stringsOf(b [][]byte) []string {
	s := make([]string, len(b))
	for i := range b {
		s[i] = string(b[i])
	}
	return s
}

func (k *checker) broadcast(dt comm.DataType) error {
	n, r := k.c.Size(), k.c.Rank()
	root := n - 1
	ins := k.encoded(dt, comm.Sum, k.n)
	buf, err := k.upload(dt, ins[r])
	if err != nil {
		return err
	}
	defer buf.Free()
	out, err := k.do(buf, buf,
		func(s, r comm.Buffer) error { return k.c.Broadcast(k.ctx, s, r, root) },
		func(s, r comm.Buffer) *comm.Request { return k.c.BroadcastAsync(s, r, root) })
	if err != nil {
		return fmt.Errorf("Broadcast %v: %w", dt, err)
	}
	k.checks++
	if string(out) != string(ins[root]) {
		return fmt.Errorf("Broadcast %v in place from rank %d: wrong bytes", dt, root)
	}
	return nil
}

func (k *checker) reduce(dt comm.DataType) error {
	r := k.c.Rank()
	const root = 0
	ins := k.encoded(dt, comm.Max, k.n)
	// The non-roots' receive buffers must stay as they were.
	marker := bytes.Repeat([]byte{0x5A}, len(ins[0]))
	out, err := k.exchange(dt, ins[r], marker,
		func(s, r comm.Buffer) error { return k.c.Reduce(k.ctx, s, r, comm.Max, root) },
		func(s, r comm.Buffer) *comm.Request { return k.c.ReduceAsync(s, r, comm.Max, root) })
	if err != nil {
		return fmt.Errorf("Reduce %v: %w", dt, err)
	}
	k.checks++
	if r != root {
		if string(out) != string(marker) {
			return fmt.Errorf("Reduce %v: a non-root's receive buffer changed", dt)
		}
		return nil
	}
	return compare("Reduce", dt, comm.Max, out, ins, k.n)
}

// allToAll sends block p of this rank's input to rank p.
func (k *checker) allToAll(dt comm.DataType) error {
	n, r := k.c.Size(), k.c.Rank()
	ins := k.encoded(dt, comm.Sum, k.n*n)
	out, err := k.exchange(dt, ins[r], make([]byte, len(ins[r])),
		func(s, rb comm.Buffer) error { return k.c.AllToAll(k.ctx, s, rb) },
		func(s, rb comm.Buffer) *comm.Request { return k.c.AllToAllAsync(s, rb) })
	if err != nil {
		return fmt.Errorf("AllToAll %v: %w", dt, err)
	}
	k.checks++
	blk := k.n * dt.Size()
	for p := range n {
		if string(out[p*blk:(p+1)*blk]) != string(ins[p][r*blk:(r+1)*blk]) {
			return fmt.Errorf("AllToAll %v: block %d is not block %d of rank %d's input", dt, p, r, p)
		}
	}
	return nil
}

// gather collects every rank's input at the root; the other ranks'
// receive buffers stay as they were.
func (k *checker) gather(dt comm.DataType) error {
	n, r := k.c.Size(), k.c.Rank()
	root := 1 % n
	ins := k.encoded(dt, comm.Sum, k.n)
	marker := bytes.Repeat([]byte{0x5A}, n*len(ins[0]))
	out, err := k.exchange(dt, ins[r], marker,
		func(s, rb comm.Buffer) error { return k.c.Gather(k.ctx, s, rb, root) },
		func(s, rb comm.Buffer) *comm.Request { return k.c.GatherAsync(s, rb, root) })
	if err != nil {
		return fmt.Errorf("Gather %v: %w", dt, err)
	}
	k.checks++
	want := string(marker)
	if r == root {
		want = strings.Join(stringsOf(ins), "")
	}
	if string(out) != want {
		return fmt.Errorf("Gather %v to rank %d: wrong bytes on rank %d", dt, root, r)
	}
	return nil
}

// scatter sends block p of the root's input to rank p.
func (k *checker) scatter(dt comm.DataType) error {
	n, r := k.c.Size(), k.c.Rank()
	root := n / 2
	ins := k.encoded(dt, comm.Sum, k.n*n)
	out, err := k.exchange(dt, ins[r], make([]byte, k.n*dt.Size()),
		func(s, rb comm.Buffer) error { return k.c.Scatter(k.ctx, s, rb, root) },
		func(s, rb comm.Buffer) *comm.Request { return k.c.ScatterAsync(s, rb, root) })
	if err != nil {
		return fmt.Errorf("Scatter %v: %w", dt, err)
	}
	k.checks++
	blk := k.n * dt.Size()
	if string(out) != string(ins[root][r*blk:(r+1)*blk]) {
		return fmt.Errorf("Scatter %v from rank %d: wrong bytes on rank %d", dt, root, r)
	}
	return nil
}

// sendRecv sends this rank's input to the next rank and receives the
// previous rank's.
func (k *checker) sendRecv(dt comm.DataType) error {
	n, r := k.c.Size(), k.c.Rank()
	ins := k.encoded(dt, comm.Sum, k.n)
	out, err := k.exchange(dt, ins[r], make([]byte, len(ins[r])),
		func(s, rb comm.Buffer) error {
			return k.c.Group(k.ctx, comm.SendBuffer((r+1)%n, s), comm.RecvBuffer((r-1+n)%n, rb))
		},
		func(s, rb comm.Buffer) *comm.Request {
			return k.c.GroupAsync(comm.SendBuffer((r+1)%n, s), comm.RecvBuffer((r-1+n)%n, rb))
		})
	if err != nil {
		return fmt.Errorf("Send/Recv %v: %w", dt, err)
	}
	k.checks++
	if string(out) != string(ins[(r-1+n)%n]) {
		return fmt.Errorf("Send/Recv %v: wrong bytes from rank %d", dt, (r-1+n)%n)
	}
	return nil
}

// bench times a device-to-device copy and the device all-reduce of the
// same bytes in the same run. The copy is timed twice: by each rank alone
// (the others wait), which is the GPU's copy bandwidth, and by every rank
// at once, which shares the GPU(s) as the all-reduce's ranks do. Ranks on
// one GPU share its memory: an all-reduce of N bytes between n of them
// must read and write n*N bytes there, a copy N, so its bus bandwidth is
// at most 2(n-1)/n^2 of the lone copy's (50% for 2 ranks) and about 2(n-1)/n
// of the shared copy's.
func (k *checker) bench(bytes, iters int) error {
	count := bytes / 4
	a, err := k.dev.Alloc(comm.Float32, count)
	if err != nil {
		return err
	}
	defer a.Free()
	b, err := k.dev.Alloc(comm.Float32, count)
	if err != nil {
		return err
	}
	defer b.Free()
	copyOnce := func() error { return k.dev.Copy(b, a) }
	var alone time.Duration
	for r := 0; r < k.c.Size(); r++ {
		if err := k.c.Barrier(k.ctx); err != nil {
			return err
		}
		if r == k.c.Rank() {
			if alone, err = timeIt(iters, copyOnce); err != nil {
				return err
			}
		}
	}
	if err := k.c.Barrier(k.ctx); err != nil {
		return err
	}
	shared, err := timeIt(iters, copyOnce)
	if err != nil {
		return err
	}
	if err := k.c.Barrier(k.ctx); err != nil {
		return err
	}
	arTime, err := timeIt(iters, func() error { return k.c.AllReduce(k.ctx, a, b, comm.Sum) })
	if err != nil {
		return err
	}
	n := float64(k.c.Size())
	gbs := func(t time.Duration) float64 { return float64(bytes) / t.Seconds() / 1e9 }
	busBW := gbs(arTime) * 2 * (n - 1) / n
	fmt.Printf("devcheck: rank %d: %d bytes: device copy alone %.1f GB/s (%v), on every rank at once %.1f GB/s (%v); "+
		"all_reduce %v, busbw %.1f GB/s = %.0f%% of the copy alone, %.0f%% of the copy at once\n",
		k.c.Rank(), bytes, gbs(alone), alone, gbs(shared), shared, arTime, busBW, 100*busBW/gbs(alone), 100*busBW/gbs(shared))
	return nil
}

// latency times back-to-back all-reduces and all-gathers of 8 B to 64 KiB
// (float32; all-gather: each rank's input) on a stream, each size two ways in the same run: buffers bound
// to the stream but not registered (each call holds the stream and runs a
// host round), and views of a window every rank registered (each call is
// queued on the stream, the devices wait on flags). Per call: the time of
// iters calls and one stream synchronize, over iters (at least 100), the
// median of 5 such rounds; for the stream-ordered calls also the host's
// share, the time of the iters calls alone (queueing), in the same rounds.
func (k *checker) latency(iters int) error {
	iters = max(iters, 100)
	n := k.c.Size()
	const maxBytes = 64 << 10
	st, err := k.dev.NewStream()
	if err != nil {
		return err
	}
	defer st.Close()
	plain, err := k.dev.Alloc(comm.Uint8, 2*n*maxBytes)
	if err != nil {
		return err
	}
	defer plain.Free()
	arena, err := k.dev.Alloc(comm.Uint8, 2*n*maxBytes)
	if err != nil {
		return err
	}
	defer arena.Free()
	w, err := k.c.RegisterDevice(k.ctx, arena)
	if err != nil {
		return fmt.Errorf("RegisterDevice: %w", err)
	}
	defer w.Deregister()
	bufs := func(mem *gpu.Buffer, inBytes, outBytes int) (in, out *gpu.StreamBuffer, err error) {
		vi, err := mem.View(0, comm.Float32, inBytes/4)
		if err != nil {
			return nil, nil, err
		}
		vo, err := mem.View(n*maxBytes, comm.Float32, outBytes/4)
		if err != nil {
			return nil, nil, err
		}
		if in, err = vi.OnStream(st); err != nil {
			return nil, nil, err
		}
		out, err = vo.OnStream(st)
		return in, out, err
	}
	for _, coll := range []string{"all_reduce", "all_gather"} {
		for _, size := range []int{8, 128, 1 << 10, 8 << 10, maxBytes} {
			var per [2]time.Duration
			var queued []time.Duration
			for i, mem := range []*gpu.Buffer{plain, arena} {
				outBytes := size
				if coll == "all_gather" {
					outBytes = n * size
				}
				in, out, err := bufs(mem, size, outBytes)
				if err != nil {
					return err
				}
				call := func() error {
					if coll == "all_reduce" {
						return k.c.AllReduce(k.ctx, in, out, comm.Sum)
					}
					return k.c.AllGather(k.ctx, in, out)
				}
				if err := k.c.Barrier(k.ctx); err != nil {
					return err
				}
				queued = queued[:0]
				round := func() error {
					t0 := time.Now()
					for range iters {
						if err := call(); err != nil {
							return err
						}
					}
					queued = append(queued, time.Since(t0))
					return st.Synchronize()
				}
				t, err := timeIt(5, round)
				if err != nil {
					return fmt.Errorf("%s of %d bytes: %w", coll, size, err)
				}
				per[i] = t / time.Duration(iters)
			}
			q := median(queued) / time.Duration(iters)
			fmt.Printf("devcheck: rank %d: latency %s %d B: stream held %.2f us, stream-ordered %.2f us (queueing %.2f us of it)\n",
				k.c.Rank(), coll, size, us(per[0]), us(per[1]), us(q))
		}
	}
	return nil
}

// timeIt returns the median time of f over iters runs after one warm-up.
func timeIt(iters int, f func() error) (time.Duration, error) {
	if err := f(); err != nil {
		return 0, err
	}
	ts := make([]time.Duration, iters)
	for i := range ts {
		t0 := time.Now()
		if err := f(); err != nil {
			return 0, err
		}
		ts[i] = time.Since(t0)
	}
	return median(ts), nil
}

// median sorts ts and returns its middle element.
func median(ts []time.Duration) time.Duration {
	slices.Sort(ts)
	return ts[len(ts)/2]
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
