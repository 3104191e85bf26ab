// Command gccl-p2pbench measures the p2p agent the way nixlbench measures
// NIXL: block-size and batch-size sweeps of READ or WRITE requests, from
// DRAM to DRAM (a second process on this host, started by the tool) or to a
// FILE, reporting bandwidth, the average and p99 latency of preparing and
// posting a request, and the average, median and p99 of completing it.
//
// -backend rdma moves the bytes with RDMA READ/WRITE between the two
// processes through this host's RDMA device (as between hosts; shared
// memory and process_vm off), to compare with perftest's ib_write_bw and
// ib_read_bw on the same device:
//
//	gccl-p2pbench -op write -target dram -backend rdma -b 1M -e 64M -f 4
//
//	gccl-p2pbench -op write -target shm -b 4K -e 64M -f 4 -batch 1,32
//	gccl-p2pbench -op read -target file -file /work/bench.dat -direct -qd 4 -bs 1M -b 1M -e 1M
//
// The file case nixlbench's POSIX backend was compared on (one request of
// 16 descriptors of 64 KiB, all 16 in flight, O_DIRECT); the agent's file
// blocks go through io_uring, or with GCCL_P2P_IOURING_DISABLE=1 through
// the pread/pwrite goroutine pool:
//
//	gccl-p2pbench -op write -target file -file /work/bench.dat -direct -qd 16 -bs 64K -b 64K -e 64K -batch 16
//
// -target dram: the other process's heap (process_vm_writev, or tcp with
// GCCL_P2P_PVM_DISABLE=1); shm: its shared region (Agent.Alloc); file: a
// file of this process (the file backend). GCCL_SHM_DISABLE=1 sends
// everything between processes over tcp.
//
// -gpu measures VRAM transfers instead, each against the raw driver call
// in the same run: host->device and device->host through the agent (a
// DRAM region and a VRAM region of this process) against a pinned
// cuMemcpy of the same size, and VRAM->VRAM over cudaipc into a second
// process against a device-to-device copy within this one:
//
//	gccl-p2pbench -gpu -dev 0 -b 1M -e 256M -f 4 -n 20
//
// Without a CUDA driver -gpu fails with an error that says so
// (ErrNotSupported).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gccl/gccl/internal/units"
	"github.com/gccl/gccl/p2p"
)

const roleEnv = "GCCL_P2PBENCH_TARGET"

type options struct {
	op                 p2p.Op
	target             string
	minSize, maxSize   int
	factor             int
	batches            []int
	iters, warmup      int
	maxBytes           int
	file               string
	direct             bool
	queueDepth, blockB int
	backend            p2p.Backend
	check              bool
	reverse            bool
	gpu                bool
	dev                int
	notif              bool
	notifPoll          time.Duration
}

