package p2p

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gccl/gccl/internal/logx"
	"github.com/gccl/gccl/internal/netif"
	"github.com/gccl/gccl/internal/shmem"
)

// Defaults for Config.
const (
	DefaultRequestTimeout = 30 * time.Second
	DefaultPeerTimeout    = 10 * time.Second
	DefaultFileQueueDepth = 4
	DefaultFileBlockSize  = 1 << 20
	DefaultInlineLimit    = 256 << 10
	DefaultDialTimeout    = 10 * time.Second
	DefaultStallTimeout   = 10 * time.Second
	DefaultNotifQueue     = 64 << 20
	DefaultRDMAQPs        = 4
	DefaultRDMAMaxMRSize  = 1 << 30
	DefaultRDMARegCache   = 64 << 30
)

// Config tunes an Agent; the zero value works on one host and across hosts.
type Config struct {
	// ListenAddr is where the agent accepts peers (host:port). Empty: port 0
	// on the interface GCCL_SOCKET_IFNAME selects (as the tcp transport
	// does); "-": no listener (this agent only initiates).
	ListenAddr string
	// DisableSHM forces peers on this host to tcp (also GCCL_SHM_DISABLE=1).
	DisableSHM bool
	// DisablePVM turns process_vm_readv/writev off (also
	// GCCL_P2P_PVM_DISABLE=1): heap regions of local peers then go over tcp.
	DisablePVM bool
	// DisableCUDAIPC stops this agent opening the CUDA IPC handles of local
	// peers' VRAM regions (also GCCL_P2P_CUDAIPC_DISABLE=1; DisableSHM
	// implies it): their VRAM is then reached over tcp.
	DisableCUDAIPC bool
	// RequireToken refuses a connection whose peer did not present this
	// agent's token, that is, did not load its metadata (Connect then fails).
	RequireToken bool
	// TLS encrypts the connections between agents with TLS 1.3 (also
	// GCCL_TLS=1); every agent that talks to this one must use it too.
	// Keys derive from the agents' tokens, so loading an agent's metadata
	// is what makes its key trusted (see p2p/tls.go).
	TLS bool
	// RequestTimeout fails a request not finished this long after Post with
	// ErrTimeout (0: DefaultRequestTimeout): a tcp one when the watchdog
	// next looks, the others (local, shm, pvm, file, cudaipc) at their next
	// block, once the goroutines copying have stopped; a block already in a
	// system call or on the device runs to its end. What moved before is a
	// partial transfer; the request's memory is not touched afterwards.
	RequestTimeout time.Duration
	// PeerTimeout drops a peer that sent nothing, keepalives included, for
	// this long (0: DefaultPeerTimeout).
	PeerTimeout time.Duration
	// NotifQueue bounds the bytes of one peer's notifications waiting for
	// GetNotifs (0: DefaultNotifQueue; each counts notifOverhead more than
	// its length). A peer that sends past it is dropped, its requests
	// failing with an error that names it: the agent neither holds
	// unbounded memory for a peer nor loses a notification silently.
	NotifQueue int
	// FileQueueDepth is how many file blocks are in flight at once (0:
	// DefaultFileQueueDepth); FileBlockSize the size of one (0:
	// DefaultFileBlockSize, a multiple of 4096).
	FileQueueDepth int
	FileBlockSize  int
	// DisableIOURing runs file blocks on FileQueueDepth goroutines instead
	// of io_uring (also GCCL_P2P_IOURING_DISABLE=1); io_uring is used only
	// where the kernel allows it in any case.
	DisableIOURing bool
	// CopyThreads is how many goroutines copy one large shared-memory
	// transfer (0: GOMAXPROCS).
	CopyThreads int
	// InlineLimit: a request of at most this many bytes to a peer on this
	// host runs inside Post when nothing is queued before it (0:
	// DefaultInlineLimit, <0: never).
	InlineLimit int
	// SHMDir is where Alloc creates segments (empty: /dev/shm).
	SHMDir string
	// GDS moves VRAM<->FILE transfers with NVIDIA's cuFile library
	// (GPUDirect Storage, libcufile.so.0) instead of pinned bounce buffers
	// (also GCCL_P2P_GDS=1). Where the library does not load, or refuses a
	// file, the transfer bounces as without it (logged once). Off by
	// default until it has run on GPU hardware (docs/HARDWARE.md).
	GDS bool
	// DisableRDMA keeps the agent off its RDMA device (also
	// GCCL_P2P_RDMA_DISABLE=1, or GCCL_IB_DISABLE=1 for all of gccl): peers
	// on other hosts are then reached over tcp.
	DisableRDMA bool
	// TelemetryFile, when set, receives one JSON line per finished post
	// (p2p/telemetry.go): %r in it is the agent's name, %p the process ID,
	// %h the host name. Empty means GCCL_TELEMETRY_FILE decides.
	TelemetryFile string
	// RDMASameHost uses RDMA between agents of one host too (also
	// GCCL_P2P_RDMA_SAME_HOST=1), when shared memory and process_vm are off
	// or unusable, instead of tcp: two processes on one NIC, for tests and
	// benchmarks. Between hosts RDMA is used whenever both agents have a
	// device on a common fabric.
	RDMASameHost bool
	// RDMAQPs is how many RC queue pairs carry one agent's requests to a
	// peer (0: DefaultRDMAQPs); a large transfer is striped over them.
	RDMAQPs int
	// RDMAMaxMRSize is the largest memory region registered as one MR (0:
	// DefaultRDMAMaxMRSize); longer regions become several.
	RDMAMaxMRSize int64
	// RDMARegCacheBytes bounds the bytes registered with the RDMA device;
	// idle registrations are evicted first (0: DefaultRDMARegCache).
	RDMARegCacheBytes int64
	// Strict makes it an error (instead of a warning and tcp) when RDMA was
	// expected towards a peer, both agents having a device on a common
	// fabric, but cannot be used (also GCCL_STRICT=1).
	Strict bool
	// StallTimeout fails a tcp or rdma request that made no progress (no
	// byte acknowledged, landed or sent, no completion) for this long while
	// its peer is alive, with ErrStalled (0: DefaultStallTimeout; <0: off).
	// A dead or silent peer is ErrRemoteDisconnect instead.
	StallTimeout time.Duration
	// Logger receives the agent's records (nil: GCCL_DEBUG, subsystem P2P).
	Logger *slog.Logger
}

