package comm

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/gccl/gccl/algo"
	"github.com/gccl/gccl/device"
	"github.com/gccl/gccl/transport"
)

// Device collectives. When every rank of a communicator on one host passes
// PeerDeviceBuffers, every collective runs on the devices (an in-place
// all-to-all excepted, below), as the symmetric-memory path runs on host
// memory (symexec.go): each rank exports its buffers (CUDA IPC handles),
// maps its peers' buffers, and then
//   - all-reduce: reduces its 1/n slice of every rank's input with one
//     kernel that writes the result into every rank's output;
//   - reduce-scatter: reduces its own block of every rank's input into its
//     output;
//   - reduce: reduces its slice into the root's output;
//   - all-gather: copies its input into every rank's output (copy engines);
//   - broadcast: copies the root's input into its own output;
//   - all-to-all: copies its input's block p into rank p's output, for
//     every p (in place, the ranks would overwrite blocks not yet sent:
//     every rank then runs the call through host staging);
//   - gather: copies its input into the root's output;
//   - scatter: copies its block of the root's input into its output.
//
// The same two rounds over the transport frame it: arrival carries the
// operation and the buffer descriptions (a rank passing host buffers while
// a peer passes device buffers fails with ErrMismatch), departure says the
// rank's device work is complete, or that it failed (a peer's buffers it
// could not map, a record that disagrees): every rank that arrived departs,
// so none returns while a peer may still touch its buffers, and a failure
// anywhere fails the call everywhere. Before arriving a rank waits for the
// work it queued on the buffers (DeviceEngine.Ready), since peers read and
// write them as soon as it arrives; after departing, its outputs are final
// and no peer reads its inputs. An operation the devices cannot do after
// all (more ranks than a kernel takes inputs, different pre-multipliers on
// different ranks) is seen by every rank from the same arrival records, and
// every rank then runs it through host staging instead.

// maxDeviceRanks is the most inputs one device reduction reads (the
// kernels' limit, internal/kernels.MaxInputs).
const maxDeviceRanks = 8

// devRecord is what a rank announces on arrival.
type devRecord struct {
	coll, dt, op   uint8
	staging        bool // the rank cannot run its share on a device
	root           uint32
	count          uint64
	scalar         float64
	inLen, outLen  uint64 // bytes
	inDesc, outDsc []byte // DeviceEngine.Export's descriptions; empty when absent
}

const devHeaderLen = 44
const devRecordLen = devHeaderLen + 2*MaxDeviceDescLen

func (r *devRecord) put(b []byte) {
	le := binary.LittleEndian
	clear(b)
	b[0], b[1], b[2] = r.coll, r.dt, r.op
	if r.staging {
		b[3] = 1
	}
	le.PutUint32(b[4:], r.root)
	le.PutUint64(b[8:], r.count)
	le.PutUint64(b[16:], math.Float64bits(r.scalar))
	le.PutUint64(b[24:], r.inLen)
	le.PutUint64(b[32:], r.outLen)
	le.PutUint16(b[40:], uint16(len(r.inDesc)))
	le.PutUint16(b[42:], uint16(len(r.outDsc)))
	copy(b[devHeaderLen:], r.inDesc)
	copy(b[devHeaderLen+MaxDeviceDescLen:], r.outDsc)
}

func (r *devRecord) get(b []byte) error {
	le := binary.LittleEndian
	r.coll, r.dt, r.op = b[0], b[1], b[2]
	r.staging = b[3] != 0
	r.root = le.Uint32(b[4:])
	r.count = le.Uint64(b[8:])
	r.scalar = math.Float64frombits(le.Uint64(b[16:]))
	r.inLen, r.outLen = le.Uint64(b[24:]), le.Uint64(b[32:])
	ni, no := int(le.Uint16(b[40:])), int(le.Uint16(b[42:]))
	if ni > MaxDeviceDescLen || no > MaxDeviceDescLen {
		return fmt.Errorf("%w: device buffer descriptions of %d and %d bytes", ErrMismatch, ni, no)
	}
	r.inDesc = b[devHeaderLen : devHeaderLen+ni]
	r.outDsc = b[devHeaderLen+MaxDeviceDescLen : devHeaderLen+MaxDeviceDescLen+no]
	return nil
}

// devPeer is where one rank's buffers are, in this process's addresses.
type devPeer struct {
	in, out uintptr // 0 when absent
	scalar  float64
	staging bool // the rank cannot run its share on a device
	// The rank's arrival: its buffers' sizes and descriptions (copies;
	// mapped only once every rank agreed to run the call on the devices).
	inLen, outLen   int
	inDesc, outDesc []byte
}