func main() {
	if os.Getenv(roleEnv) != "" {
		if err := target(); err != nil {
			fmt.Fprintln(os.Stderr, "gccl-p2pbench target:", err)
			os.Exit(1)
		}
		return
	}
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "gccl-p2pbench:", err)
		os.Exit(2)
	}
	run := run
	if o.gpu {
		run = runGPU
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "gccl-p2pbench:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (*options, error) {
	fs := flag.NewFlagSet("gccl-p2pbench", flag.ContinueOnError)
	op := fs.String("op", "write", "read or write")
	tgt := fs.String("target", "shm", "dram (peer's heap), shm (peer's shared region) or file (a file of this process)")
	b := fs.String("b", "4K", "smallest block size")
	e := fs.String("e", "64M", "largest block size")
	f := fs.Int("f", 4, "block size factor between steps")
	batch := fs.String("batch", "1", "descriptors per request, comma-separated")
	iters := fs.Int("n", 20, "timed iterations per point")
	warmup := fs.Int("w", 3, "warm-up iterations per point")
	maxBytes := fs.String("max", "256M", "skip points whose request exceeds this many bytes")
	file := fs.String("file", "", "file for -target file (created; on a file system with O_DIRECT for -direct)")
	direct := fs.Bool("direct", false, "O_DIRECT for -target file")
	qd := fs.Int("qd", p2p.DefaultFileQueueDepth, "file queue depth")
	bs := fs.String("bs", "1M", "file block size")
	backend := fs.String("backend", "auto", "force a backend: auto, shm, pvm, tcp, rdma")
	check := fs.Bool("check", true, "check the data after each point")
	reverse := fs.Bool("reverse", true, "lay the target's descriptors out in reverse order, so that they do not merge")
	gpu := fs.Bool("gpu", false, "measure VRAM: host<->device through the agent against raw pinned copies, cudaipc against a local device copy")
	dev := fs.Int("dev", 0, "CUDA device for -gpu")
	notif := fs.Bool("notif", false, "send a notification with every request (as nixlbench does)")
	notifPoll := fs.Duration("notif-poll", 0, "with -notif: the target takes notifications with GetNotifs every this long, as a server's step loop would, instead of sleeping in WaitNotifs")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o := &options{target: *tgt, factor: *f, iters: *iters, warmup: *warmup, file: *file, direct: *direct, queueDepth: *qd, check: *check, reverse: *reverse,
		gpu: *gpu, dev: *dev, notif: *notif, notifPoll: *notifPoll}
	switch *op {
	case "read":
		o.op = p2p.Read
	case "write":
		o.op = p2p.Write
	default:
		return nil, fmt.Errorf("-op %q: read or write", *op)
	}
	var err error
	if o.minSize, err = parseSize(*b); err != nil {
		return nil, err
	}
	if o.maxSize, err = parseSize(*e); err != nil {
		return nil, err
	}
	if o.maxBytes, err = parseSize(*maxBytes); err != nil {
		return nil, err
	}
	if o.blockB, err = parseSize(*bs); err != nil {
		return nil, err
	}
	for _, s := range strings.Split(*batch, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-batch %q: positive integers", *batch)
		}
		o.batches = append(o.batches, n)
	}
	switch *backend {
	case "auto":
	case "shm":
		o.backend = p2p.BackendSHM
	case "pvm":
		o.backend = p2p.BackendPVM
	case "tcp":
		o.backend = p2p.BackendTCP
	case "rdma":
		o.backend = p2p.BackendRDMA
	default:
		return nil, fmt.Errorf("-backend %q", *backend)
	}
	switch {
	case o.gpu && o.dev < 0:
		return nil, fmt.Errorf("-dev %d", o.dev)
	case o.target != "dram" && o.target != "shm" && o.target != "file":
		return nil, fmt.Errorf("-target %q: dram, shm or file", o.target)
	case o.target == "file" && o.file == "":
		return nil, errors.New("-target file needs -file")
	case o.backend == p2p.BackendRDMA && o.target != "dram":
		return nil, errors.New("-backend rdma needs -target dram")
	case o.minSize < 1 || o.maxSize < o.minSize || o.factor < 2:
		return nil, errors.New("need 1 <= -b <= -e and -f >= 2")
	case o.iters < 1 || o.warmup < 0:
		return nil, errors.New("need -n >= 1 and -w >= 0")
	case o.notifPoll < 0 || o.notifPoll > 0 && !o.notif:
		return nil, errors.New("-notif-poll takes a positive duration, with -notif")
	}
	return o, nil
}

// parseSize reads 4096, 4K, 1.5M, 2G (units.ParseBytes).
func parseSize(s string) (int, error) {
	n, err := units.ParseBytes(s, math.MaxInt64/2)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", s, err)
	}
	return int(n), nil
}

// points are the (block, batch) pairs to measure.
func (o *options) points() [][2]int {
	var pts [][2]int
	for blk := o.minSize; blk <= o.maxSize; blk *= o.factor {
		for _, bt := range o.batches {
			if bt <= o.maxBytes/blk {
				pts = append(pts, [2]int{blk, bt})
			}
		}
		if blk > o.maxSize/o.factor { // the next step would pass -e, or overflow
			break
		}
	}
	return pts
}

func (o *options) regionSize() int {
	n := 0
	for _, p := range o.points() {
		n = max(n, p[0]*p[1])
	}
	return n
}

