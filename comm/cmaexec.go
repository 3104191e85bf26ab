package comm

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/internal/cma"
	"github.com/gccl/gccl/transport"
)

// The single-copy path for large all-gathers and broadcasts between
// processes of one host, as Open MPI's shared-memory transport does them
// (cross-memory attach): each rank reads what it needs straight out of the
// peers' buffers into its own output with process_vm_readv, one kernel copy
// per byte, where the slot ring copies every byte into a slot and out of
// it again. It needs no shared buffers, so it serves ordinary heap memory
// (buffers from Alloc take the symmetric path instead).
//
// The arrival and departure rounds of rounds.go frame it: a rank reads a
// peer's input only after that peer's arrival (its pid, where its input
// is, and what it runs, checked against this rank's), and returns only
// when every peer has departed, so no peer still reads its input or writes
// its output. Ranks read only inputs and write only outputs (their own, and
// a split broadcast's root the reader's), so in-place calls are safe.
//
// A broadcast between two processes is the one case where a single reader
// would copy alone while its peer idles: there the root also writes a part
// of the reader's output (process_vm_writev), and each copies its part at
// once (cmaSplit).
//
// Whether one process may read another's memory depends on the system
// (ptrace rules: the same user and Yama's ptrace_scope, or CAP_SYS_PTRACE;
// seccomp filters; containers), and a pid names a process only in its own
// pid namespace. So a rank first reads each peer's token (a random word
// whose address and value the peer's arrival carries) and trusts the pid
// only if it finds that value there. A rank that may not read its peers
// says so in its departure; every rank then sees the same departures, runs
// that call through the slots, and never takes this path again on that
// communicator, with one WARN naming the rank and why.

// cmaMinBytes is the smallest broadcast output, and cmaMinGatherBytes
// the smallest all-gather output, that take the single-copy path: below
// them the two rounds cost more than the copies through the slots that
// they save (2 processes, 3 alternating runs of gccl-perf -z 1: all-gather
// 16 KiB 2.4-3.1 µs reading peers' memory against 3.7-4.0 through the
// slots, 4 KiB 2.8-3.6 against 1.7-2.2; broadcast still behind at 32 KiB,
// where only one rank copies through the slots' pipeline). Where a host's
// ranks outnumber its CPUs, every message of the rounds may wait for a
// peer's time slice, and the slots' pipeline stays ahead up to
// cmaMinBytesCrowded (4 processes on 2 CPUs: 64 KiB took 35-52 µs reading
// peers' memory against 23-26 µs through the slots, 256 KiB 68-82 µs
// against 86-97 µs; docs/PERFORMANCE.md).
//
// cmaSplitMinBytes is the smallest 2-process broadcast whose root writes
// part of the reader's output. The split paid from the smallest broadcast
// of the path on (2 processes, 4 alternating runs of gccl-perf -z 1 -c 1,
// out of place / in place: 64 KiB 6.6-8.7 / 6.3-6.9 µs whole against
// 6.5-7.2 / 6.1-6.4 split, 128 KiB 9.0-11.5 / 8.6-9.0 against 7.7-11.0 /
// 7.1-7.5).
const (
	cmaSplitMinBytes   = 64 << 10
	cmaMinBytes        = 64 << 10
	cmaMinGatherBytes  = 16 << 10
	cmaMinBytesCrowded = 256 << 10
)

// cmaState is a communicator's single-copy path.
type cmaState struct {
	// usable: every rank is a process of this host reached over shared
	// memory, the system has process_vm_readv, and GCCL_CMA_DISABLE is not
	// set (decided at Init, alike on every rank of a job).
	usable bool
	// minBytes and minGather: the smallest broadcast and all-gather
	// outputs that take the path here.
	minBytes, minGather int
	// off: the ranks agreed that one of them cannot read its peers'
	// memory (decided after a departure round, alike on every rank).
	off bool

	pid     uint32  // this process's, read once: each getpid is a system call
	token   *uint32 // this rank's token, the word peers read to check its pid
	checked []bool  // peers whose token this rank has found at their pid
	peers   []cmaPeer
	msg     [cmaRecordLen]byte
	rd      cma.Reader
	wr      cma.Writer
	split   bool          // the call being run is a split broadcast (cmaSplit)
	splits  atomic.Uint64 // split broadcasts run (tests)
	word    [4]byte       // a peer's token, read back
	ops     atomic.Uint64 // calls run on this path (tests, debugging)
	// fault, when set (tests), fails this rank's reads and writes of peers'
	// memory.
	fault error
}

