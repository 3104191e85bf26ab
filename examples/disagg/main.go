// Command disagg is disaggregated serving in miniature, on the p2p agent.
//
//	go run ./examples/disagg
//
// runs both roles: this process is the decode worker, and it starts the
// prefill worker as a second process. Prefill computes the KV cache one
// layer at a time and WRITEs each layer into decode's KV region as soon as
// it is ready, with a notification per layer; decode checks each layer as
// its notification arrives, while later layers are still being computed and
// sent. Then decode offloads its KV blocks to a file, clears them, reads
// them back and checks every byte again. The exit status is non-zero if any
// byte is wrong or anything fails.
//
// -tcp sends the layers over tcp instead of shared memory (as between hosts); -rdma over RDMA
// (READ/WRITE straight between the regions: the prefill process on this host uses the NIC as
// another host would; without a device, or with GCCL_P2P_RDMA_DISABLE=1, it says why and
// uses tcp); -dir picks where the offload file goes (O_DIRECT with -direct, on a file system
// that has it).
//
// Across two hosts, run the roles apart (the shapes must agree):
//
//	disagg -role decode -listen 10.0.0.1:7400 -rdma     # waits for prefill
//	disagg -role prefill -connect 10.0.0.1:7400 -rdma
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gccl/gccl/p2p"
)

const roleEnv = "DISAGG_ROLE"

// Config is the model's shape and the run's settings.
type Config struct {
	Layers, Blocks, BlockSize int
	TCP, RDMA, Direct         bool
	Dir                       string
	Compute                   time.Duration // simulated prefill time per layer
	// Listen: decode listens here and waits for a prefill process started
	// elsewhere (another host) instead of starting one.
	Listen string
}

func main() {
	if os.Getenv(roleEnv) == "prefill" {
		if err := prefillFromEnv(); err != nil {
			fmt.Fprintln(os.Stderr, "prefill:", err)
			os.Exit(1)
		}
		return
	}
	var c Config
	flag.IntVar(&c.Layers, "layers", 32, "model layers")
	flag.IntVar(&c.Blocks, "blocks", 16, "KV blocks per layer")
	flag.IntVar(&c.BlockSize, "block", 64<<10, "bytes per KV block")
	flag.BoolVar(&c.TCP, "tcp", false, "send layers over tcp (GCCL_SHM_DISABLE=1) instead of shared memory")
	flag.BoolVar(&c.RDMA, "rdma", false, "send layers over RDMA (tcp, saying why, without a device)")
	role := flag.String("role", "", "decode or prefill: run one role, the other on another host (-listen, -connect)")
	flag.StringVar(&c.Listen, "listen", "", "decode's address, with -role decode")
	connect := flag.String("connect", "", "decode's address, with -role prefill")
	flag.BoolVar(&c.Direct, "direct", false, "O_DIRECT for the offload file")
	flag.StringVar(&c.Dir, "dir", os.TempDir(), "directory of the offload file")
	flag.DurationVar(&c.Compute, "compute", 2*time.Millisecond, "simulated prefill compute per layer")
	flag.Parse()
	var err error
	switch *role {
	case "", "decode":
		if *role == "decode" && c.Listen == "" {
			err = errors.New("-role decode needs -listen")
			break
		}
		err = Decode(c, os.Stdout)
	case "prefill":
		c.setEnv()
		var b p2p.Backend
		if b, err = Prefill(c, *connect); err == nil {
			fmt.Printf("prefill: done over %v\n", b)
		}
	default:
		err = fmt.Errorf("-role %q: decode or prefill", *role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, *role+":", err)
		os.Exit(1)
	}
}

// setEnv makes this process (and the prefill process it starts) use the
// transfer path asked for: no shared memory or process_vm for -tcp and
// -rdma, and RDMA between the two processes of this host for -rdma.
func (c Config) setEnv() {
	if c.TCP || c.RDMA {
		os.Setenv("GCCL_SHM_DISABLE", "1")
		os.Setenv("GCCL_P2P_PVM_DISABLE", "1")
	}
	if c.RDMA {
		os.Setenv("GCCL_P2P_RDMA_SAME_HOST", "1")
	}
}

// kvByte is the value of byte i of block b of layer l: what prefill
// computes and decode checks.
func kvByte(l, b, i int) byte { return byte(l*31 + b*7 + i + i>>9) }

func fillBlock(dst []byte, l, b int) {
	for i := range dst {
		dst[i] = kvByte(l, b, i)
	}
}

func checkBlock(got []byte, l, b int) error {
	for i, v := range got {
		if v != kvByte(l, b, i) {
			return fmt.Errorf("layer %d block %d byte %d is %d, want %d", l, b, i, v, kvByte(l, b, i))
		}
	}
	return nil
}

