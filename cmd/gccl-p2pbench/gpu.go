package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/gccl/gccl/internal/cuda"
	"github.com/gccl/gccl/p2p"
)

// cudaContext loads the driver and retains device dev's context; release
// undoes both.
func cudaContext(dev int) (*cuda.Context, func(), error) {
	d, err := cuda.Load()
	if err != nil {
		return nil, nil, fmt.Errorf("-gpu needs a CUDA driver: %w", err)
	}
	ctx, err := d.Retain(dev)
	if err != nil {
		d.Close()
		return nil, nil, fmt.Errorf("-gpu: device %d: %w", dev, err)
	}
	return ctx, func() { ctx.Release(); d.Close() }, nil
}

// gpuPoint is one size of a -gpu run: average seconds per copy.
type gpuPoint struct {
	size                     int
	h2d, h2dRaw, d2h, d2hRaw time.Duration
	ipc, d2dRaw              time.Duration
	ipcBackend               p2p.Backend
}

// runGPU measures, size by size and interleaved so that both see the same
// machine: host->device and device->host through the agent against raw
// pinned copies, and VRAM->VRAM over cudaipc (a second process) against a
// device-to-device copy in this process.
func runGPU(o *options) error {
	var sizes []int
	for s := o.minSize; s <= o.maxSize; s *= o.factor {
		sizes = append(sizes, s)
		if s > o.maxSize/o.factor {
			break
		}
	}
	size := sizes[len(sizes)-1]
	ctx, release, err := cudaContext(o.dev)
	if err != nil {
		return err
	}
	defer release()
	a, err := p2p.New("initiator", p2p.Config{ListenAddr: "127.0.0.1:0"})
	if err != nil {
		return err
	}
	defer a.Close()

	// Device memory: the agent's source/destination, and a second buffer
	// for the local device-to-device reference.
	dv, err := ctx.Alloc(size)
	if err != nil {
		return err
	}
	defer ctx.Free(dv)
	dv2, err := ctx.Alloc(size)
	if err != nil {
		return err
	}
	defer ctx.Free(dv2)
	vr, err := a.RegisterVRAM(uint64(dv), uint64(size), o.dev)
	if err != nil {
		return err
	}
	// Host memory: a Go buffer registered with the agent (which pins it),
	// and pinned driver memory for the raw reference.
	host := make([]byte, size)
	for i := range host {
		host[i] = byte(i*13 + i>>12)
	}
	hr, err := a.RegisterMem(host)
	if err != nil {
		return err
	}
	pinned, err := ctx.AllocHost(size)
	if err != nil {
		return err
	}
	defer ctx.FreeHost(pinned)
	copy(pinned, host)
	want := bytes.Clone(host)

	peer, remote, stop, err := setupTarget(a, &options{target: "vram", dev: o.dev}, size)
	if err != nil {
		return fmt.Errorf("cudaipc target process: %w", err)
	}
	defer stop()

	bus, _ := cudaBus(o.dev)
	hostname, _ := os.Hostname()
	fmt.Printf("# gccl-p2pbench -gpu on %s, device %d (%s), %d iterations after %d warm-up; GB/s, agent against the raw driver call\n",
		hostname, o.dev, bus, o.iters, o.warmup)
	fmt.Printf("# %12s %9s %9s %6s %9s %9s %6s %9s %9s %6s  %s\n", "bytes", "h2d", "h2d_raw", "ratio", "d2h", "d2h_raw", "ratio", "ipc_d2d", "local_d2d", "ratio", "ipc_backend")
	for _, n := range sizes {
		pt := gpuPoint{size: n}
		h2d, err := agentRequest(a, p2p.Write, p2p.DescList{Type: p2p.DRAM, Descs: []p2p.Desc{hr.Desc(0, uint64(n))}}, a.Name(),
			p2p.DescList{Type: p2p.VRAM, Descs: []p2p.Desc{vr.Desc(0, uint64(n))}})
		if err != nil {
			return err
		}
		d2h, err := agentRequest(a, p2p.Read, p2p.DescList{Type: p2p.DRAM, Descs: []p2p.Desc{hr.Desc(0, uint64(n))}}, a.Name(),
			p2p.DescList{Type: p2p.VRAM, Descs: []p2p.Desc{vr.Desc(0, uint64(n))}})
		if err != nil {
			return err
		}
		ipc, err := agentRequest(a, p2p.Write, p2p.DescList{Type: p2p.VRAM, Descs: []p2p.Desc{vr.Desc(0, uint64(n))}}, peer,
			p2p.DescList{Type: p2p.VRAM, Descs: []p2p.Desc{remote(0, uint64(n))}})
		if err != nil {
			return err
		}
		pt.ipcBackend = ipc.Backend()
		ops := []struct {
			d *time.Duration
			f func() error
		}{
			{&pt.h2d, post(h2d)},
			{&pt.h2dRaw, func() error { return ctx.CopyToDevice(dv, pinned[:n]) }},
			{&pt.d2h, post(d2h)},
			{&pt.d2hRaw, func() error { return ctx.CopyFromDevice(pinned[:n], dv) }},
			{&pt.ipc, post(ipc)},
			{&pt.d2dRaw, func() error {
				if err := ctx.CopyAsync(dv2, dv, n, 0); err != nil {
					return err
				}
				return ctx.Synchronize()
			}},
		}
		totals := make([]time.Duration, len(ops))
		for it := 0; it < o.warmup+o.iters; it++ {
			for i, op := range ops { // interleaved: the same conditions for both
				t0 := time.Now()
				if err := op.f(); err != nil {
					return err
				}
				if it >= o.warmup {
					totals[i] += time.Since(t0)
				}
			}
		}
		for i, op := range ops {
			*op.d = totals[i] / time.Duration(o.iters)
		}
		for _, r := range []*p2p.Request{h2d, d2h, ipc} {
			r.Release()
		}
		if o.check {
			// Every copy moved the same pattern: read the peer's VRAM back
			// through the agent and compare.
			clear(host[:n])
			back, err := agentRequest(a, p2p.Read, p2p.DescList{Type: p2p.DRAM, Descs: []p2p.Desc{hr.Desc(0, uint64(n))}}, peer,
				p2p.DescList{Type: p2p.VRAM, Descs: []p2p.Desc{remote(0, uint64(n))}})
			if err != nil {
				return err
			}
			err = post(back)()
			back.Release()
			if err != nil {
				return err
			}
			if !bytes.Equal(host[:n], want[:n]) {
				return fmt.Errorf("%d bytes: the peer's VRAM differs from what was written", n)
			}
		}
		gbs := func(d time.Duration) float64 { return float64(n) / d.Seconds() / 1e9 }
		fmt.Printf("  %12d %9.2f %9.2f %5.0f%% %9.2f %9.2f %5.0f%% %9.2f %9.2f %5.0f%%  %v\n", n,
			gbs(pt.h2d), gbs(pt.h2dRaw), 100*pt.h2dRaw.Seconds()/pt.h2d.Seconds(),
			gbs(pt.d2h), gbs(pt.d2hRaw), 100*pt.d2hRaw.Seconds()/pt.d2h.Seconds(),
			gbs(pt.ipc), gbs(pt.d2dRaw), 100*pt.d2dRaw.Seconds()/pt.ipc.Seconds(), pt.ipcBackend)
	}
	return nil
}

// agentRequest makes a request of one descriptor pair.
func agentRequest(a *p2p.Agent, op p2p.Op, local p2p.DescList, peer string, remote p2p.DescList) (*p2p.Request, error) {
	r, err := a.CreateRequest(op, local, peer, remote, nil)
	if err != nil {
		return nil, fmt.Errorf("%v %v -> %s %v: %w", op, local.Type, peer, remote.Type, err)
	}
	return r, nil
}

// post posts r and waits for it.
func post(r *p2p.Request) func() error {
	return func() error {
		if _, err := r.Post(); err != nil {
			return err
		}
		return r.Wait(context.Background())
	}
}

// cudaBus is device dev's PCI bus id, for the header.
func cudaBus(dev int) (string, error) {
	d, err := cuda.Load()
	if err != nil {
		return "", err
	}
	defer d.Close()
	return d.PCIBusID(dev)
}
