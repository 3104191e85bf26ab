package p2p

import (
	"os"
	"time"
)

// The cudaipc backend: the target is a peer's VRAM on this host, whose
// allocations were opened here through their CUDA IPC handles at LoadRemote
// (openVRAM). The initiator copies on the GPU: device to device from local
// VRAM, host to device and back from local DRAM (pinned once).
var cudaipcSpec = backendSpec{
	backend: cudaipcBackend{}, kind: BackendCUDAIPC, name: "cudaipc", inline: true, initiatorChecks: true,
	// Not calibrated: a CUDA copy's launch cost and a copy engine's
	// bandwidth, to rank the backend above tcp.
	cost: costModel{fixed: 10 * time.Microsecond, perPiece: 2 * time.Microsecond, perPart: 5 * time.Microsecond, bytesPerSec: 20e9},
}

type cudaipcBackend struct{}

func (cudaipcBackend) serves(pl placement) (bool, string) {
	if pl.self || pl.remoteType != VRAM || !pl.sameHost || !pl.allMapped || pl.ipcOff {
		return false, ""
	}
	return true, "the target's VRAM is opened here through CUDA IPC"
}

func (cudaipcBackend) prepare(r *Request) error { return r.prepareCUDA() }

func (cudaipcBackend) run(r *Request) error { return r.runCUDA() }

// vramMapping is where a peer's VRAM region is in this process.
type vramMapping struct {
	base uint64 // the device address of the region's Base here
	dev  int    // the local device that opened it
}

// openVRAM opens the CUDA IPC handles of the peer's VRAM regions, once per
// allocation (reuse holds the mappings of the blob it replaces), each on
// the local device with the same PCI bus id (else device 0, with peer
// access enabled by the driver). It does nothing for a peer in this same
// process (the driver refuses its own handles) or with CUDA IPC disabled;
// without a driver here it says so, and those regions go over tcp.
func (ra *remoteAgent) openVRAM(reuse map[[ipcHandleLen]byte]*ipcMapping) {
	a, info := ra.a, ra.info
	defer func() {
		for _, m := range reuse {
			a.gpu.closeIPC(m)
		}
	}()
	if a.cfg.DisableCUDAIPC || int(info.Pid) == os.Getpid() {
		return
	}
	for _, r := range info.Regions {
		if r.Type != VRAM || r.Flags&regionIPC == 0 || ra.dropped[r.ID] {
			continue
		}
		m := ra.ipc[r.IPC]
		if m == nil {
			m = reuse[r.IPC]
			delete(reuse, r.IPC)
		}
		if m == nil {
			if err := a.gpu.available(); err != nil {
				a.log.Info("p2p cannot open a peer's VRAM here; its VRAM regions go over tcp", "peer", info.Name, "err", err)
				return
			}
			dev := a.gpu.deviceOfBus(r.Bus)
			if dev < 0 {
				dev = 0
			}
			var err error
			if m, err = a.gpu.openIPC(r.IPC, dev); err != nil {
				a.log.Warn("p2p cannot open a peer's CUDA IPC handle; that region goes over tcp", "peer", info.Name, "region", r.ID, "err", err)
				continue
			}
		}
		ra.ipc[r.IPC] = m
		if r.IPCOff+r.Len > uint64(m.Size()) {
			a.log.Warn("p2p ignores a VRAM region that runs past its allocation", "peer", info.Name, "region", r.ID)
			continue
		}
		ra.vmaps[r.ID] = vramMapping{base: uint64(m.Base()) + r.IPCOff, dev: m.Ordinal()}
	}
}

// takeVRAMLocked hands the peer's CUDA IPC mappings over (to a newer blob
// of it, or to be closed), and forgets its regions' places (ra.mu held).
func (ra *remoteAgent) takeVRAMLocked() map[[ipcHandleLen]byte]*ipcMapping {
	ipc := ra.ipc
	ra.ipc, ra.vmaps = map[[ipcHandleLen]byte]*ipcMapping{}, map[uint32]vramMapping{}
	return ipc
}