// Decode runs the decode worker and the prefill process it starts.
func Decode(c Config, out *os.File) error {
	if c.Layers < 1 || c.Blocks < 1 || c.BlockSize < 1 {
		return errors.New("need at least one layer, block and byte")
	}
	c.setEnv() // this agent's, and the prefill process inherits them
	listen := c.Listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	a, err := p2p.New("decode", p2p.Config{ListenAddr: listen})
	if err != nil {
		return err
	}
	defer a.Close()
	if c.RDMA {
		if dev, err := a.RDMADevice(); err != nil {
			fmt.Fprintf(out, "decode: no RDMA here, the layers come over tcp: %v\n", err)
		} else {
			fmt.Fprintf(out, "decode: RDMA device %s\n", dev)
		}
	}
	layerBytes := c.Blocks * c.BlockSize
	var kv *p2p.Region
	if c.TCP || c.RDMA {
		kv, err = a.RegisterMem(make([]byte, c.Layers*layerBytes))
	} else {
		kv, err = a.Alloc(c.Layers * layerBytes) // prefill maps it and copies straight in
	}
	if err != nil {
		return err
	}

	var cmd *exec.Cmd
	if c.Listen == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		cmd = exec.Command(exe)
		cmd.Env = append(os.Environ(), roleEnv+"=prefill", "DISAGG_ADDR="+a.Addr(),
			fmt.Sprintf("DISAGG_SHAPE=%d,%d,%d,%d", c.Layers, c.Blocks, c.BlockSize, c.Compute))
		cmd.Stdout, cmd.Stderr = out, os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		defer func() {
			if cmd.ProcessState == nil {
				cmd.Process.Kill()
				cmd.Wait()
			}
		}()
	} else {
		fmt.Fprintf(out, "decode: waiting for prefill at %s\n", a.Addr())
	}

	// Consume layers as their notifications arrive.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	mem := kv.Bytes()
	next := 0
	for next < c.Layers {
		notifs, fails, err := a.WaitEvents(ctx)
		if err != nil {
			return fmt.Errorf("waiting for layer %d: %w", next, err)
		}
		for _, f := range fails {
			return fmt.Errorf("waiting for layer %d: %s's request failed: %s", next, f.Peer, f.Err)
		}
		for _, msg := range notifs["prefill"] {
			l, err := strconv.Atoi(strings.TrimPrefix(string(msg), "layer "))
			if err != nil || l != next {
				return fmt.Errorf("notification %q, expected layer %d (notifications arrive in posting order)", msg, next)
			}
			for b := 0; b < c.Blocks; b++ {
				off := l*layerBytes + b*c.BlockSize
				if err := checkBlock(mem[off:off+c.BlockSize], l, b); err != nil {
					return err
				}
			}
			if l == 0 || l == c.Layers-1 {
				fmt.Fprintf(out, "decode: layer %d arrived and checked after %v\n", l, time.Since(start).Round(time.Microsecond))
			}
			next++
		}
	}
	if cmd != nil {
		if err := cmd.Wait(); err != nil {
			return fmt.Errorf("prefill process: %w", err)
		}
	}
	fmt.Fprintf(out, "decode: %d layers (%d MiB) received and checked in %v\n", c.Layers, c.Layers*layerBytes>>20, time.Since(start).Round(time.Millisecond))

	return offload(ctx, a, kv, c, out)
}

