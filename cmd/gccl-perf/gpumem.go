package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/gpu"
)

// -M device: the send and receive buffers are GPU memory, as in
// nccl-tests. Each rank opens one device (openGPU), allocates its two
// buffers there once (rankGPU), and hands the collectives views of them
// (gpu.Buffer.View). The host copies of the buffers (rankState.send and recv)
// stay, as mirrors: inputs are written there and uploaded, outputs are
// downloaded there and checked, so that filling and checking are the same
// code for both memories.

// openGPU opens the device of the rank that is localRank-th among its
// host's ranks: ordinal localRank modulo the number of devices, so that
// ranks outnumbering the GPUs share them in turn.
func openGPU(localRank int) (*gpu.Device, error) {
	n, err := gpu.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("-M device: %w", err)
	}
	if n < 1 {
		return nil, errors.New("-M device: the CUDA driver reports no device")
	}
	dev, err := gpu.Open(localRank % n)
	if err != nil {
		return nil, fmt.Errorf("-M device: opening CUDA device %d: %w", localRank%n, err)
	}
	return dev, nil
}

// openGPUs opens the devices of this process's ranks, the i-th of which is
// the firstLocal+i-th rank on this host; nil, without touching the CUDA
// driver, unless cfg asks for device memory.
func openGPUs(cfg *config, firstLocal, ranks int) ([]*gpu.Device, error) {
	if cfg.memory != memoryDevice {
		return nil, nil
	}
	devs := make([]*gpu.Device, 0, ranks)
	for i := range ranks {
		dev, err := openGPU(firstLocal + i)
		if err != nil {
			closeGPUs(devs)
			return nil, err
		}
		devs = append(devs, dev)
	}
	return devs, nil
}

// closeGPUs closes devices whose buffers have been freed.
func closeGPUs(devs []*gpu.Device) {
	for _, d := range devs {
		d.Close()
	}
}

// onGPU records in r the device the rank's buffers are on.
func (r *rankInfo) onGPU(dev *gpu.Device) {
	r.Device, r.BusID = dev.Ordinal(), dev.PCIBusID()
}

// rankGPU is one rank's device memory.
type rankGPU struct {
	send, recv *gpu.Buffer // maxBytes each, mirrored by rankState.send and recv
	// Under -R 2: the rank's stream, which every view is bound to, and
	// the windows of send and recv.
	stream  *gpu.Stream
	windows []*comm.DeviceWindow
}

// register makes send and recv windows of c (collective: every rank of
// the job at once) and binds the views to a new stream.
func (g *rankGPU) register(ctx context.Context, c *comm.Comm, dev *gpu.Device) error {
	s, err := dev.NewStream()
	if err != nil {
		return fmt.Errorf("-R 2: a stream on CUDA device %d: %w", dev.Ordinal(), err)
	}
	g.stream = s
	for _, b := range []*gpu.Buffer{g.send, g.recv} {
		w, err := c.RegisterDevice(ctx, b)
		if err != nil {
			return fmt.Errorf("-R 2: %w", err)
		}
		g.windows = append(g.windows, w)
	}
	return nil
}

// sync waits for the rank's stream under -R 2, where a call returns once
// it is queued.
func (g *rankGPU) sync() error {
	if g == nil || g.stream == nil {
		return nil
	}
	return g.stream.Synchronize()
}

// newRankGPU allocates size-byte send and receive buffers on dev.
func newRankGPU(dev *gpu.Device, size int) (*rankGPU, error) {
	g := &rankGPU{}
	for _, dst := range []**gpu.Buffer{&g.send, &g.recv} {
		b, err := dev.Alloc(comm.Uint8, size)
		if err != nil {
			g.free()
			return nil, fmt.Errorf("-M device: allocating %d bytes on CUDA device %d: %w", size, dev.Ordinal(), err)
		}
		*dst = b
	}
	return g, nil
}

// free releases g's windows, stream and buffers; the device stays open.
func (g *rankGPU) free() {
	for _, w := range g.windows {
		w.Deregister()
	}
	g.windows = nil
	if g.stream != nil {
		g.stream.Synchronize()
		g.stream.Close()
		g.stream = nil
	}
	for _, b := range []*gpu.Buffer{g.send, g.recv} {
		if b != nil {
			b.Free()
		}
	}
	g.send, g.recv = nil, nil
}

// upload copies the host mirrors into the device buffers.
func (g *rankGPU) upload(send, recv []byte) error {
	if err := g.send.CopyFromHost(send); err != nil {
		return fmt.Errorf("uploading the send buffer: %w", err)
	}
	if err := g.recv.CopyFromHost(recv); err != nil {
		return fmt.Errorf("uploading the receive buffer: %w", err)
	}
	return nil
}

// download copies the device receive buffer into its host mirror.
func (g *rankGPU) download(recv []byte) error {
	if err := g.recv.CopyToHost(recv); err != nil {
		return fmt.Errorf("downloading the receive buffer: %w", err)
	}
	return nil
}

// view returns region r of the rank's device memory as elements of dt, for
// a collective's argument: a view of the send or receive buffer (ranges,
// because successive operations move through the buffers, and in place one
// rank's block of a buffer is the other argument).
func (g *rankGPU) view(dt comm.DataType, r region) (comm.Buffer, error) {
	mem := g.send
	if r.inRecv {
		mem = g.recv
	}
	v, err := mem.View(int(r.off), dt, int(r.n)/dt.Size())
	if err != nil || g.stream == nil {
		return v, err
	}
	return v.OnStream(g.stream)
}
