package p2p

import (
	"fmt"
	"time"
)

// Backend moves a request's bytes.
type Backend uint8

const (
	// BackendAuto lets the agent choose (RequestOptions.Backend).
	BackendAuto Backend = iota
	// BackendLocal copies between two regions of this agent.
	BackendLocal
	// BackendSHM copies to or from a peer's region mapped here.
	BackendSHM
	// BackendPVM copies with process_vm_readv/writev.
	BackendPVM
	// BackendTCP goes over the connection; the target's progress goroutine
	// lands or serves the data.
	BackendTCP
	// BackendFile reads or writes a FILE region of this agent.
	BackendFile
	// BackendCUDAIPC copies to or from a peer's VRAM on this host, opened
	// here through its CUDA IPC handle: device-to-device, or host-to-device
	// and back for a local DRAM end.
	BackendCUDAIPC
)

func (b Backend) String() string {
	switch b {
	case BackendAuto:
		return "auto"
	case BackendLocal:
		return "local"
	case BackendSHM:
		return "shm"
	case BackendPVM:
		return "pvm"
	case BackendTCP:
		return "tcp"
	case BackendFile:
		return "file"
	case BackendCUDAIPC:
		return "cudaipc"
	}
	return fmt.Sprintf("Backend(%d)", uint8(b))
}

// placement is what backend selection looks at: pure data, so the choice is
// testable without I/O.
type placement struct {
	self       bool    // the target is this agent
	localType  MemType // the initiator's memory (DRAM when zero)
	remoteType MemType // the target's memory
	allMapped  bool    // every target region is mapped here (shared memory; VRAM: CUDA IPC)
	sameHost   bool
	pvm        bool // process_vm_readv reaches the target
	shmOff     bool
	ipcOff     bool // CUDA IPC disabled
}

// selectBackend picks the cheapest backend that can do the transfer and
// says why (logged). forced, if not BackendAuto, is checked instead.
func selectBackend(pl placement, forced Backend) (Backend, string, error) {
	var candidates []Backend
	var why string
	vram := pl.localType == VRAM || pl.remoteType == VRAM
	switch {
	case pl.self && pl.remoteType == FILE:
		candidates, why = []Backend{BackendFile}, "target is a file of this agent"
		if vram {
			why += "; VRAM staged through pinned bounce buffers"
		}
	case pl.self:
		candidates, why = []Backend{BackendLocal}, "both ends in this process"
		if vram {
			why += "; CUDA copies"
		}
	case pl.remoteType == FILE:
		candidates, why = []Backend{BackendTCP}, "a peer's file is reached through its agent"
	case pl.remoteType == VRAM:
		if pl.sameHost && pl.allMapped && !pl.ipcOff {
			candidates, why = append(candidates, BackendCUDAIPC), "the target's VRAM is opened here through CUDA IPC"
		}
		candidates = append(candidates, BackendTCP)
		switch {
		case candidates[0] == BackendCUDAIPC:
		case !pl.sameHost:
			why = "another host; the target stages its VRAM through pinned buffers"
		case pl.ipcOff:
			why = "same host, CUDA IPC disabled (GCCL_SHM_DISABLE, GCCL_P2P_CUDAIPC_DISABLE or Config); the target stages its VRAM"
		default:
			why = "same host, but the target's VRAM is not opened here (same process, no CUDA driver here, or no IPC handle); the target stages it"
		}
	default:
		if pl.allMapped && !pl.shmOff {
			candidates = append(candidates, BackendSHM)
		}
		if pl.sameHost && pl.pvm && pl.localType != VRAM {
			candidates = append(candidates, BackendPVM)
		}
		candidates = append(candidates, BackendTCP)
		switch {
		case candidates[0] == BackendSHM:
			why = "the target's regions are shared memory mapped here"
			if vram {
				why += "; CUDA copies between them and the local VRAM"
			}
		case candidates[0] == BackendPVM:
			why = "same host, heap regions, process_vm_writev permitted"
		case !pl.sameHost:
			why = "another host"
		case pl.shmOff:
			why = "same host, shared memory disabled (GCCL_SHM_DISABLE or Config.DisableSHM) and process_vm unusable"
		case pl.localType == VRAM:
			why = "same host, the target's regions are not shared, and process_vm cannot reach VRAM"
		default:
			why = "same host, but the target's regions are not shared and process_vm is unusable"
		}
	}
	if forced == BackendAuto {
		return candidates[0], why, nil
	}
	for _, c := range candidates {
		if c == forced {
			return c, "forced by RequestOptions.Backend", nil
		}
	}
	return 0, "", fmt.Errorf("p2p: backend %v cannot do this transfer (possible: %v): %w", forced, candidates, ErrNotSupported)
}

func (a *Agent) chooseBackend(r *Request, forced Backend) (Backend, string, error) {
	pl := placement{self: r.self, localType: r.local.typ, remoteType: r.remote.typ, shmOff: a.cfg.DisableSHM,
		ipcOff: a.cfg.DisableCUDAIPC, allMapped: true}
	if !r.self {
		pl.sameHost, pl.pvm = r.ra.sameHost, r.ra.pvm
		for i := range r.segs {
			if s := &r.segs[i]; s.rmem == nil && s.rdev == 0 {
				pl.allMapped = false
				break
			}
		}
	}
	return selectBackend(pl, forced)
}

// The cost model: a fixed cost per request, per piece and per part, plus the
// bytes at the backend's bandwidth. The figures are this VM's, measured with
// gccl-p2pbench (docs/P2P.md); they rank backends and size batches, not
// promise times.
type costModel struct {
	fixed, perPiece, perPart time.Duration
	bytesPerSec              float64
}

var costs = map[Backend]costModel{
	BackendLocal: {fixed: 200 * time.Nanosecond, perPiece: 20 * time.Nanosecond, bytesPerSec: 7e9},
	BackendSHM:   {fixed: 300 * time.Nanosecond, perPiece: 20 * time.Nanosecond, perPart: 5 * time.Microsecond, bytesPerSec: 7e9},
	BackendPVM:   {fixed: 2 * time.Microsecond, perPiece: 100 * time.Nanosecond, perPart: 5 * time.Microsecond, bytesPerSec: 5e9},
	BackendTCP:   {fixed: 40 * time.Microsecond, perPiece: 300 * time.Nanosecond, perPart: 10 * time.Microsecond, bytesPerSec: 1.5e9},
	BackendFile:  {fixed: 20 * time.Microsecond, perPiece: 2 * time.Microsecond, bytesPerSec: 1e9},
	// Not measured: a CUDA copy's launch cost and an H100's copy engines
	// over PCIe 5 (host<->device) or NVLink (device<->device); only the
	// fake driver has run.
	BackendCUDAIPC: {fixed: 10 * time.Microsecond, perPiece: 2 * time.Microsecond, perPart: 5 * time.Microsecond, bytesPerSec: 20e9},
}

// estimateCost is the model's time for pieces merged pieces of bytes in
// parts parts on backend b.
func estimateCost(b Backend, pieces int, bytes uint64, parts int) time.Duration {
	c, ok := costs[b]
	if !ok {
		return 0
	}
	t := c.fixed + time.Duration(pieces)*c.perPiece + time.Duration(parts)*c.perPart
	return t + time.Duration(float64(bytes)/c.bytesPerSec*1e9)
}
