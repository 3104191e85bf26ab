package p2p

import (
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gccl/gccl/internal/shmem"
)

// The shm backend: the target's regions are shared memory (its Alloc) mapped
// here at LoadRemote, so the initiator copies straight into or out of them
// (large copies split across Config.CopyThreads goroutines; a VRAM end with
// CUDA copies, the mapping pinned once) and the target runs nothing.
var shmSpec = backendSpec{
	backend: shmBackend{}, kind: BackendSHM, name: "shm", inline: true, initiatorChecks: true,
	cost: costModel{fixed: 300 * time.Nanosecond, perPiece: 20 * time.Nanosecond, perPart: 5 * time.Microsecond, bytesPerSec: 7e9},
}

type shmBackend struct{}

func (shmBackend) serves(pl placement) (bool, string) {
	if !pl.peerDRAM() || !pl.allMapped || pl.shmOff {
		return false, ""
	}
	why := "the target's regions are shared memory mapped here"
	if pl.vram() {
		why += "; CUDA copies between them and the local VRAM"
	}
	return true, why
}

func (shmBackend) prepare(r *Request) error {
	if r.hasVRAM() {
		return r.prepareCUDA()
	}
	return nil
}

func (shmBackend) run(r *Request) error {
	if r.hasVRAM() {
		return r.runCUDA()
	}
	return r.runCopy()
}

// mapShared maps the peer's shared regions (Alloc'd, on this host), taking
// the mappings of the same segments over from reuse (the blob it replaces)
// and closing the others there. Shared memory off (Config.DisableSHM), it
// maps nothing.
func (ra *remoteAgent) mapShared(reuse map[string]*shmem.Region) {
	a, info := ra.a, ra.info
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
}

// takeSharedLocked hands the peer's mappings over to a newer blob of it,
// by segment name, unpinned (ra.mu held).
func (ra *remoteAgent) takeSharedLocked() map[string]*shmem.Region {
	reuse := map[string]*shmem.Region{}
	for id, m := range ra.maps {
		if r, ok := ra.table.byID(id); ok {
			if ra.pins[id] {
				ra.a.gpu.unpin(m.Bytes())
				delete(ra.pins, id)
			}
			reuse[r.SHM] = m
			delete(ra.maps, id)
		}
	}
	return reuse
}

// unmapShared unpins and unmaps segments the peer no longer uses here.
func (ra *remoteAgent) unmapShared(maps map[uint32]*shmem.Region, pins map[uint32]bool) {
	for id, m := range maps {
		if pins[id] {
			ra.a.gpu.unpin(m.Bytes())
		}
		m.Close()
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