func (c Config) withDefaults() (Config, error) {
	if os.Getenv("GCCL_SHM_DISABLE") == "1" {
		c.DisableSHM = true
	}
	if os.Getenv("GCCL_P2P_PVM_DISABLE") == "1" {
		c.DisablePVM = true
	}
	if os.Getenv("GCCL_P2P_IOURING_DISABLE") == "1" {
		c.DisableIOURing = true
	}
	if os.Getenv("GCCL_P2P_GDS") == "1" {
		c.GDS = true
	}
	if os.Getenv("GCCL_P2P_RDMA_DISABLE") == "1" {
		c.DisableRDMA = true
	}
	if os.Getenv("GCCL_P2P_RDMA_SAME_HOST") == "1" {
		c.RDMASameHost = true
	}
	if os.Getenv("GCCL_STRICT") == "1" {
		c.Strict = true
	}
	if c.StallTimeout == 0 {
		c.StallTimeout = DefaultStallTimeout
	}
	if c.RDMAQPs == 0 {
		c.RDMAQPs = DefaultRDMAQPs
	}
	if c.RDMAMaxMRSize == 0 {
		c.RDMAMaxMRSize = DefaultRDMAMaxMRSize
	}
	if c.RDMARegCacheBytes == 0 {
		c.RDMARegCacheBytes = DefaultRDMARegCache
	}
	if os.Getenv("GCCL_P2P_CUDAIPC_DISABLE") == "1" || c.DisableSHM {
		c.DisableCUDAIPC = true
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.PeerTimeout == 0 {
		c.PeerTimeout = DefaultPeerTimeout
	}
	if c.NotifQueue == 0 {
		c.NotifQueue = DefaultNotifQueue
	}
	if c.FileQueueDepth == 0 {
		c.FileQueueDepth = DefaultFileQueueDepth
	}
	if c.FileBlockSize == 0 {
		c.FileBlockSize = DefaultFileBlockSize
	}
	if c.CopyThreads <= 0 {
		c.CopyThreads = runtimeProcs()
	}
	if c.InlineLimit == 0 {
		c.InlineLimit = DefaultInlineLimit
	}
	if c.Logger == nil {
		c.Logger = logx.Default()
	}
	c.Logger = c.Logger.With("subsys", "P2P")
	switch {
	case c.RequestTimeout < 0 || c.PeerTimeout < 0:
		return c, errors.New("p2p: negative timeout")
	case c.NotifQueue < 0:
		return c, fmt.Errorf("p2p: negative notification queue %d", c.NotifQueue)
	case c.FileQueueDepth < 1 || c.FileQueueDepth > 1024:
		return c, fmt.Errorf("p2p: file queue depth %d outside [1, 1024]", c.FileQueueDepth)
	case c.FileBlockSize < directAlign || c.FileBlockSize%directAlign != 0 || c.FileBlockSize > 1<<30:
		return c, fmt.Errorf("p2p: file block size %d is not a multiple of %d up to 1 GiB", c.FileBlockSize, directAlign)
	case c.RDMAQPs < 1 || c.RDMAQPs > maxRDMAQPs:
		return c, fmt.Errorf("p2p: %d RDMA QPs per peer (1 to %d)", c.RDMAQPs, maxRDMAQPs)
	case c.RDMAMaxMRSize < 4096 || c.RDMARegCacheBytes < 0:
		return c, fmt.Errorf("p2p: RDMA MR size %d (at least 4096), registration cache %d bytes", c.RDMAMaxMRSize, c.RDMARegCacheBytes)
	}
	return c, nil
}

// Agent is one process's endpoint: its registered memory, the metadata of
// the peers it loaded, their connections and its requests. Its methods are
// safe for concurrent use.
type Agent struct {
	name  string
	cfg   Config
	log   *slog.Logger
	host  string
	jobID string // names this agent's shared-memory segments

	token    [tokenLen]byte
	tokenMem []byte    // the token again, on the heap: peers probe pvm by reading it
	tls      *agentTLS // nil without TLS

	ln   net.Listener
	addr string

	mu         sync.RWMutex
	closed     bool
	gen        uint64
	nextRegion uint32
	local      regionTable        // what peers see
	regions    map[uint32]*Region // by ID
	cache      map[regionKey]*Region
	remotes    map[string]*remoteAgent
	peers      map[string]*peer  // the connection used to send to each agent
	conns      map[*peer]bool    // every live connection
	handshakes map[net.Conn]bool // accepted connections before their hello
	lanes      map[string]*lane

	notifMu    sync.Mutex
	notifs     map[string][][]byte
	notifBytes map[string]int // per sender, what notifs holds (notifOverhead each)
	failures   []PeerFailure
	notifCh    chan struct{}

	nextReq atomic.Uint64
	logged  sync.Map // "peer/backend" already logged at INFO

	files *filePool
	copy  *copyPool
	gpu   gpuState // the CUDA driver, loaded on first use

	rdma    *rdmaDevice // nil: no RDMA (rdmaErr says why)
	rdmaErr error

	postMu sync.Mutex
	posts  map[*Request]struct{} // posts in flight (DeregisterMem cancels those using its region)

	done chan struct{}
	wg   sync.WaitGroup

	tel agentTelemetry // per-post records and totals (telemetry.go)
}

// New starts the agent called name, unique among the agents that will talk
// to it.
func New(name string, cfg Config) (*Agent, error) {
	if name == "" || len(name) > maxNameLen {
		return nil, fmt.Errorf("p2p: agent name %q (1 to %d bytes)", name, maxNameLen)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	a := &Agent{
		name: name, cfg: cfg, log: cfg.Logger, host: hostIdentity(),
		regions: map[uint32]*Region{}, cache: map[regionKey]*Region{},
		remotes: map[string]*remoteAgent{}, peers: map[string]*peer{}, conns: map[*peer]bool{}, handshakes: map[net.Conn]bool{},
		lanes: map[string]*lane{}, notifs: map[string][][]byte{}, notifBytes: map[string]int{}, notifCh: make(chan struct{}, 1),
		done: make(chan struct{}), nextRegion: 1, posts: map[*Request]struct{}{},
	}
	if _, err := rand.Read(a.token[:]); err != nil {
		return nil, fmt.Errorf("p2p: random token: %w", err)
	}
	a.tokenMem = append(make([]byte, 0, tokenLen), a.token[:]...)
	if a.tls, err = newAgentTLS(&cfg, a.token); err != nil {
		return nil, err
	}
	var id [6]byte
	rand.Read(id[:])
	a.jobID = fmt.Sprintf("p2p-%x", id)
	a.nextReq.Store(uint64(time.Now().UnixNano()) << 16) // distinct from a restarted agent's IDs
	a.gpu.log = a.log
	a.initTelemetry()
	a.copy = newCopyPool(cfg.CopyThreads)
	a.files = newFilePool(cfg.FileQueueDepth, cfg.FileBlockSize, !cfg.DisableIOURing)
	if cfg.DisableRDMA {
		a.rdmaErr = fmt.Errorf("%w: RDMA is disabled (GCCL_P2P_RDMA_DISABLE=1 or Config.DisableRDMA)", ErrNotSupported)
	} else if a.rdma, a.rdmaErr = openRDMA(cfg, a.log, &a.gpu); a.rdmaErr != nil {
		a.log.Debug("p2p has no RDMA device", "why", a.rdmaErr)
	}
	if cfg.ListenAddr != "-" {
		if err := a.listen(); err != nil {
			a.copy.close()
			a.files.close()
			if a.rdma != nil {
				a.rdma.close()
			}
			return nil, err
		}
	}
	a.wg.Add(1)
	go a.watchdog()
	rdma := "off"
	if a.rdma != nil {
		rdma = a.rdma.info.String()
	}
	a.log.Info("p2p agent started", "name", name, "addr", a.addr, "shm", !cfg.DisableSHM, "pvm", !cfg.DisablePVM, "rdma", rdma,
		"file_engine", a.files.engine)
	return a, nil
}

func (a *Agent) listen() error {
	addr := a.cfg.ListenAddr
	if addr == "" {
		ifs, err := netif.Select(netif.FromEnv())
		if err != nil {
			return fmt.Errorf("p2p: %w", err)
		}
		addr = netip.AddrPortFrom(ifs[0].Addr(), 0).String()
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("p2p: listening on %s: %w", addr, err)
	}
	a.ln, a.addr = ln, ln.Addr().String()
	a.wg.Add(1)
	go a.acceptLoop()
	return nil
}

// Name is the agent's name.
func (a *Agent) Name() string { return a.name }

// Addr is the host:port peers connect to ("" without a listener).
func (a *Agent) Addr() string { return a.addr }

// regionKey is the cache key of a registration.
type regionKey struct {
	typ       MemType
	base, len uint64
	file      string
}

// Region is a registered piece of memory or of a file. Descriptors name its
// bytes by address (DRAM), by device address and device (VRAM) or by file
// offset and ID (FILE).
type Region struct {
	a      *Agent
	info   regionInfo
	mem    []byte        // DRAM
	seg    *shmem.Region // DRAM from Alloc
	file   *fileHandle   // FILE
	vram   *vramMem      // VRAM
	refs   int           // registrations, under a.mu
	busy   atomic.Int32
	pinned atomic.Bool // DRAM registered with the CUDA driver (unpinned by free)
	rd     *regEntry   // its registration with the RDMA device (nil: none)
}

// ID is the region's identifier, unique within its agent.
func (r *Region) ID() uint32 { return r.info.ID }

// Type is the region's memory type.
func (r *Region) Type() MemType { return r.info.Type }

// Addr is the region's first address (DRAM, VRAM: a device address) or
// file offset (FILE).
func (r *Region) Addr() uint64 { return r.info.Base }

// Len is the region's size in bytes.
func (r *Region) Len() uint64 { return r.info.Len }

// Bytes is a DRAM region's memory (nil for VRAM and FILE).
func (r *Region) Bytes() []byte { return r.mem }

// Shared reports whether peers on this host map the region (Alloc).
func (r *Region) Shared() bool { return r.seg != nil }

// Desc describes n bytes of the region starting off bytes into it (for
// VRAM with the region's device as DevID, for FILE its ID).
func (r *Region) Desc(off, n uint64) Desc {
	d := Desc{Addr: r.info.Base + off, Len: n}
	switch r.info.Type {
	case FILE:
		d.DevID = r.info.ID
	case VRAM:
		d.DevID = r.info.Dev
	}
	return d
}

// AddrOf is the address of b's first byte, for descriptors of DRAM regions.
func AddrOf(b []byte) uint64 {
	if cap(b) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}

// Alloc allocates size bytes of shared memory and registers them: peers on
// this host map the region when they load this agent's metadata, so their
// transfers to and from it are a memory copy by the initiator, with no work
// here. Off Linux it returns ErrNotSupported.
func (a *Agent) Alloc(size int) (*Region, error) {
	seg, err := shmem.AllocIn(a.cfg.SHMDir, a.jobID, 0, size)
	if err != nil {
		if errors.Is(err, shmem.ErrNotSupported) {
			return nil, fmt.Errorf("p2p: Alloc: %w", ErrNotSupported)
		}
		return nil, fmt.Errorf("p2p: Alloc: %w", err)
	}
	mem := seg.Bytes()
	rd := a.rdmaRegister(regKey{typ: DRAM, base: AddrOf(mem), len: uint64(len(mem))})
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		if rd != nil {
			a.rdma.cache.release(rd)
		}
		seg.Close()
		return nil, ErrClosed
	}
	r := a.addRegionLocked(regionInfo{Type: DRAM, Flags: regionSHM, Base: AddrOf(mem), Len: uint64(len(mem)), SHM: seg.Name()})
	r.mem, r.seg, r.rd = mem, seg, rd
	a.log.Debug("allocated shared region", "id", r.info.ID, "bytes", size, "segment", seg.Name())
	return r, nil
}

// RegisterMem registers buf (DRAM on the heap, or part of an Alloc'd
// region). Registering a range that an existing DRAM region holds returns
// that region, counted once more (a cache hit: no system call, no
// allocation); each registration needs its own DeregisterMem. The region
// returned may then be larger than buf and start before it: describe buf's
// bytes by address (AddrOf(buf)), or with Desc offsets from Region.Addr.
// GPU memory is registered with RegisterVRAM.
func (a *Agent) RegisterMem(buf []byte) (*Region, error) {
	if len(buf) == 0 {
		return nil, errors.New("p2p: RegisterMem of an empty buffer")
	}
	base, n := AddrOf(buf), uint64(len(buf))
	a.mu.Lock()
	if r, err := a.memHitLocked(base, n); r != nil || err != nil {
		a.mu.Unlock()
		if r != nil && a.rdma != nil {
			a.rdma.cache.hit()
		}
		return r, err
	}
	var rd *regEntry
	if a.rdma != nil {
		// Registering with the device takes system calls and pins the
		// memory: outside the lock, then look again.
		a.mu.Unlock()
		rd = a.rdmaRegister(regKey{typ: DRAM, base: base, len: n})
		a.mu.Lock()
		if r, err := a.memHitLocked(base, n); r != nil || err != nil {
			a.mu.Unlock() // registered meanwhile by another goroutine, or closed
			if rd != nil {
				a.rdma.cache.release(rd)
			}
			return r, err
		}
	}
	defer a.mu.Unlock()
	r := a.addRegionLocked(regionInfo{Type: DRAM, Base: base, Len: n})
	r.mem, r.rd = buf, rd
	return r, nil
}

// memHitLocked is the registered DRAM region holding [base, base+n),
// counted once more (nil if none).
func (a *Agent) memHitLocked(base, n uint64) (*Region, error) {
	if a.closed {
		return nil, ErrClosed
	}
	if r, ok := a.cache[regionKey{typ: DRAM, base: base, len: n}]; ok {
		r.refs++
		return r, nil
	}
	if info, err := a.local.find(DRAM, base, n, 0); err == nil {
		r := a.regions[info.ID]
		r.refs++
		return r, nil
	}
	return nil, nil
}

func (a *Agent) addRegionLocked(info regionInfo) *Region {
	info.ID = a.nextRegion
	a.nextRegion++
	r := &Region{a: a, info: info, refs: 1}
	a.regions[info.ID] = r
	a.local.add(info)
	a.cache[regionKey{typ: info.Type, base: info.Base, len: info.Len}] = r
	a.gen++
	return r
}

// DeregisterMem undoes one registration of r. The last one first fails the
// requests in flight that use the region (they end with ErrCanceled, once
// nothing of them can still land: Request.Cancel), then removes the
// region, deregisters it from the RDMA device (keys peers hold are refused
// from then on), tells connected peers, and frees its shared memory or
// file; it fails with ErrRegionBusy while a prepared list or a request
// still holds it (Release them first).
func (a *Agent) DeregisterMem(r *Region) error {
	if r == nil || r.a != a {
		return errors.New("p2p: DeregisterMem of a region of another agent")
	}
	a.mu.Lock()
	if a.regions[r.info.ID] != r {
		a.mu.Unlock()
		return fmt.Errorf("p2p: region %d is not registered", r.info.ID)
	}
	if r.refs > 1 {
		r.refs--
		a.mu.Unlock()
		return nil
	}
	a.mu.Unlock()
	// Requests in flight on the region fail first, and nothing of them can
	// land once they have (Cancel).
	a.cancelUsers(r)
	a.mu.Lock()
	if a.regions[r.info.ID] != r {
		a.mu.Unlock()
		return fmt.Errorf("p2p: region %d is not registered", r.info.ID)
	}
	if r.refs > 1 {
		r.refs--
		a.mu.Unlock()
		return nil
	}
	if n := r.busy.Load(); n > 0 {
		a.mu.Unlock()
		return fmt.Errorf("%w: region %d has %d users", ErrRegionBusy, r.info.ID, n)
	}
	a.removeRegionLocked(r)
	peers := a.livePeersLocked()
	a.mu.Unlock()
	for _, p := range peers {
		p.sendInvalidate(r.info.ID)
	}
	return r.free()
}

func (a *Agent) removeRegionLocked(r *Region) {
	r.refs = 0
	delete(a.regions, r.info.ID)
	a.local.remove(r.info.ID)
	for k, v := range a.cache {
		if v == r {
			delete(a.cache, k)
		}
	}
	a.gen++
}

func (r *Region) free() error {
	var err error
	if r.rd != nil {
		// Before the memory goes: once this returns, the device no longer
		// touches it and keys peers hold are refused.
		r.a.rdma.cache.release(r.rd)
		r.rd = nil
	}
	if r.pinned.Load() {
		r.a.gpu.unpin(r.mem) // before the memory goes
	}
	r.vram = nil
	if r.seg != nil {
		err = r.seg.Close()
	}
	if r.file != nil {
		err = errors.Join(err, r.file.close())
	}
	r.mem = nil
	return err
}

// pinLocal finds the local region holding a descriptor and pins it (busy)
// so that it cannot be deregistered while in use.
func (a *Agent) pinLocal(typ MemType, addr, n uint64, dev uint32) (*Region, error) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	info, err := a.local.find(typ, addr, n, dev)
	if err != nil {
		return nil, err
	}
	r := a.regions[info.ID]
	r.busy.Add(1)
	return r, nil
}

