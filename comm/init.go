package comm

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/gccl/gccl/bootstrap"
	"github.com/gccl/gccl/internal/units"
	"github.com/gccl/gccl/topo"
	"github.com/gccl/gccl/transport"
	"github.com/gccl/gccl/transport/shm"
)

// Multi-process slot geometry: bigger slots than in-process, since there is
// one mailbox per rank rather than one ring per pair in a shared heap.
const (
	defaultSlotSize  = 512 << 10
	defaultSlotCount = 4
)

// Init joins the job this process belongs to and returns its communicator.
// The job comes from cfg.Bootstrap, or from the environment: gccl-run's and
// torchrun's variables, Open MPI's, PMI's or Slurm's (see bootstrap.FromEnv).
// Without any, Init returns a communicator of one rank. With GCCL_JOIN=1
// (gccl-run --join), Init is Join: the process is a newcomer to a running
// job's Grow.
//
// Init is the expensive step (a rendezvous and two exchanges of
// descriptors): call it once per job and reuse the Comm. The connection to
// a peer over shared memory (its slot ring) is made when the rank first
// sends to it, so a rank's memory grows with the peers its collectives use.
func Init(ctx context.Context, cfg *Config) (*Comm, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	if cfg.Bootstrap == nil && newcomerFromEnv() {
		return Join(ctx, cfg) // grow.go: a replacement runs the job's program
	}
	var bcfg bootstrap.Config
	found := false
	if cfg.Bootstrap != nil {
		bcfg, found = *cfg.Bootstrap, true
	} else {
		var err error
		if bcfg, found, err = bootstrap.FromEnv(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
		}
	}
	if !found {
		cs, err := InitLocal(1, cfg)
		if err != nil {
			return nil, err
		}
		return cs[0], nil
	}
	start := time.Now()
	client, err := bootstrap.Join(ctx, bcfg)
	if err != nil {
		return nil, err
	}
	joined := time.Now()
	c, err := bootRendezvous{client}.open(ctx, cfg, client.JobID())
	if err != nil {
		return nil, err
	}
	// Like NCCL's "Init COMPLETE": where Init's time went, for the ranks
	// that waited longest (the join waits for the last rank to start).
	c.log.Info(fmt.Sprintf("init complete in %v: join %v, then %s", time.Since(start).Round(time.Millisecond),
		joined.Sub(start).Round(time.Millisecond), c.initPhases), "subsys", "INIT")
	return c, nil
}