// cmaPeer is what a peer's arrival record says about it.
type cmaPeer struct {
	pid int
	// in is its input, or, for the reader of a split broadcast, its
	// output (0: none: a non-root of a broadcast otherwise).
	in        uintptr
	tokenAddr uintptr
	token     uint32
	flags     uint8
}

// cmaRecord is what a rank announces on arrival. It fits the bytes a
// shared-memory slot carries in its first line, so the rounds move one
// line per peer: the lengths follow from the count, type, collective and
// root, which every rank checks alike.
type cmaRecord struct {
	pid, token    uint32
	tokenAddr, in uint64
	count         uint64 // elements of the output
	dt, coll      uint8
	root          uint32
	flags         uint8 // cmaRootCopies
}

const cmaRecordLen = 39

// cmaRootCopies: the root of a broadcast copies its input into its own
// output (out of place), so it takes a smaller share of a split.
const cmaRootCopies = 1

func (r *cmaRecord) put(b []byte) {
	le := binary.LittleEndian
	le.PutUint32(b[0:], r.pid)
	le.PutUint32(b[4:], r.token)
	le.PutUint64(b[8:], r.tokenAddr)
	le.PutUint64(b[16:], r.in)
	le.PutUint64(b[24:], r.count)
	b[32], b[33] = r.dt, r.coll
	le.PutUint32(b[34:], r.root)
	b[38] = r.flags
}

func (r *cmaRecord) get(b []byte) {
	le := binary.LittleEndian
	r.pid = le.Uint32(b[0:])
	r.token = le.Uint32(b[4:])
	r.tokenAddr = le.Uint64(b[8:])
	r.in = le.Uint64(b[16:])
	r.count = le.Uint64(b[24:])
	r.dt, r.coll = b[32], b[33]
	r.root = le.Uint32(b[34:])
	r.flags = b[38]
}

// initCMA decides at Init whether the single-copy path may run: every rank
// on this host, every peer reached over shared memory.
func (c *Comm) initCMA(hosts []string, crowded bool, getenv func(string) string) {
	s := &c.cma
	s.usable = false
	if !cma.Supported || c.size < 2 || getenv("GCCL_CMA_DISABLE") == "1" {
		return
	}
	for p := range c.size {
		if hosts[p] != hosts[c.rank] || p != c.rank && transport.Via(c.ep, p) != "SHM" {
			return
		}
	}
	s.usable = true
	s.minBytes, s.minGather = cmaMinBytes, cmaMinGatherBytes
	if crowded {
		s.minBytes, s.minGather = cmaMinBytesCrowded, cmaMinBytesCrowded
	}
	s.pid = uint32(os.Getpid())
	s.token = new(uint32)
	*s.token = rand.Uint32() | 1
	s.checked = make([]bool, c.size)
	s.peers = make([]cmaPeer, c.size)
	c.log.Info(fmt.Sprintf("all-gathers of %d bytes or more and broadcasts of %d or more read peers' buffers directly (process_vm_readv; GCCL_CMA_DISABLE=1 turns it off)", s.minGather, s.minBytes), "subsys", "COLL")
}

// cmaCall reports whether a prepared call takes the single-copy path. It
// depends only on what every rank decides alike: the communicator, the
// collective and its size.
func (c *Comm) cmaCall(cl *call) bool {
	if !c.cma.usable || c.cma.off || c.algoPref != 0 {
		return false
	}
	switch cl.coll {
	case algo.AllGather:
		return len(cl.out.b) >= c.cma.minGather
	case algo.Broadcast:
		return len(cl.out.b) >= c.cma.minBytes
	}
	return false
}

// runCMAOrPlan runs a call classified pathCMA, through the slots when the
// ranks find at arrival or departure that one of them cannot read its
// peers' memory.
func (c *Comm) runCMAOrPlan(ctx context.Context, cl *call) error {
	handled, err := c.runCMA(ctx, cl)
	if handled {
		return c.opErr(cl, err)
	}
	return c.runCollective(ctx, cl)
}