// pinRegion pins region id if it holds [off, off+n): the target's check of
// every descriptor a peer sends.
func (a *Agent) pinRegion(id uint32, off, n uint64) (*Region, error) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	r, ok := a.regions[id]
	if !ok {
		return nil, fmt.Errorf("%w: no region %d", ErrOutOfBounds, id)
	}
	if off < r.info.Base || off+n < off || off+n > r.info.end() {
		return nil, fmt.Errorf("%w: [%#x, +%d) is outside region %d [%#x, +%d)", ErrOutOfBounds, off, n, id, r.info.Base, r.info.Len)
	}
	r.busy.Add(1)
	return r, nil
}

// LocalMetadata is this agent's metadata: a versioned, self-describing,
// checksummed blob that peers pass to LoadRemote. Register first: regions
// registered later reach a peer only with a newer blob.
func (a *Agent) LocalMetadata() []byte {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return encodeMetadata(a.infoLocked())
}

// snapshot is this agent's metadata now.
func (a *Agent) snapshot() *agentInfo {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.infoLocked()
}

func (a *Agent) infoLocked() *agentInfo {
	m := &agentInfo{
		Gen: a.gen, Name: a.name, Host: a.host, Addr: a.addr, Pid: uint32(os.Getpid()),
		Token: a.token, Probe: AddrOf(a.tokenMem), Regions: a.local.all(),
	}
	if a.rdma != nil {
		info := a.rdma.info
		m.RDMA = &info
		for _, ri := range m.Regions {
			if r := a.regions[ri.ID]; r != nil && r.rd != nil {
				if m.Keys == nil {
					m.Keys = map[uint32][]rkeyRange{}
				}
				m.Keys[ri.ID] = r.rd.keys
				// Its keys leave this agent: they die with the region.
				a.rdma.cache.expose(r.rd)
			}
		}
	}
	return m
}

