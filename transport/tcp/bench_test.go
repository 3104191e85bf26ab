package tcp

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gccl/gccl/internal/leakcheck"

	"github.com/gccl/gccl/internal/reduce"
	"github.com/gccl/gccl/internal/spin"
	"github.com/gccl/gccl/transport"
)

// The benchmarks run rank 1 in a child process (this test binary, started
// again with benchPeerEnv set), so that the two ranks compete for the
// machine's cores the way two real ranks do. Rank 0 drives: it sends a
// control message naming the pattern, size and count, then both ranks run
// it.
//
//	go test -run '^$' -bench . -benchtime 2s ./transport/tcp/
//
// GCCL_TCP_BENCH_SLOT, GCCL_TCP_BENCH_SLOTS and GCCL_TCP_BENCH_STREAMS
// override the slot size, slot count and streams per peer.

const benchPeerEnv = "GCCL_TCP_BENCH_PEER"

func TestMain(m *testing.M) {
	if cfg := os.Getenv(benchPeerEnv); cfg != "" {
		if err := benchPeer(cfg); err != nil {
			fmt.Fprintln(os.Stderr, "bench peer:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(leakcheck.Run(m, benchPairs.closeAll))
}

// Benchmark patterns.
const (
	opQuit byte = iota
	opPingPong
	opAllReduce
	opStream
	opExchange
)

const controlKind = 0xff

func benchConfig() Config {
	get := func(env string, def int) int {
		if v, err := strconv.Atoi(os.Getenv(env)); err == nil {
			return v
		}
		return def
	}
	c := testConfig(get("GCCL_TCP_BENCH_SLOT", DefaultSlotSize), get("GCCL_TCP_BENCH_SLOTS", DefaultSlotCount), get("GCCL_TCP_BENCH_STREAMS", DefaultStreams))
	c.Bell = transport.NewDoorbell()
	return c
}

func configString(c Config) string {
	return fmt.Sprintf("%d,%d,%d", c.SlotSize, c.SlotCount, c.Streams)
}

func parseConfig(s string) (Config, error) {
	var c Config
	if _, err := fmt.Sscanf(s, "%d,%d,%d", &c.SlotSize, &c.SlotCount, &c.Streams); err != nil {
		return c, err
	}
	c2 := testConfig(c.SlotSize, c.SlotCount, c.Streams)
	c2.Bell = transport.NewDoorbell()
	return c2, nil
}

// benchPair is rank 0's endpoint with rank 1 in a child process.
type benchPair struct {
	ep    *Endpoint
	child *exec.Cmd
}

type pairCache struct {
	mu    sync.Mutex
	pairs map[string]*benchPair
}

var benchPairs pairCache

func (pc *pairCache) get(b *testing.B, cfg Config) *Endpoint {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	key := configString(cfg)
	if p := pc.pairs[key]; p != nil {
		return p.ep
	}
	p, err := startPair(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if pc.pairs == nil {
		pc.pairs = map[string]*benchPair{}
	}
	pc.pairs[key] = p
	return p.ep
}

func (pc *pairCache) closeAll() {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	for _, p := range pc.pairs {
		p.close()
	}
	pc.pairs = nil
}

func startPair(cfg Config) (*benchPair, error) {
	l, err := Listen(0, 2, cfg)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), benchPeerEnv+"="+configString(cfg))
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	peerAddr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("bench peer did not start: %w", err)
	}
	fmt.Fprintln(stdin, l.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ep, err := l.Connect(ctx, []int{1}, []string{l.Addr(), strings.TrimSpace(peerAddr)})
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, err
	}
	return &benchPair{ep: ep, child: cmd}, nil
}

func (p *benchPair) close() {
	var ctl [9]byte
	ctl[0] = opQuit
	w := newWaiter(p.ep)
	slot := w.reserve(1, len(ctl))
	copy(slot, ctl[:])
	w.commit(1, transport.MakeTag(controlKind, 0))
	p.child.Wait()
	p.ep.Close()
}

// benchPeer is rank 1, in the child process.
func benchPeer(cfgString string) error {
	cfg, err := parseConfig(cfgString)
	if err != nil {
		return err
	}
	l, err := Listen(1, 2, cfg)
	if err != nil {
		return err
	}
	fmt.Println(l.Addr())
	parent, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ep, err := l.Connect(ctx, []int{0}, []string{strings.TrimSpace(parent), l.Addr()})
	l.Close()
	if err != nil {
		return err
	}
	defer ep.Close()
	w := newWaiter(ep)
	var bufs *allReduceBufs
	for {
		m := w.next(0)
		if len(m) != 9 {
			return fmt.Errorf("control message of %d bytes", len(m))
		}
		op, size, iters := m[0], int(binary.LittleEndian.Uint32(m[1:])), int(binary.LittleEndian.Uint32(m[5:]))
		w.release(0)
		if op == opQuit {
			return nil
		}
		if (op == opAllReduce || op == opExchange) && (bufs == nil || len(bufs.in) != size) {
			bufs = &allReduceBufs{in: make([]byte, size), out: make([]byte, size)}
		}
		runPattern(w, 1, op, size, iters, bufs)
	}
}

// waiter drives an endpoint the way comm's executor does: try, spin
// briefly, then sleep on the bell.
type waiter struct {
	ep        *Endpoint
	senders   []transport.Sender
	receivers []transport.Receiver
	deadline  time.Time
	sleeps    int // times the spin ran out and the rank slept
}

func newWaiter(ep *Endpoint) *waiter {
	w := &waiter{ep: ep, senders: make([]transport.Sender, 2), receivers: make([]transport.Receiver, 2), deadline: time.Now().Add(time.Hour)}
	for p := 0; p < 2; p++ {
		if p != ep.Rank() {
			w.senders[p], _ = ep.Sender(p)
			w.receivers[p], _ = ep.Receiver(p)
		}
	}
	return w
}

func (w *waiter) wait(bo *spin.Backoff, seen uint64) {
	if bo.Spin() {
		return
	}
	w.sleeps++
	if err := w.ep.Wait(context.Background(), seen, w.deadline); err != nil {
		panic(err)
	}
}

func (w *waiter) reserve(peer, n int) []byte {
	var bo spin.Backoff
	for {
		seen := w.ep.Seq()
		b, ok, err := w.senders[peer].TryReserve(n)
		if err != nil {
			panic(err)
		}
		if ok {
			return b
		}
		w.wait(&bo, seen)
	}
}

func (w *waiter) commit(peer int, tag transport.Tag) { w.senders[peer].Commit(tag) }

func (w *waiter) next(peer int) []byte {
	var bo spin.Backoff
	for {
		seen := w.ep.Seq()
		m, _, ok, err := w.receivers[peer].TryNext()
		if err != nil {
			panic(err)
		}
		if ok {
			return m
		}
		w.wait(&bo, seen)
	}
}

func (w *waiter) release(peer int) { w.receivers[peer].Release() }

// allReduceBufs are one rank's buffers for the all-reduce pattern.
type allReduceBufs struct{ in, out []byte }

var sum32 = reduce.Lookup(reduce.Float32, reduce.Sum)

// runPattern runs iters iterations of op with size-byte messages (for the
// all-reduce, a size-byte float32 buffer) as rank `rank` of 2.
func runPattern(w *waiter, rank int, op byte, size, iters int, bufs *allReduceBufs) {
	peer := 1 - rank
	slot := w.ep.SlotSize()
	switch op {
	case opPingPong:
		for i := 0; i < iters; i++ {
			if rank == 0 {
				w.reserve(peer, size)
				w.commit(peer, 1)
				w.next(peer)
				w.release(peer)
			} else {
				w.next(peer)
				w.release(peer)
				w.reserve(peer, size)
				w.commit(peer, 1)
			}
		}
	case opStream:
		for i := 0; i < iters; i++ {
			if rank == 0 {
				w.reserve(peer, size)
				w.commit(peer, 1)
			} else {
				w.next(peer)
				w.release(peer)
			}
		}
		// An acknowledgement, so rank 0's clock covers the delivery.
		if rank == 0 {
			w.next(peer)
			w.release(peer)
		} else {
			w.reserve(peer, 0)
			w.commit(peer, 1)
		}
	case opExchange:
		// One-step all-reduce for small buffers: send all of it, reduce what
		// the peer sent into the output.
		for i := 0; i < iters; i++ {
			s := w.reserve(peer, size)
			copy(s, bufs.in)
			w.commit(peer, 3)
			m := w.next(peer)
			sum32(bufs.out, m, bufs.in)
			w.release(peer)
		}
	case opAllReduce:
		for i := 0; i < iters; i++ {
			allReduce2(w, rank, bufs, slot)
		}
	}
}

// allReduce2 is a two-rank ring all-reduce (reduce-scatter then
// all-gather) with the executor's fused steps, chunk by chunk: send the
// peer's block; receive my block, reduce it into an outgoing slot, send it
// back and keep a copy; receive the peer's reduced block.
func allReduce2(w *waiter, rank int, b *allReduceBufs, slot int) {
	peer := 1 - rank
	half := len(b.in) / 2 &^ 3
	blocks := [2][2]int{{0, half}, {half, len(b.in)}}
	mine, theirs := blocks[rank], blocks[peer]
	chunk := slot &^ 3
	longest := max(mine[1]-mine[0], theirs[1]-theirs[0])
	for off := 0; off < longest; off += chunk {
		span := func(blk [2]int) (int, int) {
			lo := min(blk[0]+off, blk[1])
			return lo, min(lo+chunk, blk[1])
		}
		tlo, thi := span(theirs)
		if thi > tlo {
			s := w.reserve(peer, thi-tlo)
			copy(s, b.in[tlo:thi])
			w.commit(peer, 1)
		}
		mlo, mhi := span(mine)
		if mhi > mlo {
			m := w.next(peer)
			s := w.reserve(peer, mhi-mlo)
			sum32(s, m, b.in[mlo:mhi])
			w.release(peer)
			w.commit(peer, 2)
			copy(b.out[mlo:mhi], s)
		}
		if thi > tlo {
			m := w.next(peer)
			copy(b.out[tlo:thi], m)
			w.release(peer)
		}
	}
}

// drive runs a pattern on both ranks and times rank 0's side.
func drive(b *testing.B, op byte, size int) {
	cfg := benchConfig()
	ep := benchPairs.get(b, cfg)
	w := newWaiter(ep)
	var bufs *allReduceBufs
	if op == opAllReduce || op == opExchange {
		bufs = &allReduceBufs{in: make([]byte, size), out: make([]byte, size)}
	}
	run := func(iters int) {
		ctl := w.reserve(1, 9)
		ctl[0] = op
		binary.LittleEndian.PutUint32(ctl[1:], uint32(size))
		binary.LittleEndian.PutUint32(ctl[5:], uint32(iters))
		w.commit(1, transport.MakeTag(controlKind, 0))
		runPattern(w, 0, op, size, iters, bufs)
	}
	run(min(b.N, 20)) // warm-up: buffers, page faults, TCP windows
	w.sleeps = 0
	b.ResetTimer()
	run(b.N)
	b.StopTimer()
	// How often rank 0 ran out of spinning and slept: sleeping costs tens
	// of µs on a VM, so a high rate explains a slow figure.
	b.ReportMetric(float64(w.sleeps)/float64(b.N), "sleeps/op")
}

var benchSizes = []int{8, 4 << 10, 64 << 10, 1 << 20}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return strconv.Itoa(n>>20) + "MiB"
	case n >= 1<<10:
		return strconv.Itoa(n>>10) + "KiB"
	}
	return strconv.Itoa(n) + "B"
}