// devState is a communicator's device-collective state.
type devState struct {
	peers  []devPeer
	msg    [devRecordLen]byte
	logged bool
	ins    []uintptr
	outs   []uintptr
	red    DeviceReduce
	// The descriptions of this rank's buffers, built here each call.
	inDesc, outDesc [MaxDeviceDescLen]byte
	// Direct Send/Recv (sendrecv_device.go): the descriptions of a group's device
	// sends, MaxDeviceDescLen bytes per op, and whether it was logged.
	p2pDescs  []byte
	p2pLogged bool
	// The stream-ordered path (devflags.go): logged, and its queue.
	flagLogged bool
	sq         streamQueue
	// contended: the engine's sharing of its device with another process
	// (device.Contender) was logged.
	contended bool
}

// noteContention logs, once per Comm, that eng's device runs another
// process's work by turns (two processes on one GPU without MPS): every
// device collective then waits for the device's time slices, which no
// error would otherwise say.
func (c *Comm) noteContention(eng DeviceEngine) {
	if c.dev.contended {
		return
	}
	if ce, ok := eng.(device.Contender); ok {
		if why := ce.Contention(); why != "" {
			c.dev.contended = true
			c.log.Warn(why, "subsys", "INIT")
		}
	}
}

// deviceCall reports whether cl goes through the device arrival round: a
// single-host communicator, a collective the devices do, and a
// PeerDeviceBuffer among the buffers the rank uses. Each rank decides
// alone, from what its peers decide alike (a rank passing only host
// buffers runs the host path; a peer passing device buffers then fails
// with ErrMismatch). Whether this rank can run its share on a device (every
// used buffer a PeerDeviceBuffer, all on one engine) is not decided here
// but announced at arrival, so that every rank falls back to host staging
// together when one cannot.
func (c *Comm) deviceCall(cl *call) bool {
	if cl.isGroup || cl.barrier || c.size < 2 || c.multiHost || c.algoPref != 0 {
		return false
	}
	switch cl.coll {
	case algo.AllReduce, algo.ReduceScatter, algo.AllGather, algo.Broadcast, algo.Reduce,
		algo.AllToAll, algo.Gather, algo.Scatter:
	default:
		return false
	}
	needIn, needOut := cl.deviceUses(c.rank)
	return needIn && cl.in.addr || needOut && cl.out.addr
}

// deviceUses says which buffers a rank uses in a device collective.
func (cl *call) deviceUses(rank int) (needIn, needOut bool) {
	switch cl.coll {
	case algo.Broadcast, algo.Scatter:
		return cl.root == rank, true
	case algo.Reduce, algo.Gather:
		return true, cl.root == rank
	}
	return true, true
}

// deviceEngine returns the engine that runs this rank's share of cl, or
// nil when its used buffers are not all PeerDeviceBuffers of one engine.
func (c *Comm) deviceEngine(cl *call) DeviceEngine {
	needIn, needOut := cl.deviceUses(c.rank)
	if needIn && !cl.in.addr || needOut && !cl.out.addr {
		return nil
	}
	var ein, eout DeviceEngine
	if needIn {
		ein = cl.in.dev.(PeerDeviceBuffer).Engine()
	}
	if needOut {
		eout = cl.out.dev.(PeerDeviceBuffer).Engine()
	}
	switch {
	case ein == nil:
		return eout
	case eout == nil || ein == eout:
		return ein
	}
	return nil
}

