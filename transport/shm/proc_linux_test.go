package shm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/gccl/gccl/internal/leakcheck"

	"github.com/gccl/gccl/internal/reduce"
	"github.com/gccl/gccl/transport"
)

// Cross-process tests re-execute the test binary as rank 1 of a two-rank
// job: TestMain sees GCCL_SHM_TEST_CHILD and runs childMain instead of the
// tests. The parent (rank 0) drives the child with commands, one message
// each, whose tag kind says what to do.
const childEnv = "GCCL_SHM_TEST_CHILD"

const (
	cmdEcho             uint8 = iota + 1 // send every message back, until a message of another kind
	cmdSend                              // payload: total bytes (MaxUint64: forever), source size; child streams them
	cmdAddr                              // payload: size; child answers its private buffer's address
	cmdRegion                            // payload: size; child answers the name of a region it fills
	cmdHang                              // child answers, then stops responding
	cmdExit                              // child closes its endpoint and exits 0
	cmdDirty                             // payload: 0 (buffer) or 1 (region), n; child rewrites its first n bytes, then answers
	cmdDirtySend                         // payload: n; child rewrites its buffer's first n bytes, then streams them
	cmdAllReduce                         // payload: size, iterations; child runs that many all-reduces
	cmdAllReduceOneStep                  // the same with allReduce2OneStep
	cmdAllReduceRegions                  // payload: size, iterations; then region names both ways; allReduce2Regions
	cmdData                              // the kind of streamed data
	cmdHello                             // the child's first message
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		if err := childMain(); err != nil {
			fmt.Fprintln(os.Stderr, "shm test child:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	leakcheck.Main(m)
}

// child is the parent's view of a child process.
type child struct {
	cmd  *exec.Cmd
	ep   *Endpoint
	mb   *Mailbox
	dir  string
	s    transport.Sender
	r    transport.Receiver
	out  bytes.Buffer
	seq  uint64
	done bool
}

var childJobs atomic.Int64

// startChild starts rank 1 in a new process and connects to it.
func startChild(tb testing.TB, cfg Config) *child {
	tb.Helper()
	if cfg.Dir == "" {
		cfg.Dir = testDir(tb)
	}
	cfg, _ = cfg.withDefaults()
	job := fmt.Sprintf("t%d-%d", os.Getpid(), childJobs.Add(1))
	mb, err := Create(job, 0, 2, []int{1}, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	c := &child{mb: mb, dir: cfg.Dir}
	c.cmd = exec.Command(exe, "-test.run=^$")
	c.cmd.Env = append(os.Environ(),
		childEnv+"=1",
		"GCCL_SHM_TEST_JOB="+job,
		"GCCL_SHM_TEST_DIR="+cfg.Dir,
		"GCCL_SHM_TEST_PARENT="+strconv.Itoa(os.Getpid()),
		"GCCL_SHM_TEST_SLOTS="+strconv.Itoa(cfg.SlotSize)+"x"+strconv.Itoa(cfg.SlotCount))
	c.cmd.Stdout = &c.out
	c.cmd.Stderr = &c.out
	if err := c.cmd.Start(); err != nil {
		mb.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(c.stop)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	ep, err := mb.Connect(ctx, map[int]Peer{1: {Name: mailboxPath(cfg.Dir, job, 1), Pid: c.cmd.Process.Pid}})
	if err != nil {
		tb.Fatalf("%v; child output: %s", err, c.out.String())
	}
	c.ep = ep
	c.s, _ = ep.Sender(1)
	c.r, _ = ep.Receiver(1)
	// The hello proves the child mapped our mailbox: unlink it.
	if _, tag, err := c.recvInto(nil); err != nil || tag.Kind() != cmdHello {
		tb.Fatalf("no hello from the child: tag %v err %v; output: %s", tag, err, c.out.String())
	}
	mb.Unlink()
	return c
}

// stop ends the child (politely if it still listens) and reaps it.
func (c *child) stop() {
	if !c.done {
		c.command(cmdExit, 0, 0)
	}
	defer func() {
		if c.ep != nil {
			c.ep.Close()
		} else {
			c.mb.Close()
		}
	}()
	if c.cmd.ProcessState != nil {
		return // reaped by the test
	}
	waited := make(chan error, 1)
	go func() { waited <- c.cmd.Wait() }()
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		c.cmd.Process.Kill()
		<-waited
	}
}

func (c *child) command(kind uint8, a, b uint64) error {
	var p [16]byte
	binary.LittleEndian.PutUint64(p[:], a)
	binary.LittleEndian.PutUint64(p[8:], b)
	c.seq++
	if kind == cmdExit {
		c.done = true
	}
	return send(c.ep, 1, p[:], transport.MakeTag(kind, c.seq))
}

func (c *child) recvInto(buf []byte) (int, transport.Tag, error) {
	if buf == nil {
		buf = make([]byte, c.ep.SlotSize())
	}
	return recv(c.ep, 1, buf)
}

// childMain is rank 1: it connects to the parent and serves its commands.
func childMain() error {
	var slotSize, slotCount int
	if _, err := fmt.Sscanf(os.Getenv("GCCL_SHM_TEST_SLOTS"), "%dx%d", &slotSize, &slotCount); err != nil {
		return err
	}
	dir, job := os.Getenv("GCCL_SHM_TEST_DIR"), os.Getenv("GCCL_SHM_TEST_JOB")
	parent, _ := strconv.Atoi(os.Getenv("GCCL_SHM_TEST_PARENT"))
	mb, err := Create(job, 1, 2, []int{0}, Config{SlotSize: slotSize, SlotCount: slotCount, Dir: dir})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	ep, err := mb.Connect(ctx, map[int]Peer{0: {Name: mailboxPath(dir, job, 0), Pid: parent}})
	if err != nil {
		mb.Close()
		return err
	}
	defer ep.Close()
	if err := send(ep, 0, nil, transport.MakeTag(cmdHello, 0)); err != nil {
		return err
	}
	var private []byte
	var region *Region
	defer func() {
		if region != nil {
			region.Close()
		}
	}()
	grow := func(n int) []byte {
		if len(private) < n {
			private = make([]byte, n)
			fill(private, 0)
		}
		return private[:n]
	}
	unlinked := false
	in := make([]byte, slotSize)
	for {
		msg := in
		n, tag, err := recv(ep, 0, msg)
		if err != nil {
			return err
		}
		if !unlinked {
			// The parent's first command proves it mapped our mailbox.
			mb.Unlink()
			unlinked = true
		}
		msg = msg[:n]
		var a, b uint64
		if n >= 16 {
			a, b = binary.LittleEndian.Uint64(msg), binary.LittleEndian.Uint64(msg[8:])
		}
		reply := func(p []byte) error { return send(ep, 0, p, tag) }
		switch tag.Kind() {
		case cmdEcho:
			if err := reply(msg); err != nil {
				return err
			}
		case cmdSend:
			// From a source of b bytes (0: as much as is sent, up to 64 MiB).
			src := int(min(a, 64<<20))
			if b != 0 {
				src = int(b)
			}
			if err := stream(ep, grow(src), a); err != nil {
				return err
			}
		case cmdAddr:
			buf := grow(int(a))
			var p [16]byte
			binary.LittleEndian.PutUint64(p[:], uint64(uintptr(unsafe.Pointer(&buf[0]))))
			binary.LittleEndian.PutUint64(p[8:], a)
			if err := reply(p[:]); err != nil {
				return err
			}
		case cmdRegion:
			if region != nil {
				region.Close()
			}
			if region, err = AllocIn(dir, job, 1, int(a)); err != nil {
				return err
			}
			fill(region.Bytes(), 0)
			if err := reply([]byte(region.Name())); err != nil {
				return err
			}
		case cmdDirty, cmdDirtySend:
			// Write one word per cache line, as a producer that just
			// computed its buffer would leave it: dirty in this core's cache.
			buf, size := private, b
			switch {
			case tag.Kind() == cmdDirtySend:
				size = a
			case a == 1:
				buf = region.Bytes()
			}
			buf = buf[:size]
			for i := 0; i < len(buf); i += cacheLine {
				buf[i]++
			}
			if tag.Kind() == cmdDirtySend {
				err = stream(ep, buf, size)
			} else {
				err = reply(nil)
			}
			if err != nil {
				return err
			}
		case cmdAllReduce, cmdAllReduceOneStep:
			in, out := make([]byte, a), make([]byte, a)
			run := allReduce2
			if tag.Kind() == cmdAllReduceOneStep {
				run = allReduce2OneStep
			}
			for i := uint64(0); i < b; i++ {
				if err := run(ep, 1, in, out); err != nil {
					return err
				}
			}
		case cmdAllReduceRegions:
			if err := serveAllReduceRegions(ep, dir, job, int(a), b, tag); err != nil {
				return err
			}
		case cmdHang:
			if err := reply(nil); err != nil {
				return err
			}
			select {}
		case cmdExit:
			return nil
		default:
			return fmt.Errorf("unknown command %d", tag.Kind())
		}
	}
}

// stream sends total bytes to rank 0 in slot-size pieces copied from src
// (over and over). It stops at the first error: the parent may kill us.
func stream(ep *Endpoint, src []byte, total uint64) error {
	s, _ := ep.Sender(0)
	slot := uint64(ep.SlotSize())
	tag := transport.MakeTag(cmdData, 0)
	off := 0
	var bo backoff
	var deadline time.Time
	for sent := uint64(0); sent < total; {
		n := min(slot, total-sent)
		if off+int(n) > len(src) {
			off = 0
		}
		seen := ep.Seq()
		b, ok, err := s.TryReserve(int(n))
		if err != nil {
			return err
		}
		if !ok {
			if err := wait(ep, seen, &bo, &deadline); err != nil {
				return err
			}
			continue
		}
		bo.Reset()
		deadline = time.Time{}
		copy(b, src[off:])
		s.Commit(tag)
		off += int(n)
		sent += n
	}
	return nil
}

// allReduce2 is a two-rank ring all-reduce of float32 sums, the pattern and
// fused steps comm's executor runs: reduce-scatter (send the peer's half,
// reduce the received piece of our half into out), then all-gather (send our
// reduced half, receive the peer's into out), a slot-size chunk at a time.
func allReduce2(ep *Endpoint, me int, in, out []byte) error {
	peer := 1 - me
	s, _ := ep.Sender(peer)
	r, _ := ep.Receiver(peer)
	sum := reduce.Lookup(reduce.Float32, reduce.Sum)
	half := len(in) / 8 * 4 // float32 elements, halves
	mine, theirs := [2]int{0, half}, [2]int{half, len(in)}
	if me == 1 {
		mine, theirs = theirs, mine
	}
	chunk := ep.SlotSize()
	for phase := 0; phase < 2; phase++ {
		sendLo, sendHi := theirs[0], theirs[1]
		src := in
		if phase == 1 {
			sendLo, sendHi, src = mine[0], mine[1], out
		}
		recvLo, recvHi := mine[0], mine[1]
		if phase == 1 {
			recvLo, recvHi = theirs[0], theirs[1]
		}
		so, ro := sendLo, recvLo
		var bo backoff
		var deadline time.Time
		for so < sendHi || ro < recvHi {
			seen := ep.Seq()
			progress := false
			if so < sendHi {
				n := min(chunk, sendHi-so)
				if b, ok, err := s.TryReserve(n); err != nil {
					return err
				} else if ok {
					copy(b, src[so:so+n])
					s.Commit(transport.Tag(phase))
					so += n
					progress = true
				}
			}
			if ro < recvHi {
				if m, _, ok, err := r.TryNext(); err != nil {
					return err
				} else if ok {
					n := len(m)
					if phase == 0 {
						sum(out[ro:ro+n], m, in[ro:ro+n])
					} else {
						copy(out[ro:ro+n], m)
					}
					r.Release()
					ro += n
					progress = true
				}
			}
			if progress {
				bo.Reset()
				deadline = time.Time{}
			} else if err := wait(ep, seen, &bo, &deadline); err != nil {
				return err
			}
		}
	}
	return nil
}

// allReduce2OneStep is the latency-bound alternative for small buffers
// (at most a slot): both ranks send their whole input at once and reduce
// the peer's into out, one exchange instead of the ring's two.
func allReduce2OneStep(ep *Endpoint, me int, in, out []byte) error {
	peer := 1 - me
	s, _ := ep.Sender(peer)
	r, _ := ep.Receiver(peer)
	sum := reduce.Lookup(reduce.Float32, reduce.Sum)
	sent, recvd := false, false
	var bo backoff
	var deadline time.Time
	for !sent || !recvd {
		seen := ep.Seq()
		if !sent {
			if b, ok, err := s.TryReserve(len(in)); err != nil {
				return err
			} else if ok {
				copy(b, in)
				s.Commit(0)
				sent = true
			}
		}
		if !recvd {
			if m, _, ok, err := r.TryNext(); err != nil {
				return err
			} else if ok {
				// Sum in a fixed order (rank 0's data first) so both ranks
				// get the same bits.
				if me == 0 {
					sum(out, in, m)
				} else {
					sum(out, m, in)
				}
				r.Release()
				recvd = true
				continue
			}
		}
		if !recvd {
			if err := wait(ep, seen, &bo, &deadline); err != nil {
				return err
			}
		}
	}
	return nil
}

// serveAllReduceRegions is the child's side of BenchmarkAllReduce2Regions:
// it makes its in and out regions and sends their names, maps the parent's
// two, then runs iters all-reduces.
func serveAllReduceRegions(ep *Endpoint, dir, job string, size int, iters uint64, tag transport.Tag) error {
	var mine, theirs [2]*Region
	defer func() {
		for _, r := range append(mine[:], theirs[:]...) {
			if r != nil {
				r.Close()
			}
		}
	}()
	var err error
	for i := range mine {
		if mine[i], err = AllocIn(dir, job, 1, size); err != nil {
			return err
		}
		if err := send(ep, 0, []byte(mine[i].Name()), tag); err != nil {
			return err
		}
	}
	buf := make([]byte, ep.SlotSize())
	for i := range theirs {
		n, _, err := recv(ep, 0, buf)
		if err != nil {
			return err
		}
		if theirs[i], err = MapRegion(string(buf[:n]), size); err != nil {
			return err
		}
	}
	for i := uint64(0); i < iters; i++ {
		if err := allReduce2Regions(ep, 1, mine, theirs); err != nil {
			return err
		}
	}
	return nil
}

// allReduce2Regions is the symmetric-memory alternative for large buffers:
// in and out of both ranks are regions that the other rank maps, so each
// rank reduces its half straight from the peer's input and then copies the
// peer's reduced half straight from the peer's output, with no slot copies;
// the rings only carry the barriers between the steps.
func allReduce2Regions(ep *Endpoint, me int, mine, theirs [2]*Region) error {
	in, out := mine[0].Bytes(), mine[1].Bytes()
	peerIn, peerOut := theirs[0].Bytes(), theirs[1].Bytes()
	half := len(in) / 8 * 4
	lo, hi := 0, half // my half
	if me == 1 {
		lo, hi = half, len(in)
	}
	sum := reduce.Lookup(reduce.Float32, reduce.Sum)
	barrier := func() error {
		if err := send(ep, 1-me, nil, 0); err != nil {
			return err
		}
		_, _, err := recv(ep, 1-me, nil)
		return err
	}
	// Both inputs are ready (and the peer is done reading our last out).
	if err := barrier(); err != nil {
		return err
	}
	if me == 0 {
		sum(out[lo:hi], in[lo:hi], peerIn[lo:hi])
	} else {
		sum(out[lo:hi], peerIn[lo:hi], in[lo:hi])
	}
	if err := barrier(); err != nil {
		return err
	}
	// The peer's half of the result, from its out.
	if me == 0 {
		copy(out[hi:], peerOut[hi:])
	} else {
		copy(out[:lo], peerOut[:lo])
	}
	return nil
}

func TestProcessExchange(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	c := startChild(t, Config{SlotSize: 4096, SlotCount: 4})
	// Echo: every size, both directions.
	for i, n := range []int{0, 1, 7, 64, 1000, 4095, 4096} {
		msg := make([]byte, n)
		fill(msg, i)
		tag := transport.MakeTag(cmdEcho, uint64(i))
		if err := send(c.ep, 1, msg, tag); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 4096)
		m, rtag, err := c.recvInto(got)
		if err != nil || m != n || rtag != tag || !check(got[:m], i) {
			t.Fatalf("echo of %d bytes: got %d, tag %x, err %v", n, m, rtag, err)
		}
	}
	// A stream larger than the ring.
	const total = 1<<20 + 123
	if err := c.command(cmdSend, total, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 0, total)
	buf := make([]byte, 4096)
	for len(got) < total {
		n, _, err := c.recvInto(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	want := make([]byte, 1<<20)
	fill(want, 0)
	if !bytes.Equal(got[:1<<20], want) || !bytes.Equal(got[1<<20:], want[:123]) {
		t.Fatal("streamed data corrupt")
	}
	// A region the child made and filled, read here in place.
	if err := c.command(cmdRegion, 1<<16, 0); err != nil {
		t.Fatal(err)
	}
	n, _, err := c.recvInto(buf)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := MapRegion(string(buf[:n]), 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	if !check(reg.Bytes(), 0) {
		t.Fatal("child's region content")
	}
	reg.Close()
	// The child exits cleanly: a clean close, then nothing left.
	if err := c.command(cmdExit, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("child: %v\n%s", err, c.out.String())
	}
	_, _, err = c.recvInto(buf)
	wantPeerClosed(t, err, 1, "")
	if names := dirEntries(t, c.dir); len(names) != 0 {
		t.Fatalf("left in %s: %v", c.dir, names)
	}
}

func TestProcessKilledWhilePeerWaits(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	c := startChild(t, Config{SlotSize: 4096, SlotCount: 4})
	if err := c.command(cmdHang, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.recvInto(nil); err != nil {
		t.Fatal(err)
	}
	c.done = true
	killed := make(chan time.Time, 1)
	go func() {
		time.Sleep(20 * time.Millisecond)
		killed <- time.Now()
		c.cmd.Process.Signal(syscall.SIGKILL)
	}()
	// Wait for a message that never comes: the death must end the wait,
	// with the deadline only a guard against hanging.
	_, _, err := c.recvInto(nil)
	lag := time.Since(<-killed)
	wantPeerClosed(t, err, 1, "exited without closing")
	t.Logf("peer death noticed %v after kill -9 (%v)", lag.Round(time.Millisecond), err)
	if lag > 5*time.Second {
		t.Fatalf("took %v to notice", lag)
	}
	// Sending to the dead rank fails too.
	_, _, err = c.s.TryReserve(1)
	wantPeerClosed(t, err, 1, "")
}

func TestProcessKilledMidTransfer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	c := startChild(t, Config{SlotSize: 4096, SlotCount: 4})
	if err := c.command(cmdSend, math.MaxUint64, 0); err != nil {
		t.Fatal(err)
	}
	c.done = true
	buf := make([]byte, 4096)
	for i := 0; i < 200; i++ {
		if _, _, err := c.recvInto(buf); err != nil {
			t.Fatal(err)
		}
	}
	c.cmd.Process.Signal(syscall.SIGKILL)
	start := time.Now()
	var err error
	drained := 0
	for err == nil {
		_, _, err = c.recvInto(buf)
		drained++
	}
	wantPeerClosed(t, err, 1, "exited without closing")
	t.Logf("peer death noticed %v after kill -9, %d messages drained first", time.Since(start).Round(time.Millisecond), drained-1)
	if drained-1 > 4 {
		t.Fatalf("received %d messages from a ring of 4 slots after the kill", drained-1)
	}
}

func TestChildNoticesParentClose(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	c := startChild(t, Config{SlotSize: 4096, SlotCount: 4})
	// The child waits for a command; our Abort must end it with an error
	// naming rank 0 (exit status 2 and the message on its stderr).
	c.done = true
	c.ep.Abort(errors.New("parent gives up"))
	err := c.cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !bytes.Contains(c.out.Bytes(), []byte("peer rank 0")) ||
		!bytes.Contains(c.out.Bytes(), []byte("parent gives up")) {
		t.Fatalf("child: %v\n%s", err, c.out.String())
	}
}
