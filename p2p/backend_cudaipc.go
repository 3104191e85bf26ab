package p2p

import "os"

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
		if r.IPCOff+r.Len > uint64(m.size) {
			a.log.Warn("p2p ignores a VRAM region that runs past its allocation", "peer", info.Name, "region", r.ID)
			continue
		}
		ra.vmaps[r.ID] = vramMapping{base: uint64(m.base) + r.IPCOff, dev: m.dev}
	}
}