// runDevice runs cl on the devices. It returns handled=false, with no
// error, when the ranks agreed at arrival to run it through host staging.
func (c *Comm) runDevice(ctx context.Context, cl *call) (handled bool, err error) {
	needIn, needOut := cl.deviceUses(c.rank)
	eng := c.deviceEngine(cl)
	d := &c.dev
	if !d.logged && eng != nil {
		d.logged = true
		c.log.Info("device buffers: collectives run on the devices, peers' memory mapped through "+eng.Name(), "subsys", "COLL")
	}
	esz := cl.dtype().Size()
	me := devRecord{coll: uint8(cl.coll), dt: uint8(cl.dtype()), op: uint8(cl.op.Kind), root: uint32(cl.root)}
	switch cl.coll {
	case algo.Reduce, algo.AllGather, algo.Gather:
		me.count = uint64(len(cl.in.b) / esz)
	default:
		me.count = uint64(len(cl.out.b) / esz)
	}
	if cl.op.Kind == OpPreMulSum {
		me.scalar = cl.op.Scalar
	}
	if eng == nil || cl.coll == algo.AllToAll && addrOf(cl.in.b) == addrOf(cl.out.b) {
		// This rank cannot run its share on one device, or not in place:
		// it says so, and every rank runs the call through host staging.
		me.staging = true
		needIn, needOut = false, false
	} else if cl.holds.n == 0 {
		// Buffers bound to streams waited for their streams (run); others
		// wait for the device's work.
		if err := eng.Ready(); err != nil {
			return true, err
		}
	}
	if needIn {
		me.inLen = uint64(len(cl.in.b))
		me.inDesc, err = eng.AppendExport(d.inDesc[:0], addrOf(cl.in.b), len(cl.in.b))
	}
	if needOut && err == nil {
		me.outLen = uint64(len(cl.out.b))
		me.outDsc, err = eng.AppendExport(d.outDesc[:0], addrOf(cl.out.b), len(cl.out.b))
	}
	if err == nil && (len(me.inDesc) > MaxDeviceDescLen || len(me.outDsc) > MaxDeviceDescLen) {
		err = fmt.Errorf("gccl: internal error: %s exported a description longer than %d bytes", eng.Name(), MaxDeviceDescLen)
	}
	if err != nil {
		// Memory the engine cannot share with peers (an allocator whose
		// memory has no IPC handle) can still be staged: every rank runs
		// the call through host staging.
		c.log.Debug("device buffers not shareable, host staging: "+err.Error(), "subsys", "COLL")
		me.staging, me.inDesc, me.outDsc, me.inLen, me.outLen, err = true, nil, nil, 0, 0, nil
	}
	x := &c.exec
	x.begin(ctx, cl.name(), cl.seq, transport.MakeTag(tagDevArrive, cl.seq))
	me.put(d.msg[:])
	failed, err := c.exchange(d.msg[:], devArrival)
	if err != nil {
		return true, err // the transport failed: the Comm aborts
	}
	if failed == nil {
		self := &d.peers[c.rank]
		self.in, self.out = addrOf(cl.in.b), addrOf(cl.out.b)
		if !needIn {
			self.in = 0
		}
		if !needOut {
			self.out = 0
		}
		if why := c.deviceRefusal(cl); why != "" {
			c.log.Debug("device collective through host staging: "+why, "subsys", "COLL")
			return false, nil
		}
		failed = c.devImport(eng)
		c.noteContention(eng)
	}
	// From here every rank that arrived departs, failed or not: a rank that
	// cannot do its share still waits until its peers are done with its
	// buffers, and tells them that the result is incomplete.
	if failed == nil {
		if err := c.deviceWork(eng, cl, esz); err != nil {
			failed = &OpError{Op: x.op, Rank: c.rank, Seq: cl.seq, Peer: -1, Err: err}
		} else if err := eng.Wait(); err != nil {
			failed = &OpError{Op: x.op, Rank: c.rank, Seq: cl.seq, Peer: -1, Err: err}
		}
	}
	x.tag = transport.MakeTag(tagDevDepart, cl.seq)
	if err := c.depart(failed != nil); err != nil && failed == nil {
		failed = err
	}
	return true, failed
}

// devImport maps every peer's buffers (their arrival descriptions).
func (c *Comm) devImport(eng DeviceEngine) error {
	x := &c.exec
	for p := range c.dev.peers {
		if p == c.rank {
			continue
		}
		pe := &c.dev.peers[p]
		var err error
		if len(pe.inDesc) > 0 {
			if pe.in, err = eng.Import(pe.inDesc, pe.inLen); err != nil {
				err = fmt.Errorf("mapping the peer's device send buffer: %w", err)
			}
		}
		if err == nil && len(pe.outDesc) > 0 {
			if pe.out, err = eng.Import(pe.outDesc, pe.outLen); err != nil {
				err = fmt.Errorf("mapping the peer's device receive buffer: %w", err)
			}
		}
		if err != nil {
			return &OpError{Op: x.op, Rank: c.rank, Seq: x.seq, Peer: p, Err: err}
		}
	}
	return nil
}

// deviceRefusal says why the devices cannot run an operation every rank
// arrived for, from what every rank knows alike after arrival.
func (c *Comm) deviceRefusal(cl *call) string {
	for p := range c.dev.peers {
		if c.dev.peers[p].staging {
			return fmt.Sprintf("rank %d's buffers are not device buffers of one engine", p)
		}
	}
	if cl.coll.Reducing() && c.size > maxDeviceRanks {
		return fmt.Sprintf("%d ranks, more than a device reduction reads (%d)", c.size, maxDeviceRanks)
	}
	if cl.op.Kind == OpPreMulSum {
		for _, p := range c.dev.peers {
			if p.scalar != c.dev.peers[0].scalar {
				return "ranks pass different pre-multipliers"
			}
		}
	}
	return ""
}

// devQueue is where device work goes: the engine's own stream (Engine's
// Reduce and Copy) or a caller's (streamQueue).
type devQueue interface {
	Reduce(r *DeviceReduce) error
	Copy(dst, src uintptr, n int) error
}