// LoadRemote loads a peer's metadata and connects to it, and returns its
// name. Peers on this host get their shared regions mapped and
// process_vm_readv probed here, once. A blob older than the one loaded is
// ignored; a newer one replaces it.
func (a *Agent) LoadRemote(ctx context.Context, blob []byte) (string, error) {
	info, err := decodeMetadata(blob)
	if err != nil {
		return "", err
	}
	if info.Name == a.name {
		return "", fmt.Errorf("p2p: metadata of agent %q is this agent's own", info.Name)
	}
	if _, err := a.loadInfo(info); err != nil {
		return "", err
	}
	p, err := a.connectPeer(ctx, info)
	if err != nil {
		a.Invalidate(info.Name)
		return "", err
	}
	if err := a.connectRDMA(p, info); err != nil {
		a.Invalidate(info.Name)
		return "", err
	}
	return info.Name, nil
}

// connectRDMA connects the RDMA channel to a peer that RDMA is expected to
// reach (both agents have a device on a common fabric, on two hosts or with
// Config.RDMASameHost), at LoadRemote: a failure is a warning (the peer is
// reached over tcp), or the error under Config.Strict.
func (a *Agent) connectRDMA(p *peer, info *agentInfo) error {
	if a.rdma == nil || info.RDMA == nil || info.Host == a.host && !a.cfg.RDMASameHost {
		return nil
	}
	if ok, _ := sameFabric(&a.rdma.info, info.RDMA); !ok {
		return nil
	}
	_, err := p.rdmaChannel()
	switch {
	case err == nil:
		return nil
	case a.cfg.Strict:
		return errStrictRDMA(info.Name, err.Error())
	}
	a.log.Warn("p2p expected RDMA to "+info.Name+" but cannot use it; using tcp", "peer", info.Name, "why", err)
	return nil
}