// runCMA runs a call on the single-copy path. handled is false when the
// ranks agreed to run it through the slots instead (nothing was written).
func (c *Comm) runCMA(ctx context.Context, cl *call) (handled bool, err error) {
	s := &c.cma
	me := cmaRecord{
		pid: s.pid, token: *s.token, tokenAddr: uint64(uintptr(unsafe.Pointer(s.token))),
		count: uint64(len(cl.out.b) / cl.dtype().Size()), dt: uint8(cl.dtype()), coll: uint8(cl.coll), root: uint32(cl.root),
	}
	s.split = c.cmaSplit(cl)
	switch {
	case cl.coll == algo.AllGather || cl.root == c.rank:
		me.in = uint64(addrOf(cl.in.b))
		if s.split && !sameMem(cl.in.b, cl.out.b) {
			me.flags = cmaRootCopies
		}
	case s.split:
		me.in = uint64(addrOf(cl.out.b)) // the root writes part of it
	}
	x := &c.exec
	x.begin(ctx, cl.name(), cl.seq, transport.MakeTag(tagCMAArrive, cl.seq))
	me.put(s.msg[:])
	if err := c.announce(s.msg[:], cmaArrival); err != nil {
		return true, err // the transport failed: the Comm aborts
	}
	// This rank's own share of its output needs no peer: it is copied
	// while the peers' records travel.
	c.cmaOwn(cl)
	failed, err := c.gatherArrivals(s.msg[:], cmaArrival)
	if err != nil {
		return true, err
	}
	code := departOK
	if failed != nil {
		code = departFailed
	} else if peer, err := c.cmaWork(cl); err != nil {
		if cma.Refused(err) {
			code = departCannot
			c.log.Warn(fmt.Sprintf("cannot read the memory of rank %d (%v): all-gathers and broadcasts go through shared-memory slots", peer, err), "subsys", "COLL")
		} else {
			code = departFailed
			failed = &OpError{Op: x.op, Rank: c.rank, Seq: cl.seq, Peer: peer, Err: err}
		}
	}
	// Every rank that arrived departs, failed or not (rounds.go).
	x.tag = transport.MakeTag(tagCMADepart, cl.seq)
	peerErr, cannot := c.departWith(code)
	switch {
	case failed != nil:
		return true, failed
	case peerErr != nil:
		return true, peerErr
	case cannot >= 0:
		s.off = true
		if code != departCannot {
			c.log.Warn(fmt.Sprintf("rank %d cannot read its peers' memory: all-gathers and broadcasts go through shared-memory slots", cannot), "subsys", "COLL")
		}
		return false, nil
	}
	s.ops.Add(1)
	if s.split {
		s.splits.Add(1)
	}
	return true, nil
}

// cmaSplit reports whether a call on the single-copy path is a broadcast
// whose root writes part of the reader's output: two processes, and
// enough bytes that a second copy in parallel pays for its system call.
// Every rank decides it alike.
func (c *Comm) cmaSplit(cl *call) bool {
	return cl.coll == algo.Broadcast && c.size == 2 && len(cl.out.b) >= cmaSplitMinBytes
}

// cmaCut is where a split broadcast of n bytes divides: the reader reads
// [0, cut) from the root's input, the root writes [cut, n) into the
// reader's output. Halves when the root has nothing else to copy; 3/8 for
// the root when it also copies its input into its output (its own copy,
// in user space, runs about three times as fast as the kernel's
// cross-process copy here: 16 MiB in 0.67 against 2.2 ms; 2 processes,
// 16 MiB out of place, 3 alternating runs: 1/8 2.6-3.5 ms, 2/8 2.0-2.2,
// 3/8 1.6-2.7, 4/8 1.7-2.4). Page multiples, so that no page is pinned by
// both.
func cmaCut(n int, rootCopies bool) int {
	cut := n / 2
	if rootCopies {
		cut = n - n*3/8
	}
	return cut &^ (4<<10 - 1)
}

