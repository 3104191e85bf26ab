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
	// BackendRDMA moves the bytes with RDMA READ and WRITE between regions
	// registered with both agents' RDMA devices (GPUDirect RDMA for VRAM);
	// the target runs no code per byte.
	BackendRDMA
)

func (b Backend) String() string {
	if b == BackendAuto {
		return "auto"
	}
	if s := specOf(b); s != nil {
		return s.name
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
	// rdma: both agents have an RDMA device on a common fabric, every
	// region of the request is registered with it, and the channel is up.
	rdma         bool
	rdmaSameHost bool // Config.RDMASameHost
}

// vram reports whether either end is VRAM.
func (pl placement) vram() bool { return pl.localType == VRAM || pl.remoteType == VRAM }

// peerDRAM reports whether the target is a peer's DRAM (not this agent,
// not VRAM, not a file).
func (pl placement) peerDRAM() bool {
	return !pl.self && pl.remoteType != FILE && pl.remoteType != VRAM
}

// backend is one way of moving a request's bytes. Each lives in its own
// file (backend_<name>.go) with its backendSpec, listed once in backends.
type backend interface {
	// serves reports whether the backend can move a request whose ends
	// are placed as pl, and why it is the one to use when it comes first
	// among those in backends that can (the reason is logged). It is
	// pure: no I/O, no locks.
	serves(pl placement) (ok bool, why string)
	// prepare readies a request made for the backend, once, at
	// MakeRequest (say, pins the host memory that CUDA copies use).
	prepare(r *Request) error
	// run moves one post of r: each part's bytes, then the part's
	// notification (notifyPart), in part order, stopping between blocks
	// once r.stop says so (then returning r.halted()). It runs on the
	// goroutine that executes the post (its lane's, or Post's own for an
	// inline post), and its error finishes the post, unless the spec is
	// async: run then starts the post and returns nil, and the backend
	// finishes it (Request.finish) when the peer has answered.
	run(r *Request) error
}

// retirer is a backend whose goroutines may still be touching a post's
// memory after the post left flight (it timed out, say): complete calls
// retire before it reports the outcome, and retire returns once none is.
type retirer interface {
	retire(r *Request)
}

// backendSpec is a backend's entry in backends.
type backendSpec struct {
	backend
	kind Backend
	name string
	cost costModel
	// inline: a post of at most Config.InlineLimit bytes may run inside
	// Post when nothing is queued before it (the initiator copies).
	inline bool
	// initiatorChecks: the target runs nothing for a post, so the
	// initiator refuses at Post the regions the peer deregistered since
	// (the target refuses them itself on the others).
	initiatorChecks bool
	// async: run starts the post; the backend finishes it later.
	async bool
	// postInline: run only hands the post to the device (it is async), so
	// Post runs it on its own goroutine whenever nothing is queued before
	// it, whatever its size (unless InlineLimit < 0), and returns
	// StatusInProgress.
	postInline bool
	// postInlineIf: if set, postInline holds only for the posts it
	// accepts (tcp: small ones, whose frames never wait for the peer; a
	// large one would hold Post while it streams).
	postInlineIf func(*Request) bool
	// retirer is the backend's, if it is one (set by init: complete
	// asks on every post, without a type assertion).
	retirer retirer
}

// backends are the backends in order of preference: selection takes the
// first whose serves accepts a request's placement. A new backend is a file
// with its spec, a Backend constant and a line here.
var backends = []*backendSpec{
	&localSpec,
	&fileSpec,
	&cudaipcSpec,
	&shmSpec,
	&pvmSpec,
	&rdmaSpec,
	&tcpSpec,
}

func init() {
	for _, s := range backends {
		s.retirer, _ = s.backend.(retirer)
	}
}

// specOf is b's spec (nil for BackendAuto and unknown values).
func specOf(b Backend) *backendSpec {
	for _, s := range backends {
		if s.kind == b {
			return s
		}
	}
	return nil
}

// selectBackend picks the cheapest backend that can do the transfer (the
// first of backends whose serves accepts pl) and says why (logged).
// forced, if not BackendAuto, is checked instead.
func selectBackend(pl placement, forced Backend) (Backend, string, error) {
	var candidates []Backend
	var why string
	for _, s := range backends {
		ok, w := s.serves(pl)
		if !ok {
			continue
		}
		if len(candidates) == 0 {
			why = w
		}
		candidates = append(candidates, s.kind)
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
		ipcOff: a.cfg.DisableCUDAIPC, allMapped: true, rdmaSameHost: a.cfg.RDMASameHost}
	var rdmaWhy string
	if !r.self {
		pl.sameHost, pl.pvm = r.ra.sameHost, r.ra.pvm
		for i := range r.segs {
			if s := &r.segs[i]; s.rmem == nil && s.rdev == 0 {
				pl.allMapped = false
				break
			}
		}
		if r.remote.typ != FILE && (forced == BackendAuto || forced == BackendRDMA) {
			// Only when nothing before rdma in backends takes the request:
			// connecting the channel is a round trip.
			if pre, _, err := selectBackend(pl, BackendAuto); err == nil && pre == BackendTCP || forced == BackendRDMA {
				var expected bool
				pl.rdma, expected, rdmaWhy = a.rdmaPath(r)
				if !pl.rdma && expected {
					if a.cfg.Strict {
						return 0, "", errStrictRDMA(r.peer, rdmaWhy)
					}
					if _, seen := a.logged.LoadOrStore("rdma-warn/"+r.peer+"/"+rdmaWhy, true); !seen {
						a.log.Warn("p2p expected RDMA to "+r.peer+" but cannot use it; using tcp", "peer", r.peer, "why", rdmaWhy)
					}
				}
			}
		}
	}
	b, why, err := selectBackend(pl, forced)
	if err != nil && forced == BackendRDMA && rdmaWhy != "" {
		err = fmt.Errorf("%w (rdma: %s)", err, rdmaWhy)
	}
	return b, why, err
}

// The cost model: a fixed cost per request, per piece and per part, plus the
// bytes at the backend's bandwidth (each backend's spec has its figures,
// measured with gccl-p2pbench on the development VM, docs/P2P.md); they rank
// backends and size batches, not promise times.
type costModel struct {
	fixed, perPiece, perPart time.Duration
	bytesPerSec              float64
}

// estimateCost is the model's time for pieces merged pieces of bytes in
// parts parts on backend b.
func estimateCost(b Backend, pieces int, bytes uint64, parts int) time.Duration {
	spec := specOf(b)
	if spec == nil {
		return 0
	}
	return spec.cost.estimate(pieces, bytes, parts)
}

func (c costModel) estimate(pieces int, bytes uint64, parts int) time.Duration {
	t := c.fixed + time.Duration(pieces)*c.perPiece + time.Duration(parts)*c.perPart
	return t + time.Duration(float64(bytes)/c.bytesPerSec*1e9)
}