// loadInfo makes or refreshes the peer's remoteAgent.
func (a *Agent) loadInfo(info *agentInfo) (*remoteAgent, error) {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil, ErrClosed
	}
	old := a.remotes[info.Name]
	if old != nil && old.info.Token == info.Token && old.info.Gen >= info.Gen {
		a.mu.Unlock()
		return old, nil
	}
	a.mu.Unlock()
	// Mapping and probing happen outside the lock: they take system calls.
	ra := newRemoteAgent(a, info, old)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		ra.invalidate()
		return nil, ErrClosed
	}
	if cur := a.remotes[info.Name]; cur != old {
		ra.invalidate() // a concurrent load won
		return cur, nil
	}
	a.remotes[info.Name] = ra
	if old != nil {
		old.invalidate()
	}
	a.log.Info("p2p loaded remote agent", "peer", info.Name, "regions", len(info.Regions), "same_host", ra.sameHost,
		"shm_mapped", len(ra.maps), "cudaipc_mapped", len(ra.vmaps), "pvm", ra.pvm, "addr", info.Addr, "gen", info.Gen)
	return ra, nil
}

// Invalidate forgets a peer: its metadata, its mappings (once no transfer
// uses them) and its connection; its in-flight requests fail with
// ErrRemoteDisconnect.
func (a *Agent) Invalidate(peerName string) error {
	a.mu.Lock()
	ra := a.remotes[peerName]
	delete(a.remotes, peerName)
	var ps []*peer
	for p := range a.conns {
		if p.name == peerName {
			ps = append(ps, p)
		}
	}
	a.mu.Unlock()
	for _, p := range ps {
		p.fail(fmt.Errorf("%w: %s invalidated", ErrRemoteDisconnect, peerName), true)
	}
	if ra == nil {
		return fmt.Errorf("%w: %q", ErrUnknownPeer, peerName)
	}
	ra.invalidate()
	return nil
}