// offload writes every KV block to a file, clears the blocks, reads them
// back and checks them.
func offload(ctx context.Context, a *p2p.Agent, kv *p2p.Region, c Config, out *os.File) error {
	// A directory of our own (mode 0700): a fixed name in a shared
	// directory such as /tmp could be another user's file or symlink.
	dir, err := os.MkdirTemp(c.Dir, "disagg-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "kv.bin")
	size := uint64(c.Layers * c.Blocks * c.BlockSize)
	f, err := a.RegisterFile(path, p2p.FileOptions{Length: int64(size), Create: true, Direct: c.Direct})
	if err != nil {
		return err
	}
	defer a.DeregisterMem(f)
	// One descriptor per block, in the file in reverse block order, so the
	// offload is really many small descriptors.
	n := c.Layers * c.Blocks
	mem, file := make([]p2p.Desc, n), make([]p2p.Desc, n)
	for i := range n {
		mem[i] = kv.Desc(uint64(i*c.BlockSize), uint64(c.BlockSize))
		file[i] = f.Desc(uint64((n-1-i)*c.BlockSize), uint64(c.BlockSize))
	}
	for _, op := range []p2p.Op{p2p.Write, p2p.Read} {
		req, err := a.CreateRequest(op, p2p.DescList{Type: p2p.DRAM, Descs: mem}, a.Name(), p2p.DescList{Type: p2p.FILE, Descs: file}, nil)
		if err != nil {
			return err
		}
		t0 := time.Now()
		if _, err := req.Post(); err != nil {
			return err
		}
		if err := req.Wait(ctx); err != nil {
			return err
		}
		d := time.Since(t0)
		req.Release()
		fmt.Fprintf(out, "decode: %v of %d blocks to %s (%v backend): %v, %.2f GB/s\n", op, n, path, req.Backend(), d.Round(time.Microsecond), float64(size)/d.Seconds()/1e9)
		if op == p2p.Write {
			clear(kv.Bytes()) // evicted
		}
	}
	b := kv.Bytes()
	for l := 0; l < c.Layers; l++ {
		for blk := 0; blk < c.Blocks; blk++ {
			off := (l*c.Blocks + blk) * c.BlockSize
			if err := checkBlock(b[off:off+c.BlockSize], l, blk); err != nil {
				return fmt.Errorf("after the file round trip: %w", err)
			}
		}
	}
	fmt.Fprintf(out, "decode: every byte checked after offload and reload: OK\n")
	return nil
}

// prefillFromEnv is the prefill process.
func prefillFromEnv() error {
	var c Config
	if _, err := fmt.Sscanf(os.Getenv("DISAGG_SHAPE"), "%d,%d,%d,%d", &c.Layers, &c.Blocks, &c.BlockSize, &c.Compute); err != nil {
		return fmt.Errorf("DISAGG_SHAPE: %w", err)
	}
	c.RDMA = os.Getenv("GCCL_P2P_RDMA_SAME_HOST") == "1" // decode's -rdma
	_, err := Prefill(c, os.Getenv("DISAGG_ADDR"))
	return err
}

// Prefill computes the layers and writes each to decode as it is ready,
// and returns the backend the layers went over.
func Prefill(c Config, decodeAddr string) (p2p.Backend, error) {
	host, _, err := net.SplitHostPort(decodeAddr)
	if err != nil {
		return 0, err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		host = "" // another host: listen where netif chooses
	}
	listen := "127.0.0.1:0"
	if host == "" {
		listen = ""
	}
	a, err := p2p.New("prefill", p2p.Config{ListenAddr: listen})
	if err != nil {
		return 0, err
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var peer string
	var regions []p2p.RemoteRegion
	for {
		// Metadata exchanged over the socket. Decode, started on another
		// host, may not listen yet, or not have registered its KV region.
		if peer, err = a.Connect(ctx, decodeAddr); err == nil {
			if regions, err = a.RemoteRegions(peer); err == nil && len(regions) == 1 {
				break
			}
			a.Invalidate(peer)
			err = fmt.Errorf("decode's regions: %v %v", regions, err)
		}
		if ctx.Err() != nil {
			return 0, err
		}
		time.Sleep(200 * time.Millisecond)
	}
	dst := regions[0]
	layerBytes := c.Blocks * c.BlockSize
	kv := make([]byte, c.Layers*layerBytes)
	src, err := a.RegisterMem(kv)
	if err != nil {
		return 0, err
	}
	reqs := make([]*p2p.Request, c.Layers)
	var backend p2p.Backend
	var why string
	for l := 0; l < c.Layers; l++ {
		time.Sleep(c.Compute) // the layer's attention and MLP
		local, remote := make([]p2p.Desc, c.Blocks), make([]p2p.Desc, c.Blocks)
		for b := 0; b < c.Blocks; b++ {
			off := l*layerBytes + b*c.BlockSize
			fillBlock(kv[off:off+c.BlockSize], l, b)
			local[b] = src.Desc(uint64(off), uint64(c.BlockSize))
			remote[b] = dst.Desc(uint64(off), uint64(c.BlockSize))
		}
		req, err := a.CreateRequest(p2p.Write, p2p.DescList{Type: p2p.DRAM, Descs: local}, peer, p2p.DescList{Type: p2p.DRAM, Descs: remote},
			&p2p.RequestOptions{Notif: []byte(fmt.Sprintf("layer %d", l))})
		if err != nil {
			return 0, err
		}
		if _, err := req.Post(); err != nil {
			return 0, err
		}
		reqs[l], backend, why = req, req.Backend(), req.BackendReason()
	}
	for l, req := range reqs {
		if err := req.Wait(ctx); err != nil {
			return 0, fmt.Errorf("layer %d: %w", l, err)
		}
		req.Release()
	}
	fmt.Printf("prefill: wrote %d layers of %d blocks of %d bytes to %s over %v (%s)\n", c.Layers, c.Blocks, c.BlockSize, peer, backend, why)
	if c.RDMA && backend != p2p.BackendRDMA {
		why := "both have a device, but it could not be used (the warning above says why)"
		if _, err := a.RDMADevice(); err != nil {
			why = err.Error()
		}
		fmt.Printf("prefill: RDMA was asked for but not used: %s\n", why)
	}
	return backend, nil
}
