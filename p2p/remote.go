package p2p

import (
	"maps"
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
	var reuseSHM map[string]*shmem.Region
	var reuseIPC map[[ipcHandleLen]byte]*ipcMapping
	if old != nil {
		old.mu.Lock()
		if old.users == 0 {
			// Its mappings move here or are unmapped below: from now on the
			// old remote refuses transfers (it is replaced in a moment).
			old.invalid = true
			reuseSHM = old.takeSharedLocked()
			reuseIPC = old.takeVRAMLocked()
		}
		old.mu.Unlock()
	}
	ra.openVRAM(reuseIPC)  // cudaipc
	ra.mapShared(reuseSHM) // shm
	ra.probe()             // pvm
	return ra
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

// unmap closes the peer's shared segments and VRAM mappings here.
func (ra *remoteAgent) unmap() {
	ra.mu.Lock()
	maps, pins := ra.maps, ra.pins
	ra.maps, ra.pins = map[uint32]*shmem.Region{}, map[uint32]bool{}
	ipc := ra.takeVRAMLocked()
	ra.mu.Unlock()
	ra.unmapShared(maps, pins)
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