// remote returns the loaded peer.
func (a *Agent) remote(name string) (*remoteAgent, error) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.closed {
		return nil, ErrClosed
	}
	ra := a.remotes[name]
	if ra == nil {
		return nil, fmt.Errorf("%w: %q (load its metadata first)", ErrUnknownPeer, name)
	}
	return ra, nil
}

func (a *Agent) livePeersLocked() []*peer {
	ps := make([]*peer, 0, len(a.conns))
	for p := range a.conns {
		ps = append(ps, p)
	}
	return ps
}

// notifOverhead is what one queued notification counts besides its bytes
// (its slice header and share of the map), so that empty ones are bounded
// too.
const notifOverhead = 64

// deliverNotif queues a notification from peer for GetNotifs, or refuses
// it when the peer's queue would pass Config.NotifQueue: the caller then
// drops the peer with the error.
func (a *Agent) deliverNotif(from string, msg []byte) error {
	if err := a.queueNotif(from, msg); err != nil {
		return err
	}
	a.signalNotif()
	return nil
}

// queueNotif makes msg from peer from visible to GetNotifs, without waking
// a WaitNotifs (signalNotif does): the tcp target queues a notification
// before it acknowledges the write, and wakes the consumer after.
func (a *Agent) queueNotif(from string, msg []byte) error {
	a.notifMu.Lock()
	held := a.notifBytes[from] + len(msg) + notifOverhead
	if held > a.cfg.NotifQueue {
		a.notifMu.Unlock()
		return fmt.Errorf("p2p: %s: notifications waiting for GetNotifs would hold %d bytes, more than the %d allowed per peer (Config.NotifQueue)",
			from, held, a.cfg.NotifQueue)
	}
	a.notifBytes[from] = held
	a.notifs[from] = append(a.notifs[from], msg)
	a.notifMu.Unlock()
	return nil
}