// connect builds a rank's transports over a joined bootstrap client: it
// publishes this rank's descriptor, gathers everyone's, picks a transport per
// peer and connects.
func connect(ctx context.Context, client *bootstrap.Client, cfg *Config, jobID string) (c *Comm, err error) {
	rank, size := client.Rank(), client.Size()
	ph := initClock{last: time.Now()}
	slotSize, slotCount := cfg.SlotSize, cfg.SlotCount
	if slotSize == 0 {
		slotSize = defaultSlotSize
		if v, ok, err := envBytes("GCCL_SLOT_SIZE"); err != nil {
			return nil, err
		} else if ok {
			slotSize = v
		}
	}
	if slotCount == 0 {
		slotCount = defaultSlotCount
		if v, ok, err := envBytes("GCCL_SLOT_COUNT"); err != nil {
			return nil, err
		} else if ok {
			slotCount = v
		}
	}
	if err := checkSlots(slotSize, slotCount); err != nil {
		return nil, err
	}
	if f := os.Getenv(topo.EnvTopoFile); f != "" {
		// Only the lowest rank of each host publishes the topology, but
		// every rank checks the file first: a bad one fails all of them
		// alike, each with the reason, before any waits on the others.
		if _, err := topo.ReadFile(f); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrInvalidArgument, topo.EnvTopoFile, err)
		}
	}

	// Pass 1: who lives where. Transports need the hosts (shared memory
	// the list of local peers) before they listen.
	me := peerInfo{Version: Version, HostID: HostID(), Pid: os.Getpid(), CPUs: runtime.NumCPU(), CPUList: cpuList()}
	blobs, err := client.AllGather(ctx, me.marshal())
	if err != nil {
		return nil, err
	}
	ph.lap(&ph.gather)
	infos, err := parseInfos(blobs)
	if err != nil {
		return nil, err
	}
	hosts, pids := make([]string, size), make([]int, size)
	sameHost, localRank := 0, 0
	if err := checkVersions(rank, infos); err != nil {
		return nil, err
	}
	for p, info := range infos {
		hosts[p], pids[p] = info.HostID, info.Pid
		if info.HostID == me.HostID {
			sameHost++
			if p < rank {
				localRank++
			}
		}
	}
	// The lowest rank of each host describes the host for everyone.
	var topoWarn []string
	if localRank == 0 {
		g, terr := topo.Load(os.Getenv, topo.Detector{})
		switch {
		case terr != nil && os.Getenv(topo.EnvTopoFile) != "":
			return nil, fmt.Errorf("%w: %s: %w", ErrInvalidArgument, topo.EnvTopoFile, terr)
		case terr != nil:
			topoWarn = append(topoWarn, fmt.Sprintf("topology detection failed (%v): the host is taken as flat", terr))
		default:
			me.Topo = topo.MarshalXML(g.Doc)
		}
	}

	ph.lap(&ph.detect)
	// Every registered transport listens (transports.go lists them); the
	// descriptor says where, or why not.
	prep, err := transport.Prepare(ctx, transport.Setup{
		JobID: jobID, Rank: rank, Size: size, SlotSize: slotSize, SlotCount: slotCount,
		Hosts: hosts, Pids: pids, LocalRank: localRank, Getenv: client.Env(os.Getenv), Store: client,
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			// err is the named result: peers learn why Init failed.
			prep.Abort(err)
		}
	}()
	me.Transports = prep.Descriptor()
	ph.lap(&ph.listen)

	// Pass 2: addresses and topologies.
	if blobs, err = client.AllGather(ctx, me.marshal()); err != nil {
		return nil, err
	}
	if infos, err = parseInfos(blobs); err != nil {
		return nil, err
	}
	ph.lap(&ph.gather)
	descs := make([][]byte, size)
	for p, info := range infos {
		descs[p] = info.Transports
	}
	sel, err := prep.Select(descs, os.Getenv("GCCL_STRICT") == "1")
	if err != nil {
		return nil, err
	}
	mux, err := prep.Connect(ctx, sel)
	if err != nil {
		return nil, err
	}
	ph.lap(&ph.connect)
	// Once every rank passes this barrier, every peer has mapped this
	// rank's shared memory: unlinking it now means a crash leaves nothing
	// behind.
	if err := client.Barrier(ctx); err != nil {
		mux.Abort(err)
		return nil, err
	}
	prep.Release()
	ph.lap(&ph.barrier)
	var ep transport.Endpoint = mux
	if h := testHookEndpoint.Load(); h != nil {
		ep = (*h)(mux)
	}
	c, err = newComm(ep, cfg)
	if err != nil {
		mux.Abort(err)
		return nil, err
	}
	for _, line := range sel.Infos {
		c.log.Info(line, "subsys", "INIT")
	}
	for _, line := range sel.Downgrades {
		c.log.Warn(line, "subsys", "INIT")
	}
	for _, line := range topoWarn {
		c.log.Warn(line, "subsys", "GRAPH")
	}
	c.useTopology(infos, localRank, sameHost)
	ph.lap(&ph.topology)
	c.initPhases = ph.String()
	// When this host's ranks outnumber its cores, a waiting rank must give
	// its core to peer processes (sched_yield), not just to goroutines;
	// otherwise the rank with work waits for a time slice (8 B all-reduce,
	// 4 ranks on 2 cores: 458 µs with Gosched, 45 µs with sched_yield). With
	// a core each, the syscall only slows polling (TCP 8 B: 29 -> 59 µs).
	crowd := crowded(infos, me.HostID, sameHost)
	c.exec.bo.OSYield = crowd
	if crowd {
		c.log.Info(fmt.Sprintf("%d ranks on this host outnumber the CPUs they may run on: waiting ranks yield their core", sameHost), "subsys", "INIT")
	}
	shmOn := make([]bool, size)
	for p, info := range infos {
		if d, err := transport.ParseDescriptor(p, info.HostID, info.Pid, info.Transports); err == nil {
			shmOn[p] = d.Addr(shm.Name) != nil
		}
	}
	c.intraNet = intraOverNetwork(hosts, shmOn)
	// The peers that share this rank's cores are polled with a system
	// call each: a crowded waiter yields after fewer polls.
	c.exec.bo.CostlyPoll = c.intraNet
	c.setHosts(hosts)
	c.initCMA(hosts, crowd, client.Env(os.Getenv))
	c.boot = client
	c.rv = bootRendezvous{client}
	c.jobID = jobID
	go c.watchLost(client)
	return c, nil
}

