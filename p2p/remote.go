package p2p

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/gccl/gccl/internal/shmem"
)

// remoteAgent is a loaded peer: its metadata, and on this host the mappings
// of its shared regions and whether process_vm_readv reaches it.
type remoteAgent struct {
	a        *Agent
	info     *agentInfo
	table    regionTable
	sameHost bool
	pvm      bool

	mu      sync.Mutex
	maps    map[uint32]*shmem.Region // shared regions mapped here, by region ID
	ipc     map[[ipcHandleLen]byte]*ipcMapping
	vmaps   map[uint32]vramMapping // VRAM regions opened here (in ipc), by region ID
	pins    map[uint32]bool        // mapped shared regions pinned for CUDA copies
	users   int                    // transfers running on the mappings
	invalid bool
	dropped map[uint32]bool // regions the peer deregistered since its metadata
}

// vramMapping is where a peer's VRAM region is in this process.
type vramMapping struct {
	base uint64 // the device address of the region's Base here
	dev  int    // the local device that opened it
}

// newRemoteAgent maps the peer's shared regions (taking over old's mappings
// of the same segments) and probes process_vm_readv.
func newRemoteAgent(a *Agent, info *agentInfo, old *remoteAgent) *remoteAgent {
	ra := &remoteAgent{a: a, info: info, maps: map[uint32]*shmem.Region{}, ipc: map[[ipcHandleLen]byte]*ipcMapping{},
		vmaps: map[uint32]vramMapping{}, pins: map[uint32]bool{}}
	if old != nil && old.info.Token == info.Token {
		// The same agent never reuses a region ID: what it deregistered
		// stays gone, even in a blob made before the deregistration.
		old.mu.Lock()
		ra.dropped = maps.Clone(old.dropped)
		old.mu.Unlock()
	}
	for _, r := range info.Regions {
		if !ra.dropped[r.ID] {
			ra.table.add(r)
		}
	}
	ra.sameHost = info.Host == a.host
	if !ra.sameHost {
		return ra
	}
	reuse := map[string]*shmem.Region{}
	var reuseIPC map[[ipcHandleLen]byte]*ipcMapping
	if old != nil {
		old.mu.Lock()
		if old.users == 0 {
			// Its mappings move here or are unmapped below: from now on the
			// old remote refuses transfers (it is replaced in a moment).
			old.invalid = true
			for id, m := range old.maps {
				if r, ok := old.table.byID(id); ok {
					if old.pins[id] {
						a.gpu.unpin(m.Bytes())
						delete(old.pins, id)
					}
					reuse[r.SHM] = m
					delete(old.maps, id)
				}
			}
			reuseIPC, old.ipc = old.ipc, map[[ipcHandleLen]byte]*ipcMapping{}
			old.vmaps = map[uint32]vramMapping{}
		}
		old.mu.Unlock()
	}
	ra.openVRAM(reuseIPC)
	if !a.cfg.DisableSHM {
		for _, r := range info.Regions {
			if r.Flags&regionSHM == 0 || ra.dropped[r.ID] {
				continue
			}
			if !validSegment(r.SHM) {
				a.log.Warn("p2p ignores a shared region with a segment name Alloc does not make", "peer", info.Name, "segment", r.SHM)
				continue
			}
			if m := reuse[r.SHM]; m != nil && uint64(m.Len()) == r.Len {
				ra.maps[r.ID] = m
				delete(reuse, r.SHM)
				continue
			}
			m, err := shmem.MapRegion(r.SHM, int(r.Len))
			if err != nil {
				a.log.Warn("p2p cannot map a peer's shared region; its transfers fall back to another backend",
					"peer", info.Name, "region", r.ID, "segment", r.SHM, "err", err)
				continue
			}
			ra.maps[r.ID] = m
		}
	}
	for _, m := range reuse {
		m.Close()
	}
	if !a.cfg.DisablePVM {
		err := probePVM(int(info.Pid), info.Probe, info.Token[:])
		ra.pvm = err == nil
		if err != nil {
			a.log.Info("p2p process_vm_readv unusable with this peer; its heap regions go over tcp", "peer", info.Name, "err", err)
		}
	}
	return ra
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

// pinMapped pins a mapped shared region for CUDA copies, once; unmap
// unpins it.
func (ra *remoteAgent) pinMapped(id uint32, dev int) {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	m := ra.maps[id]
	if m == nil || ra.pins[id] {
		return
	}
	ra.pins[id] = true
	ra.a.gpu.pin(m.Bytes(), dev)
}

// acquire keeps the mappings until release; it fails once invalidated.
func (ra *remoteAgent) acquire() bool {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	if ra.invalid {
		return false
	}
	ra.users++
	return true
}

func (ra *remoteAgent) release() {
	ra.mu.Lock()
	ra.users--
	unmap := ra.invalid && ra.users == 0
	ra.mu.Unlock()
	if unmap {
		ra.unmap()
	}
}

// invalidate makes the peer unusable and unmaps its regions once the last
// transfer using them ends.
func (ra *remoteAgent) invalidate() {
	ra.mu.Lock()
	ra.invalid = true
	unmap := ra.users == 0
	ra.mu.Unlock()
	if unmap {
		ra.unmap()
	}
}

func (ra *remoteAgent) unmap() {
	ra.mu.Lock()
	maps, pins, ipc := ra.maps, ra.pins, ra.ipc
	ra.maps, ra.pins = map[uint32]*shmem.Region{}, map[uint32]bool{}
	ra.ipc, ra.vmaps = map[[ipcHandleLen]byte]*ipcMapping{}, map[uint32]vramMapping{}
	ra.mu.Unlock()
	for id, m := range maps {
		if pins[id] {
			ra.a.gpu.unpin(m.Bytes())
		}
		m.Close()
	}
	for _, m := range ipc {
		ra.a.gpu.closeIPC(m)
	}
}

// dropRegion forgets a region the peer deregistered. Its mapping (shared
// segment or CUDA IPC) stays
// until the peer is forgotten: a prepared list may still point into it, and
// copying into pages the owner let go is harmless, while copying into an
// unmapped range would crash this process. Requests that use the region
// fail at Post (droppedAny).
func (ra *remoteAgent) dropRegion(id uint32) {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	ra.table.remove(id)
	if ra.dropped == nil {
		ra.dropped = map[uint32]bool{}
	}
	ra.dropped[id] = true
}

// droppedAny returns one of ids that the peer deregistered, if any.
func (ra *remoteAgent) droppedAny(ids []uint32) (uint32, bool) {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	for _, id := range ids {
		if ra.dropped[id] {
			return id, true
		}
	}
	return 0, false
}

// lookup finds the peer's region for a descriptor and, when mapped, its
// memory here (shared DRAM) or its device address here (VRAM through CUDA
// IPC; ok false when not mapped).
func (ra *remoteAgent) lookup(typ MemType, d Desc) (regionInfo, []byte, vramMapping, bool, error) {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	r, err := ra.table.find(typ, d.Addr, d.Len, d.DevID)
	if err != nil {
		return r, nil, vramMapping{}, false, err
	}
	if m := ra.maps[r.ID]; m != nil {
		return r, m.Bytes(), vramMapping{}, false, nil
	}
	vm, ok := ra.vmaps[r.ID]
	return r, nil, vm, ok, nil
}

// validSegment accepts only the names Agent.Alloc makes, in a shared-memory
// directory, so that metadata cannot make this agent map or remove any
// other file.
func validSegment(name string) bool {
	base := filepath.Base(name)
	return filepath.IsAbs(name) && filepath.Clean(name) == name &&
		strings.HasPrefix(base, "gccl-p2p-") && strings.Contains(base, "-buf") && !strings.ContainsAny(base, "/\\")
}

// removeSegment unlinks a dead peer's shared segment.
func removeSegment(name string) {
	if validSegment(name) {
		os.Remove(name)
	}
}