// deviceWork queues this rank's share of the operation.
func (c *Comm) deviceWork(eng devQueue, cl *call, esz int) error {
	d := &c.dev
	n, r := c.size, c.rank
	switch cl.coll {
	case algo.AllGather:
		blk := len(cl.in.b)
		src := addrOf(cl.in.b)
		for i := 0; i < n; i++ {
			p := (r + i) % n // spread the writers over the targets
			if err := copyIfApart(eng, d.peers[p].out+uintptr(r*blk), src, blk); err != nil {
				return err
			}
		}
		return nil
	case algo.Broadcast:
		return copyIfApart(eng, addrOf(cl.out.b), d.peers[cl.root].in, len(cl.out.b))
	case algo.AllToAll:
		blk := len(cl.in.b) / n
		src := addrOf(cl.in.b)
		for i := 0; i < n; i++ {
			p := (r + i) % n
			if err := copyIfApart(eng, d.peers[p].out+uintptr(r*blk), src+uintptr(p*blk), blk); err != nil {
				return err
			}
		}
		return nil
	case algo.Gather:
		blk := len(cl.in.b)
		return copyIfApart(eng, d.peers[cl.root].out+uintptr(r*blk), addrOf(cl.in.b), blk)
	case algo.Scatter:
		blk := len(cl.out.b)
		return copyIfApart(eng, addrOf(cl.out.b), d.peers[cl.root].in+uintptr(r*blk), blk)
	}
	red := &d.red
	*red = DeviceReduce{DataType: cl.dtype(), Op: cl.op, Ranks: n}
	d.ins, d.outs = d.ins[:0], d.outs[:0]
	var lo, hi int
	switch cl.coll {
	case algo.ReduceScatter:
		blk := len(cl.out.b) / esz
		lo, hi = r*blk, (r+1)*blk
		d.outs = append(d.outs, addrOf(cl.out.b))
	case algo.AllReduce, algo.Reduce:
		count := len(cl.in.b) / esz
		lo, hi = symSlice(count, esz, r, n)
		for p := 0; p < n; p++ {
			if cl.coll == algo.AllReduce || p == cl.root {
				d.outs = append(d.outs, d.peers[p].out+uintptr(lo*esz))
			}
		}
	}
	if hi <= lo {
		return nil
	}
	for p := 0; p < n; p++ {
		d.ins = append(d.ins, d.peers[p].in+uintptr(lo*esz))
	}
	if cl.op.Kind == OpPreMulSum {
		red.Op.Scalar = d.peers[0].scalar
	}
	red.Count, red.In, red.Out = hi-lo, d.ins, d.outs
	return eng.Reduce(red)
}

// copyIfApart queues a copy of n bytes unless it is empty or in place.
func copyIfApart(eng devQueue, dst, src uintptr, n int) error {
	if dst == src || n == 0 {
		return nil
	}
	return eng.Copy(dst, src, n)
}

// devResolve checks peer p's arrival record against this rank's and keeps
// what it says.
func (c *Comm) devResolve(p int, msg, mine []byte) error {
	var me, rec devRecord
	if err := me.get(mine); err != nil {
		return err
	}
	if p == c.rank {
		c.dev.peers[c.rank] = devPeer{scalar: me.scalar, staging: me.staging}
		return nil
	}
	if err := rec.get(msg); err != nil {
		return err
	}
	if rec.count != me.count || rec.dt != me.dt || rec.op != me.op || rec.coll != me.coll || rec.root != me.root {
		return fmt.Errorf("%w: peer runs %v of %d %v (op %v, root %d) on device buffers, this rank %v of %d %v (op %v, root %d)",
			ErrMismatch, algo.Collective(rec.coll), rec.count, DataType(rec.dt), Op{Kind: OpKind(rec.op)}, int32(rec.root),
			algo.Collective(me.coll), me.count, DataType(me.dt), Op{Kind: OpKind(me.op)}, int32(me.root))
	}
	if (len(me.inDesc) > 0 && len(rec.inDesc) > 0 && me.inLen != rec.inLen) ||
		(len(me.outDsc) > 0 && len(rec.outDsc) > 0 && me.outLen != rec.outLen) {
		return fmt.Errorf("%w: peer's device buffers hold %d and %d bytes, this rank's %d and %d", ErrMismatch, rec.inLen, rec.outLen, me.inLen, me.outLen)
	}
	pe := &c.dev.peers[p]
	*pe = devPeer{scalar: rec.scalar, staging: rec.staging, inLen: int(rec.inLen), outLen: int(rec.outLen),
		inDesc: append(pe.inDesc[:0], rec.inDesc...), outDesc: append(pe.outDesc[:0], rec.outDsc...)}
	return nil
}

// addrOf is the first address of b (a device view's device address).
func addrOf(b []byte) uintptr {
	lo, _ := span(b)
	return lo
}