// crowded reports whether the ranks of host outnumber the CPUs they may
// run on: the union of their CPU lists, so that ranks a launcher bound to
// a core each are not crowded, nor ranks that share one machine-wide mask
// on enough cores. Where a rank of the host did not list its CPUs, the
// smallest count its ranks report decides. Every rank of the host decides
// alike.
func crowded(infos []peerInfo, host string, ranks int) bool {
	var union topo.CPUSet
	listed, fewest := true, 0
	for _, info := range infos {
		if info.HostID != host {
			continue
		}
		if info.CPUs > 0 && (fewest == 0 || info.CPUs < fewest) {
			fewest = info.CPUs
		}
		set, err := topo.ParseCPUList(info.CPUList)
		if info.CPUList == "" || err != nil {
			listed = false
			continue
		}
		union = union.Union(set)
	}
	if listed && union.Count() > 0 {
		return ranks > union.Count()
	}
	return fewest > 0 && ranks > fewest
}

// cpuList returns the CPUs this process may run on in cpulist form, or ""
// where the platform does not say.
func cpuList() string {
	cpus, err := inheritedCPUs()
	if err != nil {
		return ""
	}
	var set topo.CPUSet
	for _, c := range cpus {
		set.Add(c)
	}
	return set.String()
}

// initClock times the steps of connect, for the INFO line that ends Init.
type initClock struct {
	last                                               time.Time
	gather, detect, listen, connect, barrier, topology time.Duration
}

// lap adds the time since the previous lap to *d.
func (k *initClock) lap(d *time.Duration) {
	now := time.Now()
	*d += now.Sub(k.last)
	k.last = now
}

func (k *initClock) String() string {
	r := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
	return fmt.Sprintf("all-gathers %v, topology detection %v, listen %v, connect %v, barrier %v, topology %v",
		r(k.gather), r(k.detect), r(k.listen), r(k.connect), r(k.barrier), r(k.topology))
}

func parseInfos(blobs [][]byte) ([]peerInfo, error) {
	infos := make([]peerInfo, len(blobs))
	for p, b := range blobs {
		var err error
		if infos[p], err = unmarshalPeerInfo(b); err != nil {
			return nil, fmt.Errorf("%w: rank %d: %w", ErrMismatch, p, err)
		}
	}
	return infos, nil
}

// testHookEndpoint, when set (tests), wraps the endpoint Init made.
var testHookEndpoint atomic.Pointer[func(transport.Endpoint) transport.Endpoint]

// watchLost aborts the Comm when the bootstrap reports a lost or aborting
// rank, so that ranks blocked on shared memory (which has no EOF) fail too.
// When the connection with that rank had failed its set-up, the rank
// stopped on that failure, and the abort names it first.
func (c *Comm) watchLost(client *bootstrap.Client) {
	for n := range client.Lost() {
		if !c.running() {
			return
		}
		err := fmt.Errorf("%w: %v", ErrPeerLost, n)
		// Init's ranks are the job's, which notices name (-1: none).
		if cause := transport.SetupFailure(c.ep, n.Rank); cause != nil {
			err = fmt.Errorf("%w; then %w", cause, err)
		}
		// The notice came from the rendezvous: no need to announce it again.
		c.abortWith(err, false)
		c.async.stop(c)
		return
	}
}

// envBytes reads a positive size from the environment, with an optional K,
// M or G suffix (powers of 1024).
// maxRingBytes bounds one slot ring (a peer and a direction), so that a
// mistyped size or count is an error rather than an allocation that kills
// the process.
const maxRingBytes = 1 << 30

// checkSlots checks the slot rings' geometry before any transport
// allocates them.
func checkSlots(size, count int) error {
	switch {
	case size < 64 || size > maxRingBytes:
		return invalid("slot size %d out of range [64, 1 GiB]", size)
	case count < 2 || count > 1<<16:
		return invalid("slot count %d out of range [2, 65536]", count)
	case size*count > maxRingBytes:
		return invalid("slot rings of %d slots of %d bytes take %d MiB per peer and direction, more than 1 GiB", count, size, size*count>>20)
	}
	return nil
}

func envBytes(name string) (int, bool, error) {
	v := os.Getenv(name)
	if v == "" {
		return 0, false, nil
	}
	n, err := units.ParseBytes(v, 1<<40)
	if err != nil || n <= 0 {
		return 0, false, invalid("%s=%q is not a positive size", name, v)
	}
	return int(n), true, nil
}