func run(o *options) error {
	size := o.regionSize()
	if size == 0 {
		return errors.New("no point fits under -max")
	}
	if o.backend == p2p.BackendRDMA {
		// Both processes (the target inherits them): RDMA on one host, as
		// between two, with nothing faster in the way.
		os.Setenv("GCCL_P2P_RDMA_SAME_HOST", "1")
		os.Setenv("GCCL_SHM_DISABLE", "1")
		os.Setenv("GCCL_P2P_PVM_DISABLE", "1")
	}
	a, err := p2p.New("initiator", p2p.Config{FileQueueDepth: o.queueDepth, FileBlockSize: o.blockB, ListenAddr: "127.0.0.1:0"})
	if err != nil {
		return err
	}
	defer a.Close()
	peer, remote, cleanup, err := setupTarget(a, o, size)
	if err != nil {
		return err
	}
	defer cleanup()
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = byte(i*13 + i>>12)
	}
	lr, err := a.RegisterMem(buf)
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	fmt.Printf("# gccl-p2pbench %v to %s (%s) on %s, %d iterations after %d warm-up\n", o.op, o.target, peer, host, o.iters, o.warmup)
	if o.backend == p2p.BackendRDMA {
		dev, err := a.RDMADevice()
		if err != nil {
			return fmt.Errorf("-backend rdma: %w", err)
		}
		fmt.Printf("# RDMA device %s\n", dev)
	}
	fmt.Printf("# %10s %6s %12s %8s %9s %9s %9s %9s %9s %9s %9s  %s\n", "block", "batch", "bytes", "GB/s", "prep_avg", "prep_p99", "post_avg", "post_p99", "xfer_avg", "xfer_p50", "xfer_p99", "backend")
	ctx := context.Background()
	for _, pt := range o.points() {
		blk, batch := pt[0], pt[1]
		local, rem := make([]p2p.Desc, batch), make([]p2p.Desc, batch)
		for i := range batch {
			local[i] = lr.Desc(uint64(i*blk), uint64(blk))
			// Reverse order on the target, so that descriptors do not merge
			// and the batch costs what it says.
			j := i
			if o.reverse {
				j = batch - 1 - i
			}
			rem[i] = remote(uint64(j*blk), uint64(blk))
		}
		ll, err := a.PrepareLocal(p2p.DescList{Type: p2p.DRAM, Descs: local})
		if err != nil {
			return err
		}
		typ := p2p.DRAM
		if o.target == "file" {
			typ = p2p.FILE
		}
		rl, err := a.PrepareRemote(peer, p2p.DescList{Type: typ, Descs: rem})
		if err != nil {
			return err
		}
		var prep, post, xfer []time.Duration
		var backend p2p.Backend
		ropts := p2p.RequestOptions{Backend: o.backend}
		if o.notif {
			ropts.Notif = []byte("p2pbench")
		}
		for it := 0; it < o.warmup+o.iters; it++ {
			t0 := time.Now()
			req, err := a.MakeRequest(o.op, ll, nil, rl, nil, &ropts)
			if err != nil {
				return err
			}
			t1 := time.Now()
			if _, err := req.Post(); err != nil {
				return err
			}
			t2 := time.Now()
			if err := req.Wait(ctx); err != nil {
				return err
			}
			t3 := time.Now()
			backend = req.Backend()
			req.Release()
			if it >= o.warmup {
				prep, post, xfer = append(prep, t1.Sub(t0)), append(post, t2.Sub(t1)), append(xfer, t3.Sub(t1))
			}
		}
		if o.check && o.op == p2p.Write {
			// Read back into a scratch buffer and compare.
			if err := verify(a, rl, buf[:blk*batch], blk, batch); err != nil {
				return fmt.Errorf("block %d batch %d: %w", blk, batch, err)
			}
		}
		ll.Release()
		rl.Release()
		bytes := float64(blk * batch)
		fmt.Printf("  %10d %6d %12d %8.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f  %v\n", blk, batch, blk*batch,
			bytes/avg(xfer).Seconds()/1e9, us(avg(prep)), us(p99(prep)), us(avg(post)), us(p99(post)), us(avg(xfer)), us(pct(xfer, 50)), us(pct(xfer, 99)), backend)
	}
	return nil
}

// verify reads the target's bytes back and compares them with what was
// written (the reversed layout included).
func verify(a *p2p.Agent, rl *p2p.PreparedList, want []byte, blk, batch int) error {
	got := make([]byte, len(want))
	gr, err := a.RegisterMem(got)
	if err != nil {
		return err
	}
	defer a.DeregisterMem(gr)
	descs := make([]p2p.Desc, batch)
	for i := range batch {
		descs[i] = gr.Desc(uint64(i*blk), uint64(blk))
	}
	gl, err := a.PrepareLocal(p2p.DescList{Type: p2p.DRAM, Descs: descs})
	if err != nil {
		return err
	}
	defer gl.Release()
	req, err := a.MakeRequest(p2p.Read, gl, nil, rl, nil, nil)
	if err != nil {
		return err
	}
	defer req.Release()
	req.Post()
	if err := req.Wait(context.Background()); err != nil {
		return err
	}
	if !slices.Equal(got, want) {
		return errors.New("data read back differs from data written")
	}
	return nil
}

