package main

import (
	"errors"
	"fmt"

	"github.com/gccl/gccl/comm"
	"github.com/gccl/gccl/gpu"
)

// -M device: the send and receive buffers are GPU memory, as in
// nccl-tests. Each rank opens one device (openGPU), allocates its two
// buffers there once (rankGPU), and hands the collectives views of them
// (deviceView). The host copies of the buffers (rankState.send and recv)
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

// Buffer roles, which index rankGPU.bounce.
const (
	sendRole = iota
	recvRole
)

// rankGPU is one rank's device memory.
type rankGPU struct {
	dev        *gpu.Device
	send, recv *gpu.Buffer // maxBytes each, mirrored by rankState.send and recv
	// bounce holds, for the views of the send and of the receive role, the
	// device memory their host copies pass through (see deviceView): one
	// buffer per role, of the current views' size.
	bounce [2]*gpu.Buffer
}

// newRankGPU allocates size-byte send and receive buffers on dev.
func newRankGPU(dev *gpu.Device, size int) (*rankGPU, error) {
	g := &rankGPU{dev: dev}
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

// free releases every buffer of g; the device stays open.
func (g *rankGPU) free() {
	for _, b := range []*gpu.Buffer{g.send, g.recv, g.bounce[sendRole], g.bounce[recvRole]} {
		if b != nil {
			b.Free()
		}
	}
	g.send, g.recv, g.bounce = nil, nil, [2]*gpu.Buffer{}
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
// a collective's role argument. Called ahead of any timed loop: it may
// allocate the role's bounce buffer.
func (g *rankGPU) view(dt comm.DataType, r region, role int) (*deviceView, error) {
	mem := g.send
	if r.inRecv {
		mem = g.recv
	}
	v := &deviceView{mem: mem, off: int(r.off), dt: dt, n: int(r.n) / dt.Size()}
	if whole := r.off == 0 && int(r.n) == mem.Len(); r.n > 0 && !whole {
		b, err := g.bounceOf(role, int(r.n))
		if err != nil {
			return nil, err
		}
		v.bounce = b
	}
	return v, nil
}

// bounceOf returns role's bounce buffer of size bytes, replacing one of
// another size: every view of a role in one benchmarked point has the same
// size, so each point allocates at most once per role.
func (g *rankGPU) bounceOf(role, size int) (*gpu.Buffer, error) {
	if b := g.bounce[role]; b != nil {
		if b.Len() == size {
			return b, nil
		}
		b.Free()
		g.bounce[role] = nil
	}
	b, err := g.dev.Alloc(comm.Uint8, size)
	if err != nil {
		return nil, fmt.Errorf("-M device: allocating a %d-byte bounce buffer on CUDA device %d: %w", size, g.dev.Ordinal(), err)
	}
	g.bounce[role] = b
	return b, nil
}

// deviceView is a range of a gpu.Buffer as a comm.PeerDeviceBuffer.
// gccl-perf needs ranges (successive operations move through the buffers,
// and in place one rank's block of a buffer is the other argument), which
// gpu.Buffer does not offer. Collectives on the devices only use the
// range's address; those gccl runs through host staging copy it with
// CopyToHost and CopyFromHost, which gpu.Buffer does only for a whole
// buffer, so a range's copies go through a bounce buffer of its size on
// the same device (a device-to-device copy on the buffer's engine).
type deviceView struct {
	mem    *gpu.Buffer
	off    int // bytes into mem
	dt     comm.DataType
	n      int         // elements
	bounce *gpu.Buffer // n elements' bytes; nil when the range is all of mem
}

var _ comm.PeerDeviceBuffer = (*deviceView)(nil)

func (v *deviceView) DataType() comm.DataType { return v.dt }
func (v *deviceView) Len() int                { return v.n }

// HostBytes is nil: device memory.
func (v *deviceView) HostBytes() []byte { return nil }

// Ptr is the range's device address.
func (v *deviceView) Ptr() uintptr { return v.mem.Ptr() + uintptr(v.off) }

// Engine is the engine of the buffer's device.
func (v *deviceView) Engine() comm.DeviceEngine { return v.mem.Engine() }

// CopyToHost copies the range into dst, which must hold it exactly.
func (v *deviceView) CopyToHost(dst []byte) error {
	if v.bounce == nil {
		return v.mem.CopyToHost(dst)
	}
	if err := v.copyOnDevice(v.bounce.Ptr(), v.Ptr(), len(dst)); err != nil {
		return err
	}
	return v.bounce.CopyToHost(dst)
}

// CopyFromHost copies src, which must be the range's size, into it.
func (v *deviceView) CopyFromHost(src []byte) error {
	if v.bounce == nil {
		return v.mem.CopyFromHost(src)
	}
	if err := v.bounce.CopyFromHost(src); err != nil {
		return err
	}
	return v.copyOnDevice(v.Ptr(), v.bounce.Ptr(), len(src))
}

// copyOnDevice copies n bytes between the range and its bounce buffer and
// waits for the copy, after checking that n is the range's size.
func (v *deviceView) copyOnDevice(dst, src uintptr, n int) error {
	if size := v.n * v.dt.Size(); n != size {
		return fmt.Errorf("%w: %d bytes of host memory for a %d-byte device range", comm.ErrInvalidArgument, n, size)
	}
	eng := v.Engine()
	if err := eng.Copy(dst, src, n); err != nil {
		return err
	}
	return eng.Wait()
}