// signalNotif wakes a WaitNotifs.
func (a *Agent) signalNotif() {
	select {
	case a.notifCh <- struct{}{}:
	default:
	}
}

// GetNotifs returns the notifications received since the last call, by
// sender. Notifications from one sender are in the order its requests were
// posted, and each is seen only after the data of its request (or part).
func (a *Agent) GetNotifs() map[string][][]byte {
	a.notifMu.Lock()
	defer a.notifMu.Unlock()
	if len(a.notifs) == 0 {
		return nil
	}
	out := a.notifs
	a.notifs = map[string][][]byte{}
	clear(a.notifBytes)
	return out
}

// WaitNotifs blocks until there are notifications, then returns them as
// GetNotifs does.
func (a *Agent) WaitNotifs(ctx context.Context) (map[string][][]byte, error) {
	for {
		if n := a.GetNotifs(); n != nil {
			return n, nil
		}
		select {
		case <-a.notifCh:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-a.done:
			return nil, ErrClosed
		}
	}
}

// Close says goodbye to the peers, fails the requests still in flight with
// ErrClosed (copies and file I/O stop at their next block), frees every
// region and mapping and stops the agent's goroutines. It is idempotent.
func (a *Agent) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	close(a.done)
	conns := a.livePeersLocked()
	remotes := a.remotes
	a.remotes = map[string]*remoteAgent{}
	lanes := a.lanes
	var hs []net.Conn
	for c := range a.handshakes {
		hs = append(hs, c)
	}
	a.mu.Unlock()
	if a.ln != nil {
		a.ln.Close()
	}
	for _, c := range hs {
		c.Close()
	}
	for _, p := range conns {
		p.sendBye()
		p.fail(ErrClosed, false)
	}
	for _, l := range lanes {
		l.close()
	}
	for _, ra := range remotes {
		ra.invalidate()
	}
	a.wg.Wait()
	a.copy.close()
	a.files.close()
	a.mu.Lock()
	var err error
	for _, r := range a.regions {
		a.removeRegionLocked(r)
		err = errors.Join(err, r.free())
	}
	a.mu.Unlock()
	if a.rdma != nil {
		err = errors.Join(err, a.rdma.close())
	}
	err = errors.Join(err, a.gpu.close())
	shmem.CleanJob(a.cfg.SHMDir, a.jobID)
	a.telClose()
	a.log.Info("p2p agent closed", "name", a.name)
	return err
}

// logBackend logs the first use of each backend towards each peer at INFO,
// and every use at TRACE.
func (a *Agent) logBackend(peerName string, b Backend, why string) {
	key := peerName + "/" + b.String()
	if _, seen := a.logged.LoadOrStore(key, true); !seen {
		a.log.Info("p2p transfers to "+peerName+" use "+b.String(), "peer", peerName, "backend", b.String(), "why", why)
	}
}

func hostIdentity() string {
	h, _ := os.Hostname()
	if id := bootID(); id != "" {
		h += "/" + id
	}
	return h
}
