package p2p

import (
	"errors"
	"fmt"

	"github.com/gccl/gccl/internal/cuda"
)

// vramMem is a VRAM region's memory in this process.
type vramMem struct {
	dev int
	ctx *cuda.Context
}

// RegisterVRAM registers n bytes of device memory at devPtr on CUDA device
// ordinal device (memory from cuMemAlloc, in this process, e.g. a
// framework's KV cache). The range must lie inside one allocation. Peers
// on this host open the allocation's CUDA IPC handle from the metadata and
// copy to and from it on the GPU (cudaipc); other peers go through this
// agent (tcp, staged through pinned host buffers). Descriptors of the
// region have Addr = device address and DevID = device. Registering a
// range a VRAM region of the same device holds is a cache hit, as for
// RegisterMem. Without a CUDA driver (or without cgo) it returns an error
// wrapping ErrNotSupported that says why.
func (a *Agent) RegisterVRAM(devPtr uint64, n uint64, device int) (*Region, error) {
	if n == 0 {
		return nil, errors.New("p2p: RegisterVRAM of 0 bytes")
	}
	if devPtr == 0 || devPtr+n < devPtr {
		return nil, fmt.Errorf("p2p: RegisterVRAM: [%#x, +%d) is not a device range", devPtr, n)
	}
	if device < 0 || device >= maxDevices {
		return nil, fmt.Errorf("p2p: RegisterVRAM: device %d does not exist", device)
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil, ErrClosed
	}
	if r, ok := a.cache[regionKey{typ: VRAM, base: devPtr, len: n}]; ok && r.vram != nil && r.vram.dev == device {
		r.refs++
		a.mu.Unlock()
		return r, nil
	}
	if info, err := a.local.find(VRAM, devPtr, n, uint32(device)); err == nil {
		r := a.regions[info.ID]
		r.refs++
		a.mu.Unlock()
		return r, nil
	}
	a.mu.Unlock()
	ctx, err := a.gpu.context(device)
	if err != nil {
		return nil, fmt.Errorf("p2p: RegisterVRAM (device %d): %w", device, err)
	}
	mem, err := ctx.PointerInfo(cuda.DevicePtr(devPtr))
	if err != nil {
		return nil, fmt.Errorf("p2p: RegisterVRAM: %#x is not device memory allocated in this process: %w", devPtr, err)
	}
	if err := mem.CheckRange(cuda.DevicePtr(devPtr), n, device); errors.Is(err, cuda.ErrOutsideAllocation) {
		return nil, fmt.Errorf("p2p: RegisterVRAM: %w: %v", ErrOutOfBounds, err)
	} else if err != nil {
		return nil, fmt.Errorf("p2p: RegisterVRAM: %v", err)
	}
	base := mem.Base
	info := regionInfo{Type: VRAM, Base: devPtr, Len: n, Dev: uint32(device), Bus: a.gpu.busID(device), IPCOff: devPtr - uint64(base)}
	if h, err := ctx.IPCHandle(base); err == nil {
		info.IPC, info.Flags = h, regionIPC
	} else {
		a.log.Warn("p2p: no CUDA IPC handle for a VRAM region; peers on this host reach it over tcp", "device", device, "err", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, ErrClosed
	}
	r := a.addRegionLocked(info)
	r.vram = &vramMem{dev: device, ctx: ctx}
	a.log.Debug("registered VRAM", "id", r.info.ID, "device", device, "bus", info.Bus, "bytes", n, "ipc", info.Flags&regionIPC != 0)
	return r, nil
}

// Device is a VRAM region's CUDA device ordinal (-1 for DRAM and FILE).
func (r *Region) Device() int {
	if r.info.Type != VRAM {
		return -1
	}
	return int(r.info.Dev)
}