// setupTarget makes the target: a FILE region here, or a second process
// whose region's descriptors remote builds.
func setupTarget(a *p2p.Agent, o *options, size int) (string, func(off, n uint64) p2p.Desc, func(), error) {
	if o.target == "file" {
		fr, err := a.RegisterFile(o.file, p2p.FileOptions{Length: int64(size), Create: true, Direct: o.direct})
		if err != nil {
			return "", nil, nil, err
		}
		return a.Name(), fr.Desc, func() { a.DeregisterMem(fr) }, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", nil, nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), roleEnv+"=1", "GCCL_P2PBENCH_SIZE="+strconv.Itoa(size), "GCCL_P2PBENCH_KIND="+o.target,
		"GCCL_P2PBENCH_DEV="+strconv.Itoa(o.dev), "GCCL_P2PBENCH_NOTIF_POLL="+o.notifPoll.String())
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		return "", nil, nil, err
	}
	stop := func() { in.Close(); cmd.Wait() }
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		stop()
		return "", nil, nil, fmt.Errorf("target process: %w", err)
	}
	f := strings.Fields(line)
	if len(f) < 3 || len(f) > 4 || f[0] != "TARGET" {
		stop()
		return "", nil, nil, fmt.Errorf("target process said %q", line)
	}
	base, _ := strconv.ParseUint(f[2], 10, 64)
	var dev uint64 // VRAM: the target's device
	if len(f) == 4 {
		dev, _ = strconv.ParseUint(f[3], 10, 32)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	peer, err := a.Connect(ctx, f[1]) // metadata over the socket: no store
	if err != nil {
		stop()
		return "", nil, nil, err
	}
	return peer, func(off, n uint64) p2p.Desc { return p2p.Desc{Addr: base + off, Len: n, DevID: uint32(dev)} }, stop, nil
}

// target is the second process: it registers its region, says where it is,
// and serves transfers until its standard input closes.
func target() error {
	size, _ := strconv.Atoi(os.Getenv("GCCL_P2PBENCH_SIZE"))
	a, err := p2p.New("target", p2p.Config{ListenAddr: "127.0.0.1:0"})
	if err != nil {
		return err
	}
	defer a.Close()
	var r *p2p.Region
	switch os.Getenv("GCCL_P2PBENCH_KIND") {
	case "vram":
		dev, _ := strconv.Atoi(os.Getenv("GCCL_P2PBENCH_DEV"))
		ctx, release, err := cudaContext(dev)
		if err != nil {
			return err
		}
		defer release()
		p, err := ctx.Alloc(size)
		if err != nil {
			return err
		}
		defer ctx.Free(p)
		if r, err = a.RegisterVRAM(uint64(p), uint64(size), dev); err != nil {
			return err
		}
		defer a.DeregisterMem(r)
		fmt.Printf("TARGET %s %d %d\n", a.Addr(), r.Addr(), dev)
		io.Copy(io.Discard, os.Stdin)
		return nil
	case "shm":
		r, err = a.Alloc(size)
	default:
		r, err = a.RegisterMem(make([]byte, size))
	}
	if err != nil {
		return err
	}
	fmt.Printf("TARGET %s %d\n", a.Addr(), r.Addr())
	go takeNotifs(a)
	io.Copy(io.Discard, os.Stdin)
	return nil
}

// takeNotifs consumes the target's notifications (-notif) as a server
// would: sleeping in WaitNotifs until they come, or with -notif-poll
// taking them with GetNotifs between the steps of a loop that does other
// work (a sleep here). The two cost the transfer differently: a consumer
// woken for every notification is one more thread to run per request,
// which on a host with few cores takes a core from the transfer
// (docs/P2P.md, "Who takes the notifications").
func takeNotifs(a *p2p.Agent) {
	if every, _ := time.ParseDuration(os.Getenv("GCCL_P2PBENCH_NOTIF_POLL")); every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		for range t.C { // until the process ends
			a.GetNotifs()
		}
	}
	for {
		if _, err := a.WaitNotifs(context.Background()); err != nil {
			return
		}
	}
}

func avg(d []time.Duration) time.Duration {
	var s time.Duration
	for _, x := range d {
		s += x
	}
	return s / time.Duration(len(d))
}

func p99(d []time.Duration) time.Duration { return pct(d, 99) }

// pct is the q-th percentile of d (q in [0, 100]).
func pct(d []time.Duration, q int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*q/100)]
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