// cmaResolve checks peer p's arrival record against this rank's and keeps
// where p's input is. Agreeing on the count, type, collective and root is
// agreeing on every length: each rank's own arguments were checked
// against them when the call was prepared.
func (c *Comm) cmaResolve(p int, msg, mine []byte) error {
	var me, rec cmaRecord
	me.get(mine)
	if p == c.rank {
		return nil
	}
	rec.get(msg)
	if rec.count != me.count || rec.dt != me.dt || rec.coll != me.coll || rec.root != me.root {
		return fmt.Errorf("%w: peer runs %v of %d %v (root %d) reading peers' memory, this rank %v of %d %v (root %d)",
			ErrMismatch, algo.Collective(rec.coll), rec.count, DataType(rec.dt), int32(rec.root),
			algo.Collective(me.coll), me.count, DataType(me.dt), int32(me.root))
	}
	hasIn := algo.Collective(me.coll) == algo.AllGather || int(me.root) == p || c.cma.split
	if hasIn != (rec.in != 0) {
		return fmt.Errorf("%w: peer's input is at %#x, this rank expects %s", ErrMismatch, rec.in, map[bool]string{true: "one", false: "none"}[hasIn])
	}
	c.cma.peers[p] = cmaPeer{pid: int(rec.pid), in: uintptr(rec.in), tokenAddr: uintptr(rec.tokenAddr), token: rec.token, flags: rec.flags}
	return nil
}

// cmaOwn copies this rank's own input into its output where the call
// needs it (out of place: an all-gather's own block, the root's broadcast).
func (c *Comm) cmaOwn(cl *call) {
	in, out := cl.in.b, cl.out.b
	nt := len(out) >= symNTMinBytes
	switch {
	case cl.coll == algo.AllGather:
		at := c.rank * len(in)
		if !sameMem(in, out[at:at+len(in)]) {
			ntCopy(out[at:at+len(in)], in, nt)
		}
	case c.rank == cl.root && !sameMem(in, out):
		ntCopy(out, in, nt)
	}
}

// cmaWork does the rest of this rank's share: it reads its peers' parts of
// its output. On failure it returns the peer whose memory it could not
// read (-1: none).
func (c *Comm) cmaWork(cl *call) (peer int, err error) {
	in, out := cl.in.b, cl.out.b
	switch cl.coll {
	case algo.AllGather:
		blk := len(in)
		for i := 1; i < c.size; i++ {
			p := (c.rank + i) % c.size // spread the readers over the sources
			if err := c.cmaRead(p, out[p*blk:(p+1)*blk]); err != nil {
				return p, err
			}
		}
	case algo.Broadcast:
		split := c.cma.split
		switch {
		case c.rank == cl.root && split:
			reader := 1 - c.rank
			cut := cmaCut(len(out), !sameMem(in, out))
			if err := c.cmaWrite(reader, in[cut:], cut); err != nil {
				return reader, err
			}
		case c.rank != cl.root:
			if split {
				out = out[:cmaCut(len(out), c.cma.peers[cl.root].flags&cmaRootCopies != 0)]
			}
			if err := c.cmaRead(cl.root, out); err != nil {
				return cl.root, err
			}
		}
	}
	return -1, nil
}

// cmaRead fills dst from peer p's input, after checking that p's pid is p.
func (c *Comm) cmaRead(p int, dst []byte) error {
	s := &c.cma
	if err := c.cmaCheck(p); err != nil {
		return err
	}
	return s.rd.Read(s.peers[p].pid, dst, s.peers[p].in)
}

// cmaWrite copies src to offset off of peer p's output (the reader of a
// split broadcast), after checking that p's pid is p: a write into another
// process than the peer's would corrupt it.
func (c *Comm) cmaWrite(p int, src []byte, off int) error {
	s := &c.cma
	if err := c.cmaCheck(p); err != nil {
		return err
	}
	return s.wr.Write(s.peers[p].pid, src, s.peers[p].in+uintptr(off))
}

// cmaCheck checks, the first time, that peer p's pid is p's process: the
// token p published is at the address it gave, in that process.
func (c *Comm) cmaCheck(p int) error {
	s := &c.cma
	pe := &s.peers[p]
	if s.fault != nil {
		return s.fault
	}
	if !s.checked[p] {
		if err := s.rd.Read(pe.pid, s.word[:], pe.tokenAddr); err != nil {
			return err
		}
		if binary.NativeEndian.Uint32(s.word[:]) != pe.token {
			return fmt.Errorf("%w: pid %d is not rank %d's process here (another pid namespace?)", cma.ErrRefused, pe.pid, p)
		}
		s.checked[p] = true
	}
	return nil
}