// BenchmarkPingPong: one op is a round trip of a size-byte message; the
// one-way latency is half of it.
func BenchmarkPingPong(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(sizeName(n), func(b *testing.B) {
			if n > benchConfig().SlotSize {
				b.Skip("message larger than a slot")
			}
			drive(b, opPingPong, n)
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/2, "µs/one-way")
		})
	}
}

// BenchmarkAllReduce2: one op is a two-rank float32 sum all-reduce of size
// bytes through the transport, as comm's ring would run it (busbw equals
// algbw for two ranks).
func BenchmarkAllReduce2(b *testing.B) {
	sizes := append(benchSizes, 16<<20, 256<<20)
	for _, n := range sizes {
		b.Run(sizeName(n), func(b *testing.B) {
			if n > 16<<20 && testing.Short() {
				b.Skip("large size in -short mode")
			}
			b.SetBytes(int64(n))
			drive(b, opAllReduce, n)
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/op")
		})
	}
}

// BenchmarkExchange2: one op is a two-rank all-reduce done in one step, as
// a tuner would for small buffers: each rank sends its whole buffer and
// reduces the peer's into its output.
func BenchmarkExchange2(b *testing.B) {
	for _, n := range []int{8, 4 << 10, 64 << 10} {
		b.Run(sizeName(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			drive(b, opExchange, n)
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/op")
		})
	}
}

// BenchmarkStream: one op is one size-byte message, sent back to back in
// one direction.
func BenchmarkStream(b *testing.B) {
	for _, n := range []int{64 << 10, benchConfig().SlotSize} {
		b.Run(sizeName(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			drive(b, opStream, n)
		})
	}
}
