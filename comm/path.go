package comm

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/gccl/gccl/algo"
)

// path is how a call runs, decided once per call, when it is prepared
// (classify), as NCCL's enqueue classifies a task once. Each path lives in
// its own file.
type path uint8

const (
	// pathPlan: host buffers, through the collective's plan over the slot
	// rings (exec.go).
	pathPlan path = iota
	// pathBarrier: a one-byte all-reduce (coll.go, runCollective).
	pathBarrier
	// pathSymmetric: host buffers in every rank's symmetric memory; each
	// rank reads and writes its peers' buffers directly (symexec.go).
	pathSymmetric
	// pathDevice: PeerDeviceBuffers on one host; the devices do the work
	// (devexec.go), or, when the ranks agree at arrival that they cannot,
	// pathStaged.
	pathDevice
	// pathStaged: device buffers copied to host staging, run as pathPlan
	// or pathVariable, and copied back (staging.go).
	pathStaged
	// pathVariable: AllToAllV and AllGatherV, one group of sends and
	// receives (vcoll.go).
	pathVariable
	// pathGroup: Send, Recv and Group (sendrecv.go; device buffers go
	// direct or staged, sendrecv_device.go).
	pathGroup
	// pathDeterministic: a reduction of a Comm with Config.Deterministic,
	// on host or staged device buffers, whatever the tuner or GCCL_ALGO
	// say (determ.go).
	pathDeterministic
	// pathCMA: a large all-gather or broadcast between processes of one
	// host; each rank reads its peers' inputs into its output with one
	// kernel copy (cmaexec.go), or, when the ranks find that one of them
	// may not, runs pathPlan.
	pathCMA
	// pathDeviceFlags: StreamBuffers in device windows; the work and the
	// flags the devices wait on are queued on the stream, and the host
	// returns (devflags.go).
	pathDeviceFlags
)

// classify decides a prepared call's path. Each rank decides alone, from
// its own arguments; a peer that decides otherwise meets messages of
// another tag kind and both fail with ErrMismatch.
func (c *Comm) classify(cl *call) path {
	switch {
	case cl.isGroup:
		return pathGroup
	case cl.barrier:
		return pathBarrier
	case c.cfg.Deterministic && cl.coll.Reducing():
		return pathDeterministic
	case cl.hasDevice() && c.flagCall(cl):
		return pathDeviceFlags
	case cl.hasDevice() && c.deviceCall(cl):
		return pathDevice
	case cl.hasDevice():
		return pathStaged
	case cl.vkind != 0:
		return pathVariable
	case c.symCall(cl):
		return pathSymmetric
	case c.cmaCall(cl):
		return pathCMA
	}
	return pathPlan
}

// symCall reports whether an all-reduce, reduce-scatter, all-gather or
// broadcast may run on symmetric memory: large enough, no forced
// algorithm, and every buffer this rank uses in a region all of whose
// peers' copies it maps (for a broadcast, the root's input and every
// output). Every rank must decide so: its peers check at arrival.
func (c *Comm) symCall(cl *call) bool {
	switch cl.coll {
	case algo.AllReduce, algo.ReduceScatter, algo.AllGather, algo.Broadcast:
	default:
		return false
	}
	if c.size < 2 || c.algoPref != 0 || max(len(cl.in.b), len(cl.out.b)) < symMinBytes || c.syms.Load() == nil {
		return false
	}
	needIn := cl.coll != algo.Broadcast || cl.root == c.rank
	if reg, _, ok := c.findSym(cl.in.b); needIn && !(ok && reg.all) {
		return false
	}
	reg, _, ok := c.findSym(cl.out.b)
	return ok && reg.all
}

// runHeld executes a prepared call on its path.
func (c *Comm) runHeld(ctx context.Context, cl *call) error {
	if !c.running() {
		return &OpError{Op: cl.name(), Rank: c.rank, Seq: cl.seq, Peer: -1, Err: c.closedErr()}
	}
	if cl.path != pathGroup { // groups are not numbered
		c.arrive(cl.seq, cl.name())
	}
	c.telBegin(cl)
	var err error
	switch cl.path {
	case pathDevice:
		err = c.runOnDevices(ctx, cl)
	case pathDeviceFlags:
		err = c.runDeviceFlags(cl)
	case pathStaged:
		err = c.runStaged(ctx, cl)
	case pathGroup:
		dev := groupHasDevice(cl.group)
		// A group's device buffers are staged as it runs.
		err = c.runGroup(ctx, "Group", 0, cl.group, dev, cl.holds.n > 0)
		if err == nil && dev {
			err = c.opErr(cl, groupStageOut(cl.group))
		}
	case pathVariable:
		err = c.runV(ctx, cl)
	case pathDeterministic:
		err = c.runDeterministic(ctx, cl)
	case pathCMA:
		err = c.runCMAOrPlan(ctx, cl)
	default: // pathPlan, pathBarrier, pathSymmetric
		err = c.runCollective(ctx, cl)
	}
	err = c.settled(cl.name(), cl.seq, err)
	c.telEnd(err != nil)
	if err != nil {
		c.fail(err)
	}
	return err
}

// settled is the outcome of an operation whose work ended with err: the
// collective path and Group's fast path both decide it here.
func (c *Comm) settled(op string, seq uint64, err error) error {
	c.ranHook()
	if err == nil {
		err = c.abortedDuring(op, seq)
	}
	return err
}

// abortedDuring is the error of an operation that finished while the Comm
// aborted, nil if it did not abort. Abort replaces the shared-memory slots
// with zero pages (transport/shm: so that a late access is harmless), so a
// message being copied out of a slot as the Comm aborted may have been read
// as zeros: such an operation's result cannot be trusted, and it fails
// rather than return it. (Seen once in tests.TestShrinkUnderGcclRun: a
// Broadcast returned nil with its output zero from element 20 on.)
func (c *Comm) abortedDuring(op string, seq uint64) error {
	if c.state.Load() != stateAborted {
		return nil
	}
	return &OpError{Op: op, Rank: c.rank, Seq: seq, Peer: -1, Err: c.closedErr()}
}

// testHookRan, when set by a test, runs after an operation's work and
// before its outcome is decided.
var testHookRan atomic.Pointer[func(*Comm)]

func (c *Comm) ranHook() {
	if h := testHookRan.Load(); h != nil {
		(*h)(c)
	}
}

// opErr makes err, if not nil, an *OpError of cl unless it is one.
func (c *Comm) opErr(cl *call, err error) error {
	if err == nil {
		return nil // before oe, which escapes: no allocation on success
	}
	var oe *OpError
	if errors.As(err, &oe) {
		return err
	}
	return &OpError{Op: cl.name(), Rank: c.rank, Seq: cl.seq, Peer: -1, Err: err}
}
